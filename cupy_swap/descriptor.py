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


def write_descriptor(out: np.ndarray, plan, width: int) -> int:
    """Write ``plan`` into ``out`` for vectors of ``width`` bytes.

    Parameters
    ----------
    out : numpy.ndarray of uint64, 1-D
        Destination, at least :func:`descriptor_words` long.
    plan : SwapPlan
        A resolved plan (addresses filled in).
    width : int
        Bytes per vector; divides every address, stride and block size.

    Returns
    -------
    int
        Number of words written.
    """
    parts = len(plan.src)
    n = plan.num_pairs
    table = np.empty((parts, PART_WORDS), dtype=np.int64)
    units = [p.block_bytes // width for p in plan.src]
    first = np.cumsum([0] + units[:-1])
    for i, (s, d) in enumerate(zip(plan.src, plan.dst)):
        table[i] = (
            plan.src_addrs[i],
            plan.dst_addrs[i],
            s.block_stride,
            d.block_stride,
            units[i],
            first[i],
        )
    words = descriptor_words(parts, n)
    signed = out.view(np.int64)
    signed[:HEADER_WORDS] = 0
    signed[0] = n
    signed[1] = parts
    signed[2] = sum(units)
    t0 = HEADER_WORDS
    t1 = t0 + parts * PART_WORDS
    signed[t0:t1] = table.reshape(-1)
    signed[t1:words] = plan.mapping.reshape(-1)
    return words
