"""Pack a plan into the descriptor that the kernel reads (layout in
``kernels_cu/swap_desc.cuh``: header, part table, mapping pairs)."""

from __future__ import annotations

import numpy as np

__all__ = ["HEADER_WORDS", "PART_WORDS", "MAX_PARTS", "descriptor_words", "write_descriptor"]

HEADER_WORDS = 8
PART_WORDS = 6
MAX_PARTS = 256  # CUPY_SWAP_MAX_PARTS: the kernel keeps the part table in shared memory


def descriptor_words(num_parts: int, num_pairs: int) -> int:
    """Length in 64-bit words of a descriptor for this many parts and pairs."""
    return HEADER_WORDS + num_parts * PART_WORDS + 2 * num_pairs


def write_descriptor(out: np.ndarray, layout, mapping, include_table: bool = True) -> int:
    """Write a resolved layout and a mapping into ``out``.

    Parameters
    ----------
    out : numpy.ndarray of int64, 1-D
        Destination, at least :func:`descriptor_words` long.
    layout : Layout
        Resolved (``table`` and ``units_per_pair`` set).
    mapping : numpy.ndarray of shape (N, 2), int64, or list of (int, int)
    include_table : bool
        False when ``out`` already holds this layout's header words 1-2 and
        part table (a ring slot reused by the same layout).

    Returns
    -------
    int
        Number of words written.
    """
    table = layout.table
    t1 = HEADER_WORDS + table.shape[0]
    n = len(mapping)
    words = t1 + 2 * n
    out[0] = n
    if include_table:
        out[1] = table.shape[0] // PART_WORDS
        out[2] = layout.units_per_pair
        out[HEADER_WORDS:t1] = table
    if isinstance(mapping, list):
        for i, (s, d) in enumerate(mapping, start=t1 // 2):  # t1 is even: 8 + 6 * P
            out[2 * i] = s
            out[2 * i + 1] = d
    else:
        out[t1:words] = mapping.reshape(-1)
    return words
