"""A transfer's mapping, checked before anything is posted: the contract of
``swap()`` (rows ``(src_block, dst_block)`` or the pair form ``(src_indices,
dst_indices)``, told apart by ``swap()``'s one rule; bounds, distinct
destinations), turned into NIXL descriptor indices."""

from __future__ import annotations

import numpy as np

from cupy_swap.core.mapping import check_mapping, normalize_mapping

__all__ = ["split_mapping", "descriptor_indices"]


def split_mapping(mapping, src_blocks: int, dst_blocks: int, src_name: str, dst_name: str):
    """Check a mapping and return its two columns.

    Parameters
    ----------
    mapping : list, array or tensor of shape (N, 2), or a tuple (src_indices, dst_indices)
        As ``swap()`` reads it, by type alone
        (:func:`cupy_swap.core.mapping.index_pair`): rows ``(src_block,
        dst_block)`` in a list (of pairs), a NumPy array or a CPU tensor; or a
        tuple of two 1-D sequences of one length N, source and destination
        indices (a tuple is always this pair form: ``((5, 0), (9, 1))``
        copies 5 -> 9 and 0 -> 1; a tuple of any other length is refused).
    src_blocks, dst_blocks : int
        Block counts of the source and destination pools.
    src_name, dst_name : str
        Their names, for messages.

    Returns
    -------
    (numpy.ndarray, numpy.ndarray)
        ``src`` and ``dst``, each of shape (N,), int64: new arrays, never
        views of ``mapping`` (a transfer keeps them after the call returned,
        and the caller may reuse its buffer at once).

    Raises
    ------
    TypeError, ValueError, IndexError
        As ``swap()``: not integers, not (N, 2), a tuple of other than two
        sequences, out of range, a destination block twice.
    """
    small = _small_mapping(mapping, src_blocks, dst_blocks)
    if small is not None:
        return small
    m = normalize_mapping(mapping)  # the pair form too: swap()'s reader, swap()'s rule
    if m.shape[0]:
        check_mapping(m, src_blocks, dst_blocks, src_name, dst_name)
    return m[:, 0].copy(), m[:, 1].copy()


SMALL = 64  # rows up to which builtins over lists check faster than NumPy reductions


def _small_mapping(mapping, src_blocks: int, dst_blocks: int):
    """The columns of a short, valid mapping (an integer ``(N, 2)`` array or
    a list of ``(int, int)`` rows), checked with builtins; None for anything
    else (a tuple: the pair form, or refused), or anything wrong (the NumPy
    path then says what)."""
    kind = type(mapping)
    if kind is np.ndarray:
        if mapping.ndim != 2 or mapping.shape[1] != 2 or not 0 < mapping.shape[0] <= SMALL:
            return None
        if mapping.dtype != np.int64:
            if mapping.dtype.kind not in "iu" or mapping.dtype.itemsize > 8:
                return None
            mapping = mapping.astype(np.int64)
        s, d = mapping[:, 0].copy(), mapping[:, 1].copy()  # owned: the caller may reuse its array
        sl, dl = s.tolist(), d.tolist()
    elif kind is list:  # rows, at every length
        if not 0 < len(mapping) <= SMALL:
            return None
        for row in mapping:
            if type(row) not in (tuple, list) or len(row) != 2:
                return None
        sl, dl = [r[0] for r in mapping], [r[1] for r in mapping]
        if set(map(type, sl)) | set(map(type, dl)) != {int}:  # bools and NumPy scalars: the NumPy path
            return None
        s = d = None
    else:
        return None
    if (
        min(sl) < 0
        or max(sl) >= src_blocks
        or min(dl) < 0
        or max(dl) >= dst_blocks
        or len(set(dl)) != len(dl)
    ):
        return None
    if s is None:
        s, d = np.array(sl, dtype=np.int64), np.array(dl, dtype=np.int64)
    return s, d


def descriptor_indices(blocks: np.ndarray, num_parts: int, num_blocks: int) -> np.ndarray:
    """NIXL indices of ``blocks`` in every part of a pool whose descriptors are
    laid out part-major (:meth:`PoolLayout.block_descs`).

    Parameters
    ----------
    blocks : numpy.ndarray of shape (N,), int64
    num_parts, num_blocks : int
        P and B of the descriptor list.

    Returns
    -------
    numpy.ndarray of shape (P * N,), int32
        ``p * B + blocks[i]`` at ``p * N + i``.
    """
    if num_parts == 1:
        return blocks.astype(np.int32)
    offsets = np.arange(num_parts, dtype=np.int64)[:, None] * num_blocks
    return (offsets + blocks[None, :]).astype(np.int32).ravel()
