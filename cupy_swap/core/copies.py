"""The copy-engine path's copies, as NumPy arrays: one copy per run of
blocks consecutive in both source and destination, per part (strided parts:
one per block).  NumPy only; :mod:`cupy_swap.cuda.copy_engine` issues them."""

from __future__ import annotations

import numpy as np

from .mapping import contiguous_runs, run_starts

__all__ = ["copy_list", "pair_copies", "copy_count"]


def copy_list(layout, mapping: np.ndarray):
    """Destination, source and size arrays of every copy of a swap.

    Parameters
    ----------
    layout : Layout
        Resolved layout.
    mapping : numpy.ndarray of shape (N, 2), int64

    Returns
    -------
    dsts, srcs, sizes : numpy.ndarray of uint64, each of shape (P * R,)
        ``P`` parts times ``R`` runs, part-major.
    """
    runs = contiguous_runs(mapping)
    dsts, srcs, sizes = [np.empty(0, np.int64)], [np.empty(0, np.int64)], [np.empty(0, np.int64)]
    # Host parts are addressed by their host address: copies need no mapping.
    for s, d in _moving(layout):
        s_base, d_base = s.ptr, d.ptr
        if _packed(s) and _packed(d):
            # Packed blocks: a whole run is one contiguous range.
            srcs.append(s_base + runs[:, 0] * s.block_stride)
            dsts.append(d_base + runs[:, 1] * d.block_stride)
            sizes.append(runs[:, 2] * s.block_bytes)
        else:
            # Strided blocks (views of a block-first cache): one copy a block.
            srcs.append(s_base + mapping[:, 0] * s.block_stride)
            dsts.append(d_base + mapping[:, 1] * d.block_stride)
            sizes.append(np.full(mapping.shape[0], s.block_bytes, dtype=np.int64))
    return (
        np.concatenate(dsts).astype(np.uint64),
        np.concatenate(srcs).astype(np.uint64),
        np.concatenate(sizes).astype(np.uint64),
    )


def _moving(layout) -> list:
    """``(src part, dst part)`` pairs whose blocks hold bytes (zero-byte
    parts get no copies)."""
    return [(s, d) for s, d in zip(layout.src, layout.dst) if s.block_bytes]


def _packed(part) -> bool:
    return part.block_stride == part.block_bytes


def pair_copies(layout, s: int, d: int) -> tuple[list, list, list]:
    """:func:`copy_list` of the one-pair mapping ``[(s, d)]``, in plain Python."""
    moving = _moving(layout)
    return (
        [dp.ptr + d * dp.block_stride for _, dp in moving],
        [sp.ptr + s * sp.block_stride for sp, _ in moving],
        [sp.block_bytes for sp, _ in moving],
    )


def copy_count(layout, mapping: np.ndarray) -> int:
    """How many copies the copy-engine path would issue for an ``(N, 2)``
    mapping, without building the copy list."""
    packed = [_packed(s) and _packed(d) for s, d in _moving(layout)]
    n = mapping.shape[0]
    runs = run_starts(mapping).shape[0] if any(packed) else n
    return sum(runs if p else n for p in packed)
