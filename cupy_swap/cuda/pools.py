"""The host pools being pinned in chunks, and what a layout may do with a
span of one.

:mod:`cupy_swap.hostpool` makes the pools and feeds this registry (it
publishes a :class:`PoolRecord`, sets its chunks' states and retires it);
:mod:`.resolve` and the captured swap read it.  It lives in the CUDA layer so
that the lower layer never imports the higher one.

**Invariant.**  A pool is published here before its first chunk is
registered and unpublished only after its last chunk is unregistered.  A
pool is *retired* the moment its owner is dropped (before the releaser
waits for the GPUs and unpins it): from then on no span of it resolves, so
an op made over it raises at its next call (the drop bumps the alias
generation) instead of launching over memory about to be unpinned.  A
span of a published, live pool resolves to a device address only if every chunk
it touches is registered and all of them share one alias offset (device
alias minus host address); a span touching a chunk not registered yet is
refused naming the argument, the blocks and what to do; a span across
chunks whose aliases are not contiguous is left to the copy engines, which
use host addresses (each block lies in one chunk).  Each chunk is also in
:mod:`cupy_swap.cuda.memory`'s range registry once registered, so
``is_pinned`` and ``host_alias`` of a view inside one chunk work as for any
pinned range.
"""

from __future__ import annotations

import bisect

from ..core.parts import HOST
from .spans import Spans

PENDING, PINNED, FAILED = 0, 1, 2


class PoolRecord:
    """One chunked pool: its chunks, their states and alias offsets.

    Attributes
    ----------
    base, end : int
        Host byte span ``[base, end)``.
    row_bytes, rows : int
        Block-row size and count (the pool's axis 0).
    chunks : list of cupy_swap.hostpool.chunks.Chunk
        ``start``, ``end`` (bytes) and ``end_row`` of each registration.
    states : list of int
        ``PENDING``, ``PINNED`` or ``FAILED`` per chunk.
    offsets : list of int or None
        Device alias minus host address per pinned chunk (None: unmapped).
    what : str
        The pool in words, for messages (``"host pool (48.0 GiB, 24 chunks)"``).
    owner : weakref.ref or None
        The pool's owner (what keeps it pinned); set once it exists.
    retired : bool
        True once the owner was dropped: being unpinned, never resolved again.
    """

    def __init__(self, base: int, rows: int, row_bytes: int, chunks: list, what: str):
        self.base, self.end = base, base + rows * row_bytes
        self.rows, self.row_bytes = rows, row_bytes
        self.chunks = chunks
        self._starts = [c.start for c in chunks]
        self.states = [PENDING] * len(chunks)
        self.offsets: list = [None] * len(chunks)
        self.what = what
        self.owner = None
        self.retired = False

    def usable_rows(self) -> int:
        """Rows ``[0, usable_rows)`` are pinned (chunks register in order)."""
        rows = 0
        for c, s in zip(self.chunks, self.states):
            if s != PINNED:
                break
            rows = c.end_row
        return rows

    def touched(self, lo: int, hi: int) -> range:
        """Indices of the chunks ``[lo, hi)`` touches."""
        first = max(0, bisect.bisect_right(self._starts, lo) - 1)
        last = max(first, bisect.bisect_left(self._starts, hi) - 1)
        return range(first, last + 1)


registry = Spans()  # PoolRecord records
NOT_A_POOL = object()


def _block_range(part, lo: int, hi: int, pool: PoolRecord, chunk_ids) -> str:
    """The part's blocks that lie in ``chunk_ids`` (for a message)."""
    stride = part.block_stride or 1
    span_lo = min(pool.chunks[i].start for i in chunk_ids)
    span_hi = max(pool.chunks[i].end for i in chunk_ids)
    if stride > 0:
        first = max(0, -(-(span_lo - part.ptr - part.block_bytes + 1) // stride))
        last = min(part.num_blocks - 1, (span_hi - 1 - part.ptr) // stride)
    else:
        first, last = 0, part.num_blocks - 1
    if last < first:
        first, last = 0, part.num_blocks - 1
    row_lo = (max(lo, span_lo) - pool.base) // pool.row_bytes
    row_hi = (min(hi, span_hi) - 1 - pool.base) // pool.row_bytes
    blocks = f"block {first}" if first == last else f"blocks {first}..{last}"
    return f"{blocks} (pool row{'' if row_lo == row_hi else 's'} {row_lo}{'' if row_lo == row_hi else f'..{row_hi}'})"


def resolve_span(part, lo: int, hi: int, mapped: bool):
    """The device-visible base address of host part ``part`` (bytes
    ``[lo, hi)``) when it lies in a chunked pool: an int, or None (copy
    engines: unmapped, or chunks whose aliases are not contiguous), or
    :data:`NOT_A_POOL` when no chunked pool holds it.

    Raises
    ------
    ValueError
        Part of the span is in chunks not pinned yet (or whose registration
        failed): names the part, its blocks and what to do.
    """
    if not len(registry):
        return NOT_A_POOL
    pool = registry.overlapping(lo, hi)
    if pool is None:
        return NOT_A_POOL
    if lo < pool.base or hi > pool.end:
        raise ValueError(
            f"{part.name}: expected memory inside one pinned pool, got bytes [{lo:#x}, {hi:#x}) that "
            f"run past the {pool.what} at [{pool.base:#x}, {pool.end:#x})"
        )
    if pool.retired:
        raise ValueError(
            f"{part.name}: expected pinned host memory, got memory of a {pool.what} whose pin handle was "
            f"dropped (its chunks are being unpinned); keep the PinHandle that pin_array() returned alive "
            f"as long as swaps use the array, or pin the array again"
        )
    ids = pool.touched(lo, hi)
    waiting = [i for i in ids if pool.states[i] != PINNED]
    if waiting:
        failed = any(pool.states[i] == FAILED for i in waiting)
        usable = pool.usable_rows()
        fix = (
            "its registration failed (the pin handle's .error says why); use only rows "
            f"[0, {usable}) of the pool, or free it and pin a smaller one"
            if failed
            else f"wait for the pin handle (handle.wait(timeout)), or swap only rows [0, {usable}) of the "
            f"pool (pool[:handle.usable_rows]), which are pinned"
        )
        raise ValueError(
            f"{part.name}: expected pinned host memory, got {_block_range(part, lo, hi, pool, waiting)} in "
            f"chunks {waiting[0]}..{waiting[-1]} of the {pool.what} that are not pinned "
            f"{'(registration failed)' if failed else 'yet'} ({usable} of {pool.rows} rows pinned); {fix}"
        )
    offsets = {pool.offsets[i] for i in ids}
    if not mapped or None in offsets or len(offsets) != 1:
        return None
    return part.ptr + offsets.pop()


def owners(layout) -> list:
    """The owners of the pools the layout's host parts lie in (holding them
    keeps those pools pinned: a captured graph may replay at any time).

    Raises
    ------
    ValueError
        A part lies in a pool whose owner was dropped (retired): its
        memory is being unpinned, and nothing may be captured over it."""
    found = []
    for part in layout.src + layout.dst:
        lo, hi = part.span()
        pool = registry.overlapping(lo, hi) if part.location == HOST and len(registry) else None
        if pool is None or pool.owner is None:
            continue
        owner = pool.owner()
        if owner is None or pool.retired:
            raise ValueError(
                f"{part.name}: expected pinned host memory, got memory of a {pool.what} whose pin handle "
                f"was dropped (its chunks are being unpinned); keep the PinHandle alive as long as swaps, "
                f"captured or not, use the array"
            )
        found.append(owner)
    return found


def unmapped_reason(layout) -> str:
    """Why a layout whose host parts lie across chunks with different alias
    offsets goes to the copy engines ("" when none does)."""
    for part in layout.src + layout.dst:
        if part.location != HOST or not part.block_bytes:
            continue
        lo, hi = part.span()
        pool = registry.overlapping(lo, hi) if len(registry) else None
        if pool is None:
            continue
        offsets = {pool.offsets[i] for i in pool.touched(lo, hi)}
        if len(offsets) > 1 and None not in offsets:
            return (
                f"{part.name} spans chunks of the {pool.what} whose device aliases are not contiguous "
                f"(cudaDevAttrCanUseHostPointerForRegisteredMem is 0), so the copy engines move it by host "
                f"address; pass one chunk's rows (handle.chunk_views()) to swap through the kernel"
            )
    return ""
