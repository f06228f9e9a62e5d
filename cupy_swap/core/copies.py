"""The copy-engine path's copies, as NumPy arrays: one copy per run of
blocks consecutive in both source and destination, per part (strided parts:
one per block).  NumPy only; :mod:`cupy_swap.cuda.copy_engine` issues them."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .mapping import run_starts


def copy_list(layout, mapping: np.ndarray, merge: bool = True) -> np.ndarray:
    """Every copy of an ``(N, 2)`` mapping over a resolved layout, as one
    uint64 table of shape (3, C): destinations, sources, sizes (one buffer:
    its copies' pointer arrays cost one address lookup), by NumPy arithmetic
    over all parts at once: packed parts one copy per run (``merge``; else
    per block: blocks that already make full-speed copies skip the run
    detection, 40 % of the call at 1250 rows), then strided parts one copy
    per block."""
    packed, strided = _groups(layout)
    out = []
    if packed is not None and not merge:
        out.append(_copies(packed, mapping, None))
    elif packed is not None:
        starts = run_starts(mapping)
        if starts.shape[0] == mapping.shape[0]:  # no runs (random blocks): every row is one
            out.append(_copies(packed, mapping, None))
        else:
            out.append(_copies(packed, mapping[starts], np.diff(starts, append=mapping.shape[0])))
    if strided is not None:  # views of a block-first cache: one copy a block
        out.append(_copies(strided, mapping, None))
    return out[0] if len(out) == 1 else np.concatenate(out, axis=1)


class _Group(NamedTuple):
    """Parts copied alike, as ``(P, 1)`` int64 columns (host parts by their
    host address: copies need no mapping)."""

    s_ptr: np.ndarray
    s_stride: np.ndarray
    d_ptr: np.ndarray
    d_stride: np.ndarray
    nbytes: np.ndarray
    bases: np.ndarray  # (2, P, 1): d_ptr, s_ptr (one multiply-add gives both address rows)
    strides: np.ndarray  # (2, P, 1): d_stride, s_stride


def _groups(layout) -> tuple[_Group | None, _Group | None]:
    """(packed parts, strided parts) of a layout, built once per layout."""
    groups = layout.copy_groups
    if groups is None:
        moving = _moving(layout)

        def group(pairs):
            if not pairs:
                return None
            cols = [[s.ptr, s.block_stride, d.ptr, d.block_stride, s.block_bytes] for s, d in pairs]
            s_ptr, s_stride, d_ptr, d_stride, nbytes = np.array(cols, dtype=np.int64).T[:, :, None]
            return _Group(
                s_ptr,
                s_stride,
                d_ptr,
                d_stride,
                nbytes,
                np.stack((d_ptr, s_ptr)),
                np.stack((d_stride, s_stride)),
            )

        groups = layout.copy_groups = (
            group([(s, d) for s, d in moving if _packed(s) and _packed(d)]),
            group([(s, d) for s, d in moving if not (_packed(s) and _packed(d))]),
        )
    return groups


def _copies(g: _Group, rows: np.ndarray, lengths) -> np.ndarray:
    parts, count = g.s_ptr.shape[0], rows.shape[0]
    table = np.empty((3, parts, count), np.int64)
    # Rows (dst, src) x strides + bases: both address rows in two NumPy calls (6 µs -> 4 on the H200's host).
    np.multiply(rows.T[::-1, None, :], g.strides, out=table[:2])
    table[:2] += g.bases
    if lengths is None:
        table[2] = g.nbytes
    else:
        np.multiply(g.nbytes, lengths, out=table[2])
    return table.reshape(3, parts * count).view(np.uint64)


def _moving(layout) -> list:
    """``(src part, dst part)`` pairs whose blocks hold bytes (zero-byte
    parts get no copies)."""
    return [(s, d) for s, d in zip(layout.src, layout.dst) if s.block_bytes]


def _packed(part) -> bool:
    return part.block_stride == part.block_bytes


def run_copies(layout, s: int, d: int, n: int) -> tuple[list, list, list] | None:
    """:func:`copy_list` of the one-run mapping ``(s + i, d + i)`` for
    ``i < n``, as lists: one copy per part, in plain Python (a run's copies
    need no NumPy over its rows); None when a part is strided (its blocks
    are not adjacent bytes: one copy a block)."""
    table = _pair_table(layout)
    if any(row[1] != row[4] or row[3] != row[4] for row in table):
        return None
    return [r[0] + d * r[1] for r in table], [r[2] + s * r[3] for r in table], [n * r[4] for r in table]


def _pair_table(layout) -> list:
    """``(d_ptr, d_stride, s_ptr, s_stride, block_bytes)`` of every moving
    part, built once per layout."""
    table = layout.pair_table
    if table is None:
        table = layout.pair_table = [
            (dp.ptr, dp.block_stride, sp.ptr, sp.block_stride, sp.block_bytes) for sp, dp in _moving(layout)
        ]
    return table


def pair_copies(layout, s: int, d: int) -> tuple[list, list, list]:
    """:func:`copy_list` of the one-pair mapping ``[(s, d)]``, as lists, in
    plain Python over a per-layout table (little else may stand around a
    one-block swap's memcpys)."""
    table = _pair_table(layout)
    if len(table) == 1:
        ((d_ptr, d_stride, s_ptr, s_stride, nbytes),) = table
        return [d_ptr + d * d_stride], [s_ptr + s * s_stride], [nbytes]
    return (
        [row[0] + d * row[1] for row in table],
        [row[2] + s * row[3] for row in table],
        [row[4] for row in table],
    )
