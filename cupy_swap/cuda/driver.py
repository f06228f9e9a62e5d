"""The few CUDA driver entry points CuPy does not wrap, called through ctypes
(no compiled extension, no extra dependency): ``cuMemcpyBatchAsync`` and
the three calls that build a one-kernel graph and set its node's parameters.
(Stream-capture status comes from CuPy's ``streamIsCapturing``, a quarter
of the ctypes call's host time: :func:`cupy_swap.cuda.streams.stream_is_capturing`.)"""

from __future__ import annotations

import ctypes
import threading
from typing import NamedTuple

__all__ = ["libcuda", "memcpy_batch", "KernelNodeParams", "graph_calls"]

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


_graph: list = []


def graph_calls() -> GraphCalls | None:
    """The driver calls of :class:`cupy_swap.cuda.launcher.KernelNode`, or
    None where ``libcuda`` cannot be loaded."""
    with _lock:
        if _graph:
            return _graph[0]
    lib = libcuda()
    calls = None
    if lib is not None:
        ptr = ctypes.c_void_p
        create, add, set_params = (
            lib.cuGraphCreate,
            lib.cuGraphAddKernelNode,
            lib.cuGraphExecKernelNodeSetParams,
        )
        create.argtypes = [ptr, ctypes.c_uint]
        add.argtypes = [ptr, ptr, ptr, ctypes.c_size_t, ptr]
        # cuGraphExecKernelNodeSetParams runs on every eager kernel swap: no
        # argtypes, so ctypes passes the caller's prebuilt c_void_p objects
        # through without converting Python ints.
        for fn in (create, add, set_params):
            fn.restype = ctypes.c_int
        calls = GraphCalls(create, add, set_params)
    with _lock:
        if not _graph:
            _graph.append(calls)
        return _graph[0]
