"""Which release calls are legal while another thread captures a CUDA graph?

The main thread captures one kernel on a non-blocking stream (CuPy's default
capture mode); meanwhile a second thread, in relaxed capture mode as
cupy_swap's releaser is, makes one call.  Printed per call: whether the call
succeeded, and whether the capture survived (its graph then runs and
computes the right value).  A last line tries allocation and a private-
stream memset on the capturing thread itself, in relaxed mode, as
``GraphSwap`` and captured descriptor swaps do.

    python benchmarks/probes/capture_probe.py
"""

import threading

import cupy as cp
import numpy as np
from cupy.cuda import runtime

from cupy_swap.cuda import capture

_NON_BLOCKING = 1
_PORTABLE_MAPPED = 3


def _outcome(fn) -> str:
    try:
        fn()
        return "ok"
    except Exception as e:
        return repr(e)[:120]


def attempt(name: str, fn) -> None:
    """Run ``fn`` on another thread while this thread captures."""
    stream = cp.cuda.Stream(non_blocking=True)
    a = cp.zeros(16, cp.float32)
    cp.cuda.Device().synchronize()
    result = {}
    started, finished = threading.Event(), threading.Event()

    def other():
        with capture.relaxed():
            started.wait()
            result["call"] = _outcome(fn)
        finished.set()

    t = threading.Thread(target=other)
    t.start()
    stream.begin_capture()
    with stream:
        a += 1
    started.set()
    finished.wait(20)

    def replay():
        graph = stream.end_capture()
        graph.launch(stream)
        stream.synchronize()
        if float(a[0]) != 1.0:
            raise AssertionError(f"bad value {float(a[0])}")

    result["capture"] = _outcome(replay)
    t.join()
    print(f"{name:28s} call={result.get('call')}  capture={result.get('capture')}", flush=True)


def same_thread() -> None:
    """Allocation and a private-stream memset on the capturing thread."""
    stream = cp.cuda.Stream(non_blocking=True)
    a = cp.zeros(4, cp.float32)
    cp.cuda.Device().synchronize()
    stream.begin_capture()
    with stream:
        a += 1

    def allocate():
        with capture.relaxed():
            runtime.hostAlloc(4096, _PORTABLE_MAPPED)
            d = runtime.malloc(4096)
            private = runtime.streamCreateWithFlags(_NON_BLOCKING)
            runtime.memsetAsync(d, 0, 4096, private)
            runtime.streamSynchronize(private)
            runtime.streamDestroy(private)

    call = _outcome(allocate)

    def replay():
        stream.end_capture().launch(stream)
        stream.synchronize()

    print(f"{'same-thread alloc+memset':28s} call={call}  capture={_outcome(replay)}")


def main() -> None:
    pinned = runtime.hostAlloc(1 << 20, _PORTABLE_MAPPED)
    attempt("cudaFreeHost", lambda: runtime.freeHost(pinned))
    registered = np.zeros(1 << 20, np.uint8)
    runtime.hostRegister(registered.ctypes.data, registered.nbytes, _PORTABLE_MAPPED)
    attempt("cudaHostUnregister", lambda: runtime.hostUnregister(registered.ctypes.data))
    device = runtime.malloc(1 << 20)
    attempt("cudaFree", lambda: runtime.free(device))
    attempt("cudaDeviceSynchronize", runtime.deviceSynchronize)
    event = cp.cuda.Event()
    event.record(cp.cuda.Stream(non_blocking=True))
    attempt("cudaEventSynchronize", event.synchronize)
    attempt("cudaMalloc", lambda: runtime.free(runtime.malloc(1 << 20)))
    same_thread()


if __name__ == "__main__":
    main()
