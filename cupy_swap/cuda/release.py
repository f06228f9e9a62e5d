"""Memory the library allocates goes back only after the GPU work that
touches it has completed, and never inside a swap.

An owner hands its memory over with :func:`defer` when it is closed or
garbage-collected: a *gate* (blocks until the GPU work that may touch the
memory has completed) and a *release* (frees it).  One daemon thread, the
releaser, runs them in order, so a finalizer only enqueues
(``SimpleQueue.put`` is safe anywhere), nothing waits inside a swap, and the
releaser's *relaxed* capture mode keeps another thread's capture valid.  A
failed release is reported (``RuntimeWarning``).  Memory a captured graph
reads is kept for the life of the process instead (:func:`keep_for_process`).
"""

from __future__ import annotations

import atexit
import collections
import os
import queue
import sys
import threading
import warnings
import weakref

from . import capture

_queue: queue.SimpleQueue = queue.SimpleQueue()
_start_lock = threading.Lock()
_thread: list = []
_kept: list = []  # memory read by captured graphs: lives until the process exits
# The last failed releases, ``(what, exception)``, newest last (also warned).
failures: collections.deque = collections.deque(maxlen=32)

_CUDA_ERROR_MEMORY_ALLOCATION = 2  # cudaErrorMemoryAllocation


def defer(release, gate=None, what: str = "memory") -> None:
    """Queue ``gate()`` then ``release()`` for the releaser thread (which
    owners :func:`start` when they allocate); ``what`` names the memory in a
    failure report.  Safe in a finalizer: it only enqueues."""
    _queue.put((release, gate, what))


def when_dropped(owner, release, gate=None, what: str = "memory") -> weakref.finalize:
    """Arrange :func:`defer` ``(release, gate, what)`` for when ``owner`` is
    garbage-collected; call the returned finalizer to do it earlier (once)."""
    return finalizer(owner, defer, release, gate, what)


def finalizer(owner, fn, *args) -> weakref.finalize:
    """``weakref.finalize`` not run at exit (unpinning a large pool there
    would only delay it)."""
    f = weakref.finalize(owner, fn, *args)
    f.atexit = False
    return f


def start() -> None:
    """Start the releaser thread (once per process and forked child)."""
    if _thread and _thread[0].is_alive():
        return
    with _start_lock:
        if not (_thread and _thread[0].is_alive()):
            _thread.clear()
            t = threading.Thread(target=_run, args=(_queue,), name="cupy_swap-releaser", daemon=True)
            t.start()
            _thread.append(t)


def drain(timeout: float | None = None) -> bool:
    """Wait until everything deferred before this call has been released;
    False when ``timeout`` seconds passed first."""
    start()
    done = threading.Event()
    _queue.put((done.set, None, None))
    return done.wait(timeout)


def keep_for_process(obj) -> None:
    """Keep ``obj`` (memory a captured graph reads) until the process exits."""
    _kept.append(obj)


def device_malloc(nbytes: int, device: int) -> int:
    """``cudaMalloc`` on ``device``, outside CuPy's stream-ordered pool (whose
    blocks queued work may still use); free it with :func:`device_free`.
    When the device is full, CuPy's pool gives back its cached blocks and the
    allocation is tried once more; then ``OutOfMemoryError``."""
    import cupy
    from cupy.cuda import runtime

    from .streams import on_device

    start()
    size = max(int(nbytes), 1)
    with on_device(device), capture.relaxed():
        for attempt in range(2):
            try:
                return runtime.malloc(size)
            except runtime.CUDARuntimeError as e:
                if e.status != _CUDA_ERROR_MEMORY_ALLOCATION:
                    raise
                if attempt == 0:
                    cupy.get_default_memory_pool().free_all_blocks()
        free, total = runtime.memGetInfo()
        raise cupy.cuda.memory.OutOfMemoryError(size, free, total)


def device_free(ptr: int, device: int) -> None:
    """``cudaFree`` on ``device``; called on the releaser thread only, which
    makes the device current and leaves it so (restoring the thread's first
    device would create a context on GPU 0 in a process that never used it)."""
    from cupy.cuda import runtime

    runtime.setDevice(device)
    runtime.free(ptr)


def _run(work: queue.SimpleQueue) -> None:
    relaxed = [False]
    while True:
        try:
            _release_next(work, relaxed)
        except BaseException:  # never let the releaser die: drain() would wait for good
            pass


def _release_next(work: queue.SimpleQueue, relaxed: list) -> None:
    release, gate, what = work.get()
    if not relaxed[0]:
        # Frees and gate waits here never break another thread's capture.  Set
        # once it takes: the thread may start before CUDA is initialized, and
        # the driver refuses the call until then; something to release means
        # CUDA is up.
        relaxed[0] = capture.exchange(capture.RELAXED) is not None
    try:
        if gate is not None:
            gate()
        release()
    except Exception as e:
        failures.append((what, e))
        if not sys.is_finalizing():
            warnings.warn(
                f"cupy_swap: could not release {what} ({type(e).__name__}: {e}); it stays allocated",
                RuntimeWarning,
                stacklevel=1,
            )


def _after_fork_in_child() -> None:
    # The releaser thread does not survive a fork: start afresh in the child
    # (a release queued but not run stays with the parent, which owns it).
    global _queue
    _queue = queue.SimpleQueue()
    _thread.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


@atexit.register
def _drain_at_exit() -> None:
    # Releases queued by drops during the program's last steps run while
    # CUDA is still up; a bounded wait, so a stuck GPU cannot hang the exit.
    if _thread:
        drain(timeout=10.0)
