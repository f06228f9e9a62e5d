"""The few CUDA driver entry points CuPy does not wrap, called through ctypes
(no compiled extension, no extra dependency): ``cuMemcpyBatchAsync``.
(Stream-capture status comes from CuPy's ``streamIsCapturing``, a quarter
of the ctypes call's host time: :func:`cupy_swap.cuda.streams.stream_is_capturing`.)"""

from __future__ import annotations

import ctypes
import threading

__all__ = ["libcuda", "memcpy_batch"]

_lock = threading.Lock()
_lib: list = []


def libcuda():
    """``libcuda.so.1`` as a ctypes library, or None where it cannot load."""
    with _lock:
        if not _lib:
            try:
                _lib.append(ctypes.CDLL("libcuda.so.1"))
            except OSError:
                _lib.append(None)
        return _lib[0]


class MemcpyAttributes(ctypes.Structure):
    """``CUmemcpyAttributes`` (CUDA 12.8+)."""

    _fields_ = [
        ("srcAccessOrder", ctypes.c_int),
        ("srcLocHint_type", ctypes.c_int),
        ("srcLocHint_id", ctypes.c_int),
        ("dstLocHint_type", ctypes.c_int),
        ("dstLocHint_id", ctypes.c_int),
        ("flags", ctypes.c_uint),
    ]


_batch: list = []


def memcpy_batch():
    """``(function, takes_fail_index)`` for ``cuMemcpyBatchAsync`` in its
    CUDA 13 form (``_v2``, no failure index) or its CUDA 12.8 form (with
    one); ``(None, False)`` where the driver has neither."""
    with _lock:
        if _batch:
            return _batch[0]
    lib = libcuda()
    found = (None, False)
    if lib is not None:
        ptr, size = ctypes.c_void_p, ctypes.c_size_t
        for name, takes_fail in (("cuMemcpyBatchAsync_v2", False), ("cuMemcpyBatchAsync", True)):
            fn = getattr(lib, name, None)
            if fn is None:
                continue
            fn.argtypes = [ptr, ptr, ptr, size, ptr, ptr, size] + ([ptr] if takes_fail else []) + [ptr]
            fn.restype = ctypes.c_int
            found = (fn, takes_fail)
            break
    with _lock:
        if not _batch:
            _batch.append(found)
        return _batch[0]
