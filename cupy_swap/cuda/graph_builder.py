"""Slot graphs, built off the call path.

**Invariant.**  No swap call builds a graph: building one can wait for the
whole device (``benchmarks/NOTES.md`` item 61: a build returned after 298 ms,
when another stream's work ended).  An op's slot launches go through
``cuLaunchKernel`` until its graphs exist.  Slot graphs are opt-in
(``CUPY_SWAP_SLOT_GRAPHS=1``): after :data:`BUILD_AFTER` calls
the builder thread (relaxed capture mode, like the releaser) builds one
single-kernel graph per ring slot, each with that slot's parameter, and
publishes them together; a call then launches its slot's graph
(``cudaGraphLaunch``: 1.40 µs of host time against 4.15 for
``cuLaunchKernel`` of the same parameter on the H200's host).  A graph is
destroyed by the releaser, after the op's last launch of it finished.
A build that fails leaves the op on ``cuLaunchKernel`` for good, with one
warning.

**Where builds wait.**  The driver waits for the whole device whenever a
process's live graph executables pass a new high-water mark (NOTES 71-72:
in a fresh process the 34th instantiate waited 2 s for another stream's
spin; after 256 made and destroyed while idle, the 290th did; after 1,024,
1,024 more never waited), and while it waits other threads' launches wait
too.  :func:`prewarm` pays the first of those waits at a swapper's
construction (:data:`PREWARM_EXECS` executables, made and destroyed once
per process and GPU), not in a build: a warm op's longest call while
builds ran on a busy device fell from 291.7 ms to 191 µs.  Slot graphs
stay within that many (:func:`reserve`: an op past it launches plainly and
asks again later), but graphs the application instantiates count too, and
the reserve is not yet shown by a soak: graphs are opt-in.
"""

from __future__ import annotations

import ctypes
import functools
import os
import queue
import threading
import warnings
import weakref

from . import capture
from .driver import libcuda

# Calls of an op before its graphs are built (ops called once or twice, a
# fresh view's swap(), never pay for graphs); 0: never, the default.  A graph
# launch saves 2.2-4.0 µs a call (NOTES 68), but the driver waits for the
# device whenever live executables pass a new high-water mark (NOTES 72):
# slot graphs are opt-in (CUPY_SWAP_SLOT_GRAPHS=1).
BUILD_AFTER = 8 if os.environ.get("CUPY_SWAP_SLOT_GRAPHS") == "1" else 0
# Executables made and destroyed by prewarm(), and the most slot graphs of
# this process alive at once (reserve()): 16 rings of the default 16 slots.
PREWARM_EXECS = 256
# Calls a refused op makes before it asks for graphs again (room may be back).
RETRY_AFTER = 1024
_prewarmed: dict[int, bool] = {}  # GPU -> prewarm succeeded
_prewarm_lock = threading.Lock()  # one prewarm at a time (it may wait for a GPU)
# Slot executables of this process reserved: built, being built or not yet
# destroyed.  Per process, not per GPU: the mark was measured per process.
_live = [0]
_live_lock = threading.Lock()


def _after_fork_in_child() -> None:
    # A fork while another thread held a lock would leave the child a held lock.
    global _prewarm_lock, _live_lock
    _prewarm_lock, _live_lock = threading.Lock(), threading.Lock()
    builder._lock = threading.Lock()  # its thread is gone too: _ensure_thread starts another


os.register_at_fork(after_in_child=_after_fork_in_child)


class KernelNodeParams(ctypes.Structure):
    """``CUDA_KERNEL_NODE_PARAMS`` in the layout the unversioned driver
    symbols take (the ``_v2`` ones add two fields)."""

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


@functools.cache
def _graph_calls() -> tuple | None:
    """``(cuCtxGetCurrent, cuGraphCreate, cuGraphAddKernelNode)`` or None
    where libcuda cannot be loaded or lacks them."""
    lib = libcuda()
    names = ("cuCtxGetCurrent", "cuGraphCreate", "cuGraphAddKernelNode")
    if lib is None or not all(hasattr(lib, name) for name in names):
        return None
    ptr = ctypes.c_void_p
    current, create, add = (getattr(lib, name) for name in names)
    current.argtypes, current.restype = [ptr], ctypes.c_int
    create.argtypes, create.restype = [ptr, ctypes.c_uint], ctypes.c_int
    add.argtypes, add.restype = [ptr, ptr, ptr, ctypes.c_size_t, ptr], ctypes.c_int
    return current, create, add


def kernel_graph(fn: int, grid: int, threads: int, smem: int, args_ptr: int) -> tuple[int, int]:
    """``(graph, exec)``: a graph of one launch of ``fn`` (``smem`` bytes of
    dynamic shared memory), instantiated.  The driver copies the parameter
    (``args_ptr``, a ``void**``) when the node is made."""
    from cupy.cuda import runtime

    calls = _graph_calls()
    if calls is None:
        raise RuntimeError("kernel graphs: libcuda or its graph calls could not be loaded")
    current, create, add = calls
    context = ctypes.c_void_p()
    if current(ctypes.byref(context)) or not context.value:  # the node call crashes without one
        raise RuntimeError("kernel graphs: no CUDA context is current in this thread")
    params = KernelNodeParams(fn, grid, 1, 1, threads, 1, 1, smem, args_ptr, None)
    graph, node = ctypes.c_void_p(), ctypes.c_void_p()
    status = create(ctypes.byref(graph), 0)
    if status:
        raise RuntimeError(f"cuGraphCreate: expected CUDA_SUCCESS, got CUresult {status}")
    try:
        status = add(ctypes.byref(node), graph, None, 0, ctypes.byref(params))
        if status:
            raise RuntimeError(f"cuGraphAddKernelNode: expected CUDA_SUCCESS, got CUresult {status}")
        return graph.value, runtime.graphInstantiate(graph.value)
    except BaseException:
        runtime.graphDestroy(graph.value)
        raise


def prewarm(device: int, fn: int, args_ptr: int) -> bool:
    """Once per process and GPU (later calls return the first answer): make
    :data:`PREWARM_EXECS` executables of one launch of ``fn`` (its parameter
    at ``args_ptr``; never launched), then destroy them, so that the
    driver's first wait for the device (past about 32 live executables) is
    paid here, at a swapper's construction, not by a build; other threads'
    launches still wait meanwhile.  False, with one warning, where that
    failed: slot graphs stay off on ``device``."""
    with _prewarm_lock:
        done = _prewarmed.get(device)
        if done is not None:
            return done
        built: list = []
        error = None
        with capture.relaxed():  # legal while another thread captures
            try:
                for _ in range(PREWARM_EXECS):
                    built.append(kernel_graph(fn, 1, 32, 0, args_ptr))
            except Exception as e:
                error = e
            left = destroy_graphs(device, built)
        done = _prewarmed[device] = error is None and not left
    if not done:  # recorded first: a warning made an error (-W error) leaves no half state
        why = error or f"{left} of its executables could not be destroyed"
        warnings.warn(f"cupy_swap: slot graphs off on GPU {device}: {why}", stacklevel=3)
    return done


def reserve(device: int, n: int) -> bool:
    """Room for ``n`` more slot executables of this process within the
    :data:`PREWARM_EXECS` the prewarm made; False where there is none or
    ``device``'s prewarm failed: the op stays on plain launches (graphs the
    application instantiates count against the driver's mark too, so room
    here is no promise).  :func:`unreserve` gives the room back."""
    if not _prewarmed.get(device):
        return False
    with _live_lock:
        if _live[0] + n > PREWARM_EXECS:
            return False
        _live[0] += n
        return True


def unreserve(n: int) -> None:
    """Give back room for ``n`` slot executables (destroyed, or never built)."""
    with _live_lock:
        _live[0] -= n


def destroy_slot_graphs(device: int, graphs: list) -> None:
    """The releaser's half of a dropped op (after its gate): its graphs, and
    the room of those destroyed.  Raises where some could not be destroyed
    (the releaser warns; they stay allocated and keep their room)."""
    left = destroy_graphs(device, graphs)
    unreserve(len(graphs) - left)
    if left:
        raise RuntimeError(f"{left} of {len(graphs)} slot graphs could not be destroyed")


def destroy_graphs(device: int, graphs: list) -> int:
    """Destroy ``(graph, exec)`` pairs (none: no CUDA call); how many could
    not be."""
    if not graphs:
        return 0
    from cupy.cuda import runtime

    runtime.setDevice(device)
    left = 0
    for graph, exec_ in graphs:
        try:
            runtime.graphExecDestroy(exec_)
            runtime.graphDestroy(graph)
        except Exception:
            left += 1
    return left


class Builder:
    """One thread that builds the slot graphs of the ops :meth:`request`
    names, one op at a time, in relaxed capture mode."""

    def __init__(self):
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def request(self, bound) -> None:
        """Build ``bound``'s graphs soon (``bound.build_graphs()`` on the
        builder thread; a dropped op is skipped)."""
        self._queue.put(weakref.ref(bound))
        self._ensure_thread()

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until every request made before this call was served."""
        done = threading.Event()
        self._queue.put(done.set)
        self._ensure_thread()
        return done.wait(timeout)

    def _ensure_thread(self) -> None:
        thread = self._thread
        if thread is None or not thread.is_alive():  # first use, or after a fork
            with self._lock:
                if self._thread is None or not self._thread.is_alive():
                    self._thread = threading.Thread(target=self._run, name="cupy_swap-graphs", daemon=True)
                    self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if not isinstance(item, weakref.ref):
                item()  # a drain marker
                continue
            bound = item()
            if bound is None:
                continue
            try:
                with capture.relaxed():  # legal while another thread captures
                    bound.build_graphs()
            except Exception as e:  # the op stays on cuLaunchKernel
                warnings.warn(
                    f"cupy_swap: slot graphs could not be built ({e}); launches stay plain", stacklevel=1
                )
            del bound, item  # this thread must not keep a dropped op alive


builder = Builder()
