"""The few CUDA driver entry points CuPy does not wrap, called through ctypes:
``cuMemcpyBatchAsync`` and the primary-context listing."""

from __future__ import annotations

import ctypes
import functools

# Loaders run once per process (two threads racing get equivalent handles).


@functools.cache
def libcuda():
    """``libcuda.so.1`` as a ctypes library, or None where it cannot load."""
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None


_CUDA_ERROR_NOT_INITIALIZED = 3


def devices_in_use() -> list[int]:
    """The GPUs whose primary context is active in this process (every GPU
    used here); empty without a driver or before it is initialized.  Any
    other driver error raises RuntimeError: a caller that frees memory must
    not take "no GPU" for an answer it did not get."""
    lib = libcuda()
    if lib is None:
        return []
    count = ctypes.c_int()
    status = lib.cuDeviceGetCount(ctypes.byref(count))
    if status == _CUDA_ERROR_NOT_INITIALIZED:
        return []
    used = []
    for ordinal in range(count.value if status == 0 else 0):
        device, flags, active = ctypes.c_int(), ctypes.c_uint(), ctypes.c_int()
        status = lib.cuDeviceGet(ctypes.byref(device), ordinal) or lib.cuDevicePrimaryCtxGetState(
            device, ctypes.byref(flags), ctypes.byref(active)
        )
        if status != 0:
            break
        if active.value:
            used.append(ordinal)
    if status != 0:
        raise RuntimeError(f"expected the driver to list the GPUs in use, got CUDA error {status}")
    return used


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


@functools.cache
def memcpy_batch():
    """``(function, takes_fail_index)``: ``cuMemcpyBatchAsync_v2`` (CUDA 13) or
    ``cuMemcpyBatchAsync`` (12.8, with a failure index), or ``(None, False)``."""
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
    return found


def load_function(fn: int) -> None:
    """Finish loading kernel ``fn`` now (``cuFuncLoad``, CUDA 12.4 and later
    drivers; elsewhere nothing: the attribute call that follows loads it).

    Raises
    ------
    RuntimeError
        The driver refused."""
    load = _func_load()
    if load is not None:
        status = load(fn)
        if status:
            raise RuntimeError(f"cuFuncLoad: expected CUDA_SUCCESS, got CUresult {status}")


@functools.cache
def _func_load():
    lib = libcuda()
    fn = getattr(lib, "cuFuncLoad", None) if lib is not None else None
    if fn is not None:
        fn.argtypes, fn.restype = [ctypes.c_void_p], ctypes.c_int
    return fn


@functools.cache
def _wait_value64():
    """``cuStreamWaitValue64_v2`` (any CUDA 12 or later device), else the
    unversioned symbol, or None."""
    lib = libcuda()
    for name in ("cuStreamWaitValue64_v2", "cuStreamWaitValue64"):
        fn = getattr(lib, name, None) if lib is not None else None
        if fn is not None:
            fn.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint]
            fn.restype = ctypes.c_int
            return fn
    return None


def stream_wait_geq(stream: int, address: int, value: int) -> None:
    """Enqueue on ``stream`` a wait until the int64 at device ``address`` is
    at least ``value`` (``cuStreamWaitValue64``, ``CU_STREAM_WAIT_VALUE_GEQ``:
    the GPU polls, the host does not wait).  Capturable.

    Raises
    ------
    RuntimeError
        No driver with stream memory operations, or the driver refused."""
    fn = _wait_value64()
    if fn is None:
        raise RuntimeError("cuStreamWaitValue64: libcuda or the symbol could not be loaded")
    status = fn(stream, address, value, 0)  # 0: CU_STREAM_WAIT_VALUE_GEQ
    if status:
        raise RuntimeError(f"cuStreamWaitValue64: expected CUDA_SUCCESS, got CUresult {status}")
