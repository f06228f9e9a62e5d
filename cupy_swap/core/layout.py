"""The layout of a swap: its parts, checked once (engines pass the same arrays
call after call), and the mapping-independent facts the hot path and the
router read.  The mapping is new on every call and checked every time.
NumPy only; resolving host aliases asks the driver
(:mod:`cupy_swap.cuda.resolve`).  Every check runs before a launch, so a
rejected call changes no byte.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .mapping import check_mapping_for
from .parts import DEVICE, HOST, Part, as_parts, copy_groups

IN, OUT, GPU_TO_GPU = "in", "out", "gpu->gpu"
_DIRECTIONS = {(HOST, DEVICE): IN, (DEVICE, HOST): OUT, (DEVICE, DEVICE): GPU_TO_GPU}
DIRECTION_TEXT = {IN: "host -> GPU", OUT: "GPU -> host", GPU_TO_GPU: "GPU -> GPU"}


@dataclass
class Layout:
    """The checked, mapping-independent half of a swap.

    Attributes
    ----------
    src, dst : list of Part
        Part ``i`` of ``src`` is copied to part ``i`` of ``dst``.
    direction : str
        ``"in"`` (host to GPU), ``"out"`` (GPU to host) or ``"gpu->gpu"``.
    src_limit, dst_limit : int
        Fewest blocks among the source / destination parts (index bound).
    src_limit_name, dst_limit_name : str
        The parts with those fewest blocks, for error messages.
    meeting : list of (int, int)
        ``(dst index, other index)`` part pairs whose bytes may meet
        (``other`` indexes ``src + dst``); each mapping is checked against
        them for bytes both read and written.  Usually empty.
    src_addrs, dst_addrs : list of int
        Device-visible base address of each part (host parts: their alias);
        set by :func:`resolve_layout`.
    width : int
        Bytes per vector the kernel uses (16, 8, 4, 2 or 1).
    table : numpy.ndarray of shape (P * PART_WORDS,), int64
        The kernel parameter's part table for ``width``.
    units_per_pair : int
        Vectors per mapping row, all parts together.
    bytes_per_pair, min_block_bytes, max_block_bytes : int
        Bytes one mapping row moves (all parts), the smallest and the
        largest part's block.
    host_groups : list of CopyGroup or None
        The host side's parts as whole-row copy groups, or None (see
        :func:`cupy_swap.core.parts.copy_groups`).
    staging_kernel : BoundKernel or None
        Staged swaps: the kernel half, resolved and bound.
    generation : int or None
        The host-alias generation read *before* its addresses were resolved
        (set by :func:`resolve_layout`): an op made from it resolves again
        once a registration changed, even one that changed mid-resolve.
    """

    src: list
    dst: list
    direction: str
    src_limit: int
    dst_limit: int
    src_limit_name: str
    dst_limit_name: str
    meeting: list
    src_addrs: list = field(default_factory=list)
    dst_addrs: list = field(default_factory=list)
    width: int = 0
    table: np.ndarray | None = None
    units_per_pair: int = 0
    kernel_ok: bool = True  # False: host parts are not mapped, copy engines only
    unmapped_reason: str = ""
    host_groups: list | None = None
    staging_kernel: object = None
    generation: int | None = None
    copy_groups: tuple | None = field(default=None, repr=False)  # cached by core.copies
    pair_table: list | None = field(default=None, repr=False)  # cached by core.copies
    # Derived once here: the hot path reads them on every swap.
    bytes_per_pair: int = field(init=False)
    min_block_bytes: int = field(init=False)
    max_block_bytes: int = field(init=False)

    def __post_init__(self):
        self.bytes_per_pair = sum(p.block_bytes for p in self.src)
        self.min_block_bytes = min((p.block_bytes for p in self.src), default=0)
        self.max_block_bytes = max((p.block_bytes for p in self.src), default=0)


@dataclass
class SwapPlan:
    """A checked layout with a checked mapping.

    Attributes
    ----------
    layout : Layout
    mapping : numpy.ndarray of shape (N, 2), int64
        ``(src_block, dst_block)`` rows.
    """

    layout: Layout
    mapping: np.ndarray

    @property
    def num_pairs(self) -> int:
        return int(self.mapping.shape[0])

    @property
    def total_bytes(self) -> int:
        return self.num_pairs * self.layout.bytes_per_pair

    # Conveniences so a plan reads like its layout.
    def __getattr__(self, name):
        if name in ("src", "dst", "direction", "width", "src_addrs", "dst_addrs", "bytes_per_pair"):
            return getattr(self.layout, name)
        raise AttributeError(name)


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


def _meeting_spans(src: list[Part], dst: list[Part]) -> list[tuple[int, int]]:
    """Pairs ``(dst index, other index)`` whose address spans meet; ``other``
    indexes ``src + dst``.  Each write/write pair appears once."""
    src_spans = np.array([p.span() for p in src], dtype=np.int64).reshape(-1, 2)
    dst_spans = np.array([p.span() for p in dst], dtype=np.int64).reshape(-1, 2)
    spans = np.concatenate((src_spans, dst_spans))
    meets = (dst_spans[:, None, 0] < spans[None, :, 1]) & (spans[None, :, 0] < dst_spans[:, None, 1])
    n_src = len(src)
    meets[np.arange(len(dst)), n_src + np.arange(len(dst))] = False  # a part vs itself
    parts = src + dst
    return [
        (int(di), int(oi))
        for di, oi in zip(*np.nonzero(meets))
        if not (oi >= n_src and oi - n_src < di) and not _interleaved(dst[di], parts[oi])
    ]


def _interleaved(a: Part, b: Part) -> bool:
    """True when two parts with one block stride occupy disjoint byte ranges
    of every stride period (``cache[:, 0]`` and ``cache[:, 1]``), so no
    mapping makes their blocks overlap."""
    stride = a.block_stride
    if stride != b.block_stride or stride <= 0 or stride < max(a.block_bytes, b.block_bytes):
        return False
    gap_ab = (b.ptr - a.ptr) % stride  # where b starts, seen from a's start
    gap_ba = (a.ptr - b.ptr) % stride
    return gap_ab >= a.block_bytes and gap_ba >= b.block_bytes


def check_layout(src, dst, convert=None) -> Layout:
    """Run every mapping-independent check that needs no GPU (``convert`` as
    in :func:`~cupy_swap.core.parts.as_parts`); addresses, width and table
    are still unset (see :func:`resolve_layout`)."""
    return layout_from_parts(as_parts(src, "src", convert), as_parts(dst, "dst", convert))


def layout_from_parts(src_parts: list[Part], dst_parts: list[Part]) -> Layout:
    """:func:`check_layout` for parts already described."""
    _pair_parts(src_parts, dst_parts)
    direction = _DIRECTIONS.get((_side_location(src_parts, "src"), _side_location(dst_parts, "dst")))
    if direction is None:
        raise ValueError(
            "src, dst: expected at least one side in GPU memory, got host memory on both sides "
            "(host->host copies are not a swap; use numpy.copyto)"
        )
    smin = min(src_parts, key=lambda p: p.num_blocks)
    dmin = min(dst_parts, key=lambda p: p.num_blocks)
    return Layout(
        host_groups=copy_groups(src_parts if direction == IN else dst_parts)
        if direction != GPU_TO_GPU
        else None,
        src=src_parts,
        dst=dst_parts,
        direction=direction,
        src_limit=smin.num_blocks,
        dst_limit=dmin.num_blocks,
        src_limit_name=smin.name,
        dst_limit_name=dmin.name,
        meeting=_meeting_spans(src_parts, dst_parts),
    )


def check_swap(src, dst, block_mapping, *, max_blocks: int | None = None, convert=None) -> SwapPlan:
    """Every check that needs no GPU, for one call: layout and mapping."""
    layout = check_layout(src, dst, convert)
    return SwapPlan(layout, check_mapping_for(layout, block_mapping, max_blocks))


def vector_width(values) -> int:
    """Widest power-of-two vector (<= 16 bytes) dividing every address,
    stride and block size in ``values``."""
    acc = 16
    for v in values:
        acc |= int(v)
    return acc & -acc
