"""The few CUDA driver entry points CuPy does not wrap, called through ctypes:
``cuMemcpyBatchAsync``, the calls that build a one-kernel graph and set its
node's parameters, and the primary-context listing."""

from __future__ import annotations

import ctypes
import functools
from typing import NamedTuple

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


class KernelNodeParams(ctypes.Structure):
    """``CUDA_KERNEL_NODE_PARAMS`` in the layout the unversioned driver
    symbols below take (the ``_v2`` ones add two fields)."""

    _fields_ = [
        ("func", ctypes.c_void_p),
        ("gridDimX", ctypes.c_uint),
        ("gridDimY", ctypes.c_uint),
        ("gridDimZ", ctypes.c_uint),
        ("blockDimX", ctypes.c_uint),
        ("blockDimY", ctypes.c_uint),
        ("blockDimZ", ctypes.c_uint),
        ("sharedMemBytes", ctypes.c_uint),
        ("kernelParams", ctypes.c_void_p),
        ("extra", ctypes.c_void_p),
    ]


class GraphCalls(NamedTuple):
    create: object  # cuGraphCreate(CUgraph*, flags)
    add_kernel_node: object  # cuGraphAddKernelNode(CUgraphNode*, graph, deps, n_deps, params*)
    set_params: object  # cuGraphExecKernelNodeSetParams(exec, node, params*), c_void_p arguments


_GRAPH_SYMBOLS = ("cuGraphCreate", "cuGraphAddKernelNode", "cuGraphExecKernelNodeSetParams")


@functools.cache
def graph_calls() -> GraphCalls | None:
    """The driver calls of :class:`cupy_swap.cuda.launcher.KernelNode`, or
    None where ``libcuda`` cannot be loaded or lacks one of them."""
    lib = libcuda()
    if lib is None or not all(hasattr(lib, name) for name in _GRAPH_SYMBOLS):
        return None
    ptr = ctypes.c_void_p
    create, add, set_params = (getattr(lib, name) for name in _GRAPH_SYMBOLS)
    create.argtypes = [ptr, ctypes.c_uint]
    add.argtypes = [ptr, ptr, ptr, ctypes.c_size_t, ptr]
    # cuGraphExecKernelNodeSetParams runs on every eager kernel swap: no
    # argtypes, so ctypes passes the caller's prebuilt c_void_p objects
    # through without converting Python ints.
    for fn in (create, add, set_params):
        fn.restype = ctypes.c_int
    return GraphCalls(create, add, set_params)
