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
too.  :func:`prewarm` takes the first of those waits where a wait is
harmless, at a swapper's construction (:data:`PREWARM_EXECS` executables,
made and destroyed once per process and GPU): a warm op's longest call
while builds ran on a busy device fell from 291.7 ms to 191 µs.  Slot
graphs stay below that mark (:func:`reserve`: an op past it launches
plainly), but graphs the application instantiates after the prewarm count
too, and the reserve's safety is not yet shown by a soak: graphs are opt-in.
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
# Executables made and destroyed by prewarm(), and the most slot graphs alive
# at once on a GPU (reserve()): 16 rings of the default 16 slots.
PREWARM_EXECS = 256
_prewarmed: dict[int, bool] = {}  # GPU -> prewarm succeeded
_live: dict[int, int] = {}  # GPU -> slot executables reserved (built or being built)
_prewarm_lock = threading.Lock()


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
    driver's one wait for the device happens here, in the caller's thread,
    and not in a build.  False, with one warning, where that failed: slot
    graphs stay off on ``device``."""
    with _prewarm_lock:
        done = _prewarmed.get(device)
        if done is not None:
            return done
        built: list = []
        with capture.relaxed():  # legal while another thread captures
            try:
                for _ in range(PREWARM_EXECS):
                    built.append(kernel_graph(fn, 1, 32, 0, args_ptr))
            except Exception as e:
                warnings.warn(f"cupy_swap: slot graphs off on GPU {device}: {e}", stacklevel=3)
            finally:
                destroy_graphs(device, built)
        done = _prewarmed[device] = len(built) == PREWARM_EXECS
        return done


def reserve(device: int, n: int) -> bool:
    """Room for ``n`` more slot executables on ``device`` below the mark its
    prewarm set (so no build of ours passes it and waits for the device);
    False where there is none or no prewarm succeeded: the op stays on
    plain launches.  :func:`unreserve` gives the room back."""
    with _prewarm_lock:
        live = _live.get(device, 0)
        if not _prewarmed.get(device) or live + n > PREWARM_EXECS:
            return False
        _live[device] = live + n
        return True


def unreserve(device: int, n: int) -> None:
    with _prewarm_lock:
        _live[device] = _live.get(device, 0) - n


def destroy_slot_graphs(device: int, graphs: list) -> None:
    """The releaser's half of a dropped op (after its gate): its graphs, and
    their room below the mark."""
    try:
        destroy_graphs(device, graphs)
    finally:
        unreserve(device, len(graphs))


def destroy_graphs(device: int, graphs: list) -> None:
    """Destroy ``(graph, exec)`` pairs (none: no CUDA call)."""
    if not graphs:
        return  # never built: no CUDA call
    from cupy.cuda import runtime

    runtime.setDevice(device)
    for graph, exec_ in graphs:
        runtime.graphExecDestroy(exec_)
        runtime.graphDestroy(graph)


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
