"""Check a whole swap and turn it into a plan, before anything is launched.

Every check that can fail runs here, so a rejected call changes no byte.  The
checks that need no GPU (pairing, geometry, direction, mapping, overlap) run
first and are tested in CI; resolving host aliases and device ordinals, which
ask the driver, come last.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import memory
from .blocks import DEVICE, HOST, Part, as_parts
from .mapping import check_mapping, normalize_mapping

__all__ = ["SwapPlan", "check_swap", "resolve_plan", "vector_width"]

IN, OUT, GPU_TO_GPU = "in", "out", "gpu->gpu"
_DIRECTIONS = {(HOST, DEVICE): IN, (DEVICE, HOST): OUT, (DEVICE, DEVICE): GPU_TO_GPU}


@dataclass
class SwapPlan:
    """A checked swap.

    Attributes
    ----------
    src, dst : list of Part
        Part ``i`` of ``src`` is copied to part ``i`` of ``dst``.
    mapping : numpy.ndarray of shape (N, 2), int64
        ``(src_block, dst_block)`` rows.
    direction : str
        ``"in"`` (host to GPU), ``"out"`` (GPU to host) or ``"gpu->gpu"``.
    src_addrs, dst_addrs : list of int
        Device-visible base address of each part (host parts: their alias);
        filled by :func:`resolve_plan`.
    width : int
        Bytes per vector the kernel may use (16, 8, 4, 2 or 1).
    """

    src: list
    dst: list
    mapping: np.ndarray
    direction: str
    src_addrs: list | None = None
    dst_addrs: list | None = None
    width: int = 0

    @property
    def num_pairs(self) -> int:
        return int(self.mapping.shape[0])

    @property
    def bytes_per_pair(self) -> int:
        return sum(p.block_bytes for p in self.src)

    @property
    def total_bytes(self) -> int:
        return self.num_pairs * self.bytes_per_pair


def _side_location(parts: list[Part], name: str) -> str:
    location = parts[0].location
    for p in parts[1:]:
        if p.location != location:
            raise ValueError(
                f"{name}: expected every part on one side ({parts[0].name} is {location} memory), "
                f"got {p.name} in {p.location} memory"
            )
    return location


def _pair_parts(src: list[Part], dst: list[Part]) -> None:
    if len(src) != len(dst):
        raise ValueError(f"dst: expected as many parts as src ({len(src)}), got {len(dst)}")
    for s, d in zip(src, dst):
        if s.dtype != d.dtype:
            raise TypeError(f"{d.name}: expected dtype {s.dtype} like {s.name}, got {d.dtype}")
        if s.block_shape != d.block_shape:
            raise ValueError(
                f"{d.name}: expected block shape {s.block_shape} like {s.name}, got {d.block_shape}"
            )
        if not d.writeable:
            raise ValueError(f"{d.name}: expected a writeable destination, got a read-only array")
        if d.num_blocks > 1 and abs(d.block_stride) < d.block_bytes:
            raise ValueError(
                f"{d.name}: expected destination blocks that do not overlap, got a block stride of "
                f"{d.block_stride} bytes for {d.block_bytes}-byte blocks"
            )


def _check_overlap(plan: SwapPlan) -> None:
    """Reject swaps where a written byte is also read or written elsewhere in
    the same launch: blocks are copied in parallel, so the result would
    depend on timing.  Only parts whose address spans meet are examined."""
    src_spans = np.array([p.span() for p in plan.src], dtype=np.int64).reshape(-1, 2)
    dst_spans = np.array([p.span() for p in plan.dst], dtype=np.int64).reshape(-1, 2)
    spans = np.concatenate((src_spans, dst_spans))
    # Writes against reads, and writes against other writes.
    meets = (dst_spans[:, None, 0] < spans[None, :, 1]) & (spans[None, :, 0] < dst_spans[:, None, 1])
    n_src = len(plan.src)
    meets[np.arange(len(plan.dst)), n_src + np.arange(len(plan.dst))] = False  # a part vs itself
    if not meets.any():
        return
    for di, oi in zip(*np.nonzero(meets)):
        if oi >= n_src and oi - n_src < di:
            continue  # each write/write pair once
        _check_part_overlap(plan, int(di), int(oi))


def _block_intervals(part: Part, blocks: np.ndarray) -> np.ndarray:
    starts = part.ptr + blocks * part.block_stride
    return np.column_stack((starts, starts + part.block_bytes))


def _check_part_overlap(plan: SwapPlan, di: int, oi: int) -> None:
    n_src = len(plan.src)
    d = plan.dst[di]
    written = _block_intervals(d, plan.mapping[:, 1])
    if oi < n_src:
        other, other_rows, verb = plan.src[oi], plan.mapping[:, 0], "read"
    else:
        other, other_rows, verb = plan.dst[oi - n_src], plan.mapping[:, 1], "written"
    touched = _block_intervals(other, other_rows)
    # Sort both interval sets and test each written interval against its
    # neighbours in the other set: O(N log N).
    order = np.argsort(touched[:, 0], kind="stable")
    t_start, t_end = touched[order, 0], touched[order, 1]
    pos = np.searchsorted(t_start, written[:, 1], side="left")  # first start >= write end
    # The touched interval just before `pos` is the only candidate that starts
    # before this write ends and may still end after it starts.
    cand = pos - 1
    valid = cand >= 0
    hit = np.zeros(len(written), dtype=bool)
    hit[valid] = t_end[cand[valid]] > written[valid, 0]
    # Wider touched intervals may hide behind narrower ones only when sizes
    # differ; block sizes match per part, so the neighbour test is exact.
    if hit.any():
        row = int(np.argmax(hit))
        other_row = int(order[cand[row]])
        raise ValueError(
            f"block_mapping: row {row} writes {d.name} block {int(plan.mapping[row, 1])}, whose bytes "
            f"are also {verb} by row {other_row} ({other.name} block {int(other_rows[other_row])}) "
            f"in the same swap; copy through a separate buffer or split the swap"
        )


def check_swap(src, dst, block_mapping, *, max_blocks: int | None = None) -> SwapPlan:
    """Run every check that needs no GPU and return an unresolved plan.

    Parameters
    ----------
    src, dst : array or sequence of arrays
        Parts; each of shape ``(num_blocks, *block_shape)``.
    block_mapping : array-like of shape (N, 2)
        ``(src_block, dst_block)`` rows.
    max_blocks : int, optional
        Largest N accepted.

    Returns
    -------
    SwapPlan
        With ``src_addrs``, ``dst_addrs`` and ``width`` still unset.
    """
    src_parts = as_parts(src, "src")
    dst_parts = as_parts(dst, "dst")
    _pair_parts(src_parts, dst_parts)
    src_loc = _side_location(src_parts, "src")
    dst_loc = _side_location(dst_parts, "dst")
    direction = _DIRECTIONS.get((src_loc, dst_loc))
    if direction is None:
        raise ValueError(
            "src, dst: expected at least one side in GPU memory, got host memory on both sides "
            "(host->host copies are not a swap; use numpy.copyto)"
        )
    mapping = normalize_mapping(block_mapping, max_blocks)
    plan = SwapPlan(src_parts, dst_parts, mapping, direction)
    if plan.num_pairs:
        smin = min(src_parts, key=lambda p: p.num_blocks)
        dmin = min(dst_parts, key=lambda p: p.num_blocks)
        check_mapping(mapping, smin.num_blocks, dmin.num_blocks, smin.name, dmin.name)
        _check_overlap(plan)
    return plan


def vector_width(values) -> int:
    """Widest power-of-two vector (<= 16 bytes) dividing every address,
    stride and block size in ``values``."""
    acc = 16
    for v in values:
        acc |= int(v)
    return acc & -acc if acc & 15 else 16


def _resolve_part(part: Part, device: int) -> int:
    if part.location == DEVICE:
        if part.device != device:
            raise ValueError(
                f"{part.name}: expected an array on GPU {device} (the swapper's device), "
                f"got one on GPU {part.device}"
            )
        return part.ptr
    lo, hi = part.span()
    alias = memory.host_alias(lo, hi - lo)
    if not alias:
        raise ValueError(
            f"{part.name}: expected page-locked (pinned) host memory, got pageable memory; "
            f"allocate it with cupy_swap.empty_pinned() or pin it once with "
            f"cupy_swap.register_host(array)"
        )
    return part.ptr + (alias - lo)


def resolve_plan(plan: SwapPlan, device: int) -> SwapPlan:
    """Fill in device-visible addresses and the vector width (asks the driver
    about host memory, so it needs a GPU)."""
    plan.src_addrs = [_resolve_part(p, device) for p in plan.src]
    plan.dst_addrs = [_resolve_part(p, device) for p in plan.dst]
    values = plan.src_addrs + plan.dst_addrs
    values += [p.block_stride for p in plan.src] + [p.block_stride for p in plan.dst]
    values += [p.block_bytes for p in plan.src]
    plan.width = vector_width(values)
    return plan
