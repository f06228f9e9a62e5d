"""Copy-engine path: one copy per run of blocks that are consecutive in both
source and destination, per part.  Uses no SMs.

Copies go out as one ``cuMemcpyBatchAsync`` call where the driver has it
(CUDA 12.8+; through ctypes with NumPy pointer arrays: a batch of thousands
costs microseconds), else as one ``cudaMemcpyAsync`` per copy.
"""

from __future__ import annotations

import ctypes

import numpy as np

from ..core.copies import copy_list, pair_copies
from .driver import MemcpyAttributes, memcpy_batch

# cudaMemcpyKind per swap direction (explicit, as the memcpy ceiling uses;
# cudaMemcpyDefault = 4 would infer it from unified addresses).
_KINDS = {"in": 1, "out": 2, "gpu->gpu": 3}


_CU_MEMCPY_SRC_ACCESS_ORDER_STREAM = 1

# Raw handles of the legacy default stream (NULL, which the non-_ptsz symbol
# takes as legacy, and CU_STREAM_LEGACY): the batch call refuses them
# (CUDA_ERROR_INVALID_VALUE on an H200, driver 580).  2, the per-thread
# stream, takes the batch.
_LEGACY_STREAM_HANDLES = (0, 1)


def batch_available() -> bool:
    """True when the driver exports ``cuMemcpyBatchAsync``."""
    return memcpy_batch()[0] is not None


class DmaCopier:
    """Issues a swap's copies on the copy engines."""

    def __init__(self):
        self._attrs = MemcpyAttributes(srcAccessOrder=_CU_MEMCPY_SRC_ACCESS_ORDER_STREAM)
        self._attr_idx = (ctypes.c_size_t * 1)(0)
        self._fail = ctypes.c_size_t(0)
        self._attrs_ptr, self._attr_idx_ptr = ctypes.addressof(self._attrs), ctypes.addressof(self._attr_idx)
        self._fail_ptr = ctypes.addressof(self._fail)
        self._batch = None  # (fn, takes_fail_index), loaded on first use
        self._memcpy = None

    def copy(
        self, layout, mapping, stream: int, capturing: bool = False, merge: bool = True, run=None
    ) -> int:
        """Enqueue every copy of a swap on ``stream``; returns how many were
        issued.  ``mapping`` is an ``(N, 2)`` int64 array, or a flat list
        ``[s0, d0, ...]`` of a short one; ``merge``: one copy per run of
        consecutive blocks (else one per block); ``run``: the copies of a
        mapping that is one run (:func:`~cupy_swap.core.copies.run_copies`),
        issued as they are."""
        kind = _KINDS[layout.direction]
        if run:
            return self.issue(*run, stream, kind, capturing)
        if type(mapping) is list:
            if len(mapping) == 2:  # one pair: a copy per part, no NumPy
                dsts, srcs, sizes = pair_copies(layout, mapping[0], mapping[1])
                return self.issue(dsts, srcs, sizes, stream, kind, capturing)
            mapping = np.array(mapping, dtype=np.int64).reshape(-1, 2)
        return self.issue_table(copy_list(layout, mapping, merge), stream, kind, capturing)

    def issue_table(self, table: np.ndarray, stream: int, kind: int, capturing: bool = False) -> int:
        """:meth:`issue` of a C-contiguous uint64 table of shape (3, C)
        (destinations, sources, sizes): its rows' addresses from one lookup."""
        count = table.shape[1]
        fn = self._batch[0] if self._batch is not None else None
        if count > 1 and fn is not None and stream not in _LEGACY_STREAM_HANDLES and not capturing:
            base = table.ctypes.data
            return self._batch_call(base, base + 8 * count, base + 16 * count, count, stream)
        return self.issue(table[0], table[1], table[2], stream, kind, capturing)

    def issue(self, dsts, srcs, sizes, stream: int, kind: int, capturing: bool = False) -> int:
        """Enqueue copies ``srcs[i] -> dsts[i]`` of ``sizes[i]`` bytes (uint64
        arrays or int lists) on ``stream``: one ``cuMemcpyBatchAsync`` where
        possible, else one ``cudaMemcpyAsync`` of memcpy ``kind`` each (while
        capturing: plain memcpy nodes, and on the legacy default stream)."""
        if self._memcpy is None:
            from cupy.cuda import runtime

            self._memcpy = runtime.memcpyAsync
            self._batch = memcpy_batch()
        count = len(sizes)
        if count == 1:
            self._memcpy(int(dsts[0]), int(srcs[0]), int(sizes[0]), kind, stream)
            return 1
        fn, takes_fail = self._batch
        if fn is not None and count > 1 and stream not in _LEGACY_STREAM_HANDLES and not capturing:
            if isinstance(dsts, list):
                dsts, srcs, sizes = (np.array(x, dtype=np.uint64) for x in (dsts, srcs, sizes))
            return self._batch_call(dsts.ctypes.data, srcs.ctypes.data, sizes.ctypes.data, count, stream)
        if not isinstance(dsts, list):
            dsts, srcs, sizes = dsts.tolist(), srcs.tolist(), sizes.tolist()
        for dst, src, size in zip(dsts, srcs, sizes):
            self._memcpy(dst, src, size, kind, stream)
        return count

    def _batch_call(self, dsts: int, srcs: int, sizes: int, count: int, stream: int) -> int:
        """One ``cuMemcpyBatchAsync`` over ``count`` copies whose pointer
        arrays lie at ``dsts``, ``srcs``, ``sizes``."""
        fn, takes_fail = self._batch
        args = [dsts, srcs, sizes, count, self._attrs_ptr, self._attr_idx_ptr, 1]
        if takes_fail:
            args.append(self._fail_ptr)
        status = fn(*args, stream)
        if status != 0:
            failed = f", first failing copy {self._fail.value}" if takes_fail else ""
            raise RuntimeError(
                f"cuMemcpyBatchAsync: expected CUDA_SUCCESS for {count} copies, got CUresult {status}{failed}"
            )
        return count
