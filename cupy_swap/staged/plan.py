"""Staged swaps: the copy engines move host runs, the SMs scatter or gather.

SM traffic is the weak PCIe path (on an H200, kernel reads of host memory
reach 0.87-0.92 of ``cudaMemcpy``, and full duplex about 60 GB/s against the
copy engines' 97-100: ``benchmarks/NOTES.md``), while the copy engines pay
about 1 us per copy.  A swap whose host blocks lie in a few long runs gets
both: each run is one copy to or from a GPU staging arena, and a kernel moves
blocks between the arena and their GPU blocks at HBM speed.  The swap is cut
into chunks placed in a ring of staging rows, so one chunk's kernel half
overlaps the next one's transfer.

NumPy only (so the plan is tested on the CPU); :mod:`.stager` owns the arena
and enqueues the work.  The host side's copy groups are a fact of the layout
(:func:`cupy_swap.core.parts.copy_groups`, ``Layout.host_groups``).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from ..core.layout import OUT, Layout
from ..core.mapping import run_starts
from ..core.parts import DEVICE, CopyGroup, Part
from ..core.route import HOST_COLUMN, Policy

# A swap-in is cut into as few chunks as the staging ring allows: each extra
# copy-engine copy costs 30-40 us of link time when SM stores to host memory
# run beside it (a concurrent swap-out; benchmarks/NOTES.md).  The last chunk
# is only scattered once it has landed, so a swap this large or larger keeps
# a quarter of its pairs for a short last chunk.
SPLIT_TAIL_BYTES = 4 << 20


def staging_parts(host: list[Part], groups: list[CopyGroup], base: int, rows: int, device: int) -> list[Part]:
    """The parts of the staging arena at ``base``, ``rows`` blocks deep: each
    group's region has its host row geometry (runs copy byte for byte), and
    part ``i`` mirrors ``host[i]``."""
    out: list[Part | None] = [None] * len(host)
    for g, region in zip(groups, group_regions(groups, rows)):
        for i, off in zip(g.parts, g.offsets):
            p = host[i]
            out[i] = Part(
                name=f"staging[{i}]",
                location=DEVICE,
                device=device,
                ptr=base + region + off,
                num_blocks=rows,
                block_stride=g.row_bytes,
                block_bytes=p.block_bytes,
                block_shape=p.block_shape,
                dtype=p.dtype,
                writeable=True,
            )
    return out


def group_regions(groups: list[CopyGroup], rows: int) -> list[int]:
    """Byte offset of each group's region in an arena ``rows`` blocks deep."""
    return [0, *itertools.accumulate(rows * g.row_bytes for g in groups[:-1])]


def chunk_sizes(n: int, bytes_per_pair: int, max_rows: int) -> list[int]:
    """Pairs per chunk for a swap of ``n`` pairs: chunks of ``max_rows``
    while more remain, then the rest, split 3:1 when it is at least
    ``SPLIT_TAIL_BYTES`` so the scatter left after the last copy is short."""
    sizes = []
    while n > max_rows:
        sizes.append(max_rows)
        n -= max_rows
    if n * bytes_per_pair >= SPLIT_TAIL_BYTES and n >= 4:  # both parts non-empty
        head = -(-3 * n // 4)
        sizes += [head, n - head]
    else:
        sizes.append(n)
    return sizes


def host_runs(host_blocks: np.ndarray) -> tuple[np.ndarray | None, np.ndarray, np.ndarray]:
    """Sort the pairs by host block and find runs of consecutive host blocks:
    ``(order, sorted_blocks, run_starts)``, ``order`` None when the (N,)
    ``host_blocks`` already ascend, ``run_starts`` indexing the sorted pairs."""
    step = np.diff(host_blocks)
    order = None
    if step.size and step.min() <= 0:
        order = np.argsort(host_blocks, kind="stable")
        host_blocks = host_blocks[order]
    return order, host_blocks, run_starts(host_blocks)


@dataclass
class StagedPlan:
    """A staged swap cut into chunks, before staging rows are chosen.

    Copies are *pieces*: runs of consecutive host blocks cut at chunk edges;
    few (about one per chunk), so Python lists are cheaper than NumPy.

    Attributes
    ----------
    sizes : list of int
        Pairs per chunk.
    starts : list of int
        Index of each chunk's first pair in staging order, then ``N``.
    gpu_blocks : numpy.ndarray of shape (N,), int64
        GPU block of each pair, in staging order (pairs sorted by host block).
    piece_rows, piece_hosts, piece_lengths, piece_chunks : list of int
        Per piece: index of its first pair in staging order, its first host
        block, its length in blocks, its chunk.
    chunk_cuts : list of int
        Pieces ``chunk_cuts[c]:chunk_cuts[c + 1]`` belong to chunk ``c``.
    """

    sizes: list
    starts: list
    gpu_blocks: np.ndarray
    piece_rows: list
    piece_hosts: list
    piece_lengths: list
    piece_chunks: list
    chunk_cuts: list

    @property
    def num_chunks(self) -> int:
        return len(self.sizes)


def plan_chunks(mapping: np.ndarray, sizes: list[int], host_column: int = 0) -> StagedPlan:
    """Cut a checked ``(N, 2)`` mapping (``N >= 1``) into chunks of ``sizes``
    pairs (see :func:`chunk_sizes`); ``host_column`` 0 for a swap-in, 1 for
    a swap-out."""
    if host_column:
        mapping = mapping[:, ::-1]  # (host_block, gpu_block) rows
    n = mapping.shape[0]
    if sum(sizes) != n or min(sizes) < 1:
        raise ValueError(f"sizes: expected positive chunk sizes summing to {n}, got {sizes}")
    starts = [0, *itertools.accumulate(sizes)]
    step = np.diff(mapping[:, 0])
    if not step.size or step.min() == step.max() == 1:
        # One ascending run (a tier that hands out host slots in order): a
        # piece per chunk, no NumPy beyond the check.
        first = int(mapping[0, 0])
        k = len(sizes)
        return StagedPlan(
            sizes, starts, mapping[:, 1], starts[:-1], [first + r for r in starts[:-1]], sizes,
            list(range(k)), list(range(k + 1)),
        )  # fmt: skip
    order, hosts, run_starts = host_runs(mapping[:, 0])
    gpus = mapping[:, 1] if order is None else mapping[order, 1]
    edge = np.zeros(n, dtype=bool)
    edge[run_starts] = True
    edge[starts[:-1]] = True  # no copy spans two chunks
    rows = np.flatnonzero(edge)
    chunk_of = np.searchsorted(starts, rows, side="right") - 1
    cuts = np.searchsorted(rows, starts).tolist()
    return StagedPlan(
        sizes, starts, gpus, rows.tolist(), hosts[rows].tolist(), np.diff(rows, append=n).tolist(),
        chunk_of.tolist(), cuts,
    )  # fmt: skip


def staged_plan(layout: Layout, mapping: np.ndarray, policy: Policy) -> StagedPlan:
    """The chunks of a staged swap of a checked ``(N, 2)`` mapping."""
    sizes = chunk_sizes(
        mapping.shape[0], layout.bytes_per_pair, policy.staging_rows(layout.bytes_per_pair) // 2
    )
    if layout.direction == OUT:
        sizes.reverse()  # a short first gather lets the copy engine start early
    return plan_chunks(mapping, sizes, HOST_COLUMN[layout.direction])


def chunk_copies(plan: StagedPlan, groups: list[CopyGroup], regions: list[int], base: int, chunk_rows: list):
    """Per chunk, the copy-engine copies ``(arena addresses, host addresses,
    byte counts)``, given the groups' ``regions`` in the arena at ``base``
    and each chunk's first arena row."""
    starts = plan.starts
    rows = [chunk_rows[c] + r - starts[c] for r, c in zip(plan.piece_rows, plan.piece_chunks)]
    per_group = [
        (
            [base + region + r * g.row_bytes for r in rows],
            [g.host_ptr + h * g.row_bytes for h in plan.piece_hosts],
            [k * g.row_bytes for k in plan.piece_lengths],
        )
        for g, region in zip(groups, regions)
    ]
    out = []
    cuts = plan.chunk_cuts
    for c in range(plan.num_chunks):
        lo, hi = cuts[c], cuts[c + 1]
        dsts, srcs, sizes = [], [], []
        for d, s, z in per_group:
            dsts += d[lo:hi]
            srcs += s[lo:hi]
            sizes += z[lo:hi]
        out.append((dsts, srcs, sizes))
    return out


def kernel_pairs(plan: StagedPlan, chunk_rows: list, gpu_first: bool = False) -> np.ndarray:
    """The kernel half's mapping, shape (N, 2), in staging order (chunk ``c``
    is pairs ``starts[c]`` onward): ``(arena row, GPU block)`` rows for a
    swap-in's scatter, ``(GPU block, arena row)`` with ``gpu_first`` for a
    swap-out's gather."""
    n = plan.gpu_blocks.shape[0]
    shift = np.array([r - s for r, s in zip(chunk_rows, plan.starts)], dtype=np.int64)
    out = np.empty((n, 2), dtype=np.int64)
    row, gpu = (1, 0) if gpu_first else (0, 1)
    out[:, row] = np.repeat(shift, plan.sizes)
    out[:, row] += np.arange(n, dtype=np.int64)
    out[:, gpu] = plan.gpu_blocks
    return out


class RowRing:
    """Placement of chunks in a ring of ``rows`` staging rows.

    Each chunk takes the next ``count`` consecutive rows (wrapping to row 0).
    Rows stay busy until the event behind the last work that reads them; a
    new chunk gets the events of every busy region it overlaps (the rest of
    such a region stays busy: the stream that waits differs from call to
    call), or the index of an overlapped chunk of the same swap (its event
    is not recorded yet).  ``barriers``: events every row waits for first.
    """

    def __init__(self, rows: int, barriers=()):
        self.rows = rows
        self.head = 0
        # [first row, end row, event or None, chunk index]
        self.busy: list[list] = [[0, rows, ev, -1] for ev in barriers]

    def place(self, count: int, chunk: int) -> tuple[int, list, list]:
        """``(first row, events of earlier swaps' work that read the rows,
        earlier chunks of this swap that read them)`` for chunk ``chunk``."""
        if not 1 <= count <= self.rows:
            raise ValueError(f"count: expected 1 to {self.rows} rows, got {count}")
        if self.head + count > self.rows:
            self.head = 0
        lo, hi = self.head, self.head + count
        self.head = hi
        events, chunks, keep = {}, [], []
        for entry in self.busy:
            first, end, event, owner = entry
            if first < hi and lo < end:
                if event is not None:
                    events[id(event)] = event
                elif owner not in chunks:
                    chunks.append(owner)
                if first < lo:
                    keep.append([first, lo, event, owner])
                if hi < end:
                    keep.append([hi, end, event, owner])
            else:
                keep.append(entry)
        keep.append([lo, hi, None, chunk])
        self.busy = keep
        return lo, list(events.values()), chunks

    def settle(self, chunk: int, event) -> None:
        """Chunk ``chunk`` of the swap being placed is read by the work that
        ``event`` follows."""
        for entry in self.busy:
            if entry[2] is None and entry[3] == chunk:
                entry[2] = event

    def settle_all(self, event) -> None:
        """Every region of the swap being placed is read by work that
        ``event`` follows (after a swap failed halfway)."""
        for entry in self.busy:
            if entry[2] is None:
                entry[2] = event

    def drop_unsettled(self) -> None:
        """Forget the regions of the swap being placed (it failed and its
        work could not be fenced); other regions keep their events."""
        self.busy = [e for e in self.busy if e[2] is not None]

    def events(self) -> list:
        """The distinct events that busy rows wait for."""
        return list({id(e[2]): e[2] for e in self.busy if e[2] is not None}.values())

    def holds(self) -> set:
        """``id`` of every event a busy row still waits for."""
        return {id(e[2]) for e in self.busy if e[2] is not None}
