"""Copy-engine path: one copy per run of blocks that are consecutive in both
source and destination, per part.  Uses no SMs.

Copies go out as one ``cuMemcpyBatchAsync`` call where the driver has it
(CUDA 12.8+; called through ctypes with NumPy pointer arrays, so a batch of
thousands costs microseconds, not a Python loop), else as one
``cudaMemcpyAsync`` per copy.  The batch call rejects the legacy default
stream, so swaps on stream 0 use the loop.
"""

from __future__ import annotations

import ctypes

import numpy as np

from .driver import MemcpyAttributes, memcpy_batch
from .mapping import contiguous_runs

__all__ = ["copy_list", "copy_count", "DmaCopier", "batch_available"]

# cudaMemcpyKind per swap direction (explicit, as the memcpy ceiling uses;
# cudaMemcpyDefault = 4 would infer it from unified addresses).
_KINDS = {"in": 1, "out": 2, "gpu->gpu": 3}


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


def _python_runs(pairs: list) -> list:
    """``[s0, d0, length]`` runs of a short list of pairs (see contiguous_runs)."""
    runs = []
    for s, d in pairs:
        if runs and s == runs[-1][0] + runs[-1][2] and d == runs[-1][1] + runs[-1][2]:
            runs[-1][2] += 1
        else:
            runs.append([s, d, 1])
    return runs


def small_copy_list(layout, pairs: list) -> tuple[list, list, list]:
    """:func:`copy_list` for a short list of ``(s, d)`` pairs, in plain Python."""
    dsts, srcs, sizes = [], [], []
    runs = None
    for s_part, d_part in _moving(layout):
        if _packed(s_part) and _packed(d_part):
            runs = runs if runs is not None else _python_runs(pairs)
            part_runs = runs
        else:
            part_runs = [(s, d, 1) for s, d in pairs]
        for s, d, length in part_runs:
            srcs.append(s_part.ptr + s * s_part.block_stride)
            dsts.append(d_part.ptr + d * d_part.block_stride)
            sizes.append(length * s_part.block_bytes)
    return dsts, srcs, sizes


def copy_count(layout, mapping) -> tuple[int, int]:
    """How many copies the copy-engine path would issue, and the size in
    bytes of the largest, without building the copy list.  ``mapping`` is an
    ``(N, 2)`` array or a short list of pairs."""
    pairs = _moving(layout)
    packed = [_packed(s) and _packed(d) for s, d in pairs]
    n = len(mapping)
    runs, longest = n, 1
    if any(packed):
        if isinstance(mapping, list):
            r = _python_runs(mapping)
            runs, longest = len(r), max(x[2] for x in r)
        elif n > 1:
            step = np.diff(mapping, axis=0)
            cont = (step[:, 0] == 1) & (step[:, 1] == 1)
            runs, longest = n - int(np.count_nonzero(cont)), _longest_true_run(cont) + 1
    copies = sum(runs if p else n for p in packed)
    largest = max(((longest if p else 1) * s.block_bytes for p, (s, _) in zip(packed, pairs)), default=0)
    return copies, largest


def _longest_true_run(flags: np.ndarray) -> int:
    if not flags.any():
        return 0
    padded = np.concatenate(([False], flags, [False])).astype(np.int8)
    edges = np.flatnonzero(np.diff(padded))
    return int((edges[1::2] - edges[::2]).max())


_CU_MEMCPY_SRC_ACCESS_ORDER_STREAM = 1


def batch_available() -> bool:
    """True when the driver exports ``cuMemcpyBatchAsync``."""
    return memcpy_batch()[0] is not None


class DmaCopier:
    """Issues a swap's copies on the copy engines."""

    def __init__(self):
        self._attrs = MemcpyAttributes(srcAccessOrder=_CU_MEMCPY_SRC_ACCESS_ORDER_STREAM)
        self._attr_idx = (ctypes.c_size_t * 1)(0)
        self._fail = ctypes.c_size_t(0)
        self.use_batch = True
        self._batch = None  # (fn, takes_fail_index), loaded on first use
        self._memcpy = None

    def copy(self, layout, mapping, stream: int, capturing: bool = False) -> int:
        """Enqueue every copy of a swap on ``stream``; returns how many were
        issued.  ``mapping`` is an ``(N, 2)`` array or a short list of pairs."""
        if isinstance(mapping, list):
            dsts, srcs, sizes = small_copy_list(layout, mapping)
        else:
            dsts, srcs, sizes = copy_list(layout, mapping)
        return self.issue(dsts, srcs, sizes, stream, _KINDS[layout.direction], capturing)

    def issue(self, dsts, srcs, sizes, stream: int, kind: int, capturing: bool = False) -> int:
        """Enqueue copies ``srcs[i] -> dsts[i]`` of ``sizes[i]`` bytes on
        ``stream``: one ``cuMemcpyBatchAsync`` where possible, else one
        ``cudaMemcpyAsync`` (of memcpy ``kind``) each.  While ``stream``
        captures a graph, copies go one by one (plain memcpy nodes).

        Parameters
        ----------
        dsts, srcs, sizes : numpy.ndarray of uint64, or lists of int
            Each of shape (C,).
        """
        if self._memcpy is None:
            from cupy.cuda import runtime

            self._memcpy = runtime.memcpyAsync
            self._batch = memcpy_batch()
        count = len(sizes)
        fn, takes_fail = self._batch if self.use_batch else (None, False)
        if fn is not None and count > 1 and stream != 0 and not capturing:
            if isinstance(dsts, list):
                dsts, srcs, sizes = (np.array(x, dtype=np.uint64) for x in (dsts, srcs, sizes))
            args = [dsts.ctypes.data, srcs.ctypes.data, sizes.ctypes.data, count]
            args += [ctypes.addressof(self._attrs), ctypes.addressof(self._attr_idx), 1]
            if takes_fail:
                args.append(ctypes.addressof(self._fail))
            status = fn(*args, stream)
            if status != 0:
                failed = f", first failing copy {self._fail.value}" if takes_fail else ""
                raise RuntimeError(
                    f"cuMemcpyBatchAsync: expected CUDA_SUCCESS for {count} copies, got CUresult {status}{failed}"
                )
            return count
        if not isinstance(dsts, list):
            dsts, srcs, sizes = dsts.tolist(), srcs.tolist(), sizes.tolist()
        for dst, src, size in zip(dsts, srcs, sizes):
            self._memcpy(dst, src, size, kind, stream)
        return count
