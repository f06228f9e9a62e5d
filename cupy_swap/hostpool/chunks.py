"""Cutting a pool into registration chunks.

**Invariant.**  The chunks of a pool cover its bytes exactly, in order,
without overlap; every cut between two chunks falls on a block-row boundary
(a block never straddles two chunks) *and* on a page boundary (two
``cudaHostRegister`` calls never share a page, which CUDA refuses); a chunk
is at most ``chunk_bytes`` long unless the smallest run of rows that ends on
a page boundary is longer (then it is that run).  Pure arithmetic: no CUDA.
"""

from __future__ import annotations

import math
from typing import NamedTuple


class Chunk(NamedTuple):
    """One registration: rows ``[first_row, end_row)``, bytes ``[start, end)``."""

    index: int
    first_row: int
    end_row: int
    start: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start


def _first_aligned_row(base: int, row_bytes: int, page: int) -> int | None:
    """Smallest ``k >= 1`` with ``(base + k * row_bytes) % page == 0``, or None."""
    period = page // math.gcd(row_bytes, page)
    for k in range(1, period + 1):
        if (base + k * row_bytes) % page == 0:
            return k
    return None


def plan_chunks(base: int, rows: int, row_bytes: int, chunk_bytes: int, page: int = 4096) -> list[Chunk]:
    """Chunks of a C-contiguous pool of ``rows`` rows of ``row_bytes`` bytes at
    host address ``base``.

    Parameters
    ----------
    base : int
        Host address of row 0.
    rows, row_bytes : int
        The pool is ``rows * row_bytes`` bytes (shape ``(rows, ...)``).
    chunk_bytes : int
        Most bytes per chunk (see the module invariant for the one exception).
    page : int
        Page size in bytes (a power of two).

    Returns
    -------
    list of Chunk
        At least one chunk (for ``rows == 0``: none).
    """
    for name, value in (("rows", rows), ("row_bytes", row_bytes), ("chunk_bytes", chunk_bytes)):
        if isinstance(value, bool) or not isinstance(value, int) or value < (0 if name == "rows" else 1):
            raise ValueError(
                f"{name}: expected a {'non-negative' if name == 'rows' else 'positive'} int, got {value!r}"
            )
    if page <= 0 or page & (page - 1):
        raise ValueError(f"page: expected a power of two, got {page}")
    if rows == 0:
        return []
    first = _first_aligned_row(base, row_bytes, page)
    end = base + rows * row_bytes
    if first is None or first >= rows:  # no page-aligned row boundary inside the pool: one chunk
        return [Chunk(0, 0, rows, base, end)]
    period = page // math.gcd(row_bytes, page)  # aligned cuts are first + j * period
    want = max(1, chunk_bytes // row_bytes)  # rows per chunk the setting allows
    cuts, pos = [0], 0
    while True:
        # The last aligned cut at most `want` rows past pos, else the first past pos.
        limit = pos + want
        if limit < first:
            cut = first
        else:
            cut = first + (limit - first) // period * period
            if cut <= pos:
                cut = first + ((pos - first) // period + 1) * period
        if cut >= rows:
            break
        cuts.append(cut)
        pos = cut
    cuts.append(rows)
    return [
        Chunk(i, a, b, base + a * row_bytes, base + b * row_bytes)
        for i, (a, b) in enumerate(zip(cuts, cuts[1:]))
    ]
