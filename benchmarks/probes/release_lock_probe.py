"""Does a release that waits for the GPU hold up other threads' calls?

A 1 s spin kernel is queued on one stream; a second thread then makes a call
that waits for the queued work (``cudaFreeHost``, ``cudaHostUnregister``,
or the register/unregister pair of a private page that the library's
releaser uses).  While it waits, the main thread times the calls a swap and
its caller make, on another stream.  A call that takes ~1 s was blocked.

    python benchmarks/probes/release_lock_probe.py
"""

import functools
import threading
import time

import cupy as cp
import numpy as np
from cupy.cuda import runtime
from free_host_probe import PORTABLE_MAPPED, SPIN  # this folder is on sys.path when run as a script

from cupy_swap.cuda.memory import wait_for_gpus_in_use


def main() -> None:
    kernel = cp.RawKernel(SPIN, "spin")
    busy, other = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    kernel((1,), (1,), (np.uint64(1),), stream=busy)
    src = cp.cuda.alloc_pinned_memory(4096)
    dst = cp.empty(4096, cp.uint8)
    other.begin_capture()
    kernel((1,), (1,), (np.uint64(1),), stream=other)
    graph = other.end_capture()
    cp.cuda.Device().synchronize()

    import cupy_swap as cs

    existing = cp.cuda.Event(disable_timing=True)
    sw = cs.BlockSwapper(max_blocks=16)
    host, gpu = cs.zeros_pinned((16, 4096), np.uint8), cp.zeros((16, 4096), cp.uint8)
    op = sw.prepare(host, gpu)
    rows = np.array([[1, 2], [3, 4]])
    waits = {"stream": other, "cupy event": other.record()}
    try:
        import torch

        tev = torch.cuda.Event()
        tev.record(torch.cuda.ExternalStream(other.ptr))
        waits["torch event"] = tev
    except ImportError:
        pass
    op(rows, stream=other).synchronize()
    calls = {
        "event create": lambda: cp.cuda.Event(disable_timing=True),
        "event record (existing event)": lambda: runtime.eventRecord(existing.ptr, other.ptr),
        "event query": lambda: runtime.eventQuery(existing.ptr),
        "stream wait event": lambda: runtime.streamWaitEvent(other.ptr, existing.ptr, 0),
        **{
            f"op call, wait_for {k}": functools.partial(op, rows, stream=other, wait_for=w)
            for k, w in waits.items()
        },
        "event record (CuPy's stream.record: create + record)": lambda: other.record(),
        "cudaMemcpyAsync 4 KiB": lambda: runtime.memcpyAsync(dst.data.ptr, src.ptr, 4096, 1, other.ptr),
        "kernel launch": lambda: kernel((1,), (1,), (np.uint64(1),), stream=other),
        "graph launch": lambda: graph.launch(other),
        "stream query": lambda: other.done,
        "pointer attributes": lambda: runtime.pointerGetAttributes(src.ptr),
        "cudaHostAlloc 8 B": lambda: runtime.freeHost(runtime.hostAlloc(8, PORTABLE_MAPPED)),
    }
    for name, make in (
        (
            "cudaFreeHost",
            lambda: functools.partial(runtime.freeHost, runtime.hostAlloc(1 << 20, PORTABLE_MAPPED)),
        ),
        ("cudaHostUnregister", None),
        ("the library's page wait", lambda: wait_for_gpus_in_use),
    ):
        if name == "cudaHostUnregister":
            buf = np.zeros(1 << 20, np.uint8)
            runtime.hostRegister(buf.ctypes.data, buf.nbytes, PORTABLE_MAPPED)
            blocker = lambda b=buf: runtime.hostUnregister(b.ctypes.data)  # noqa: E731
        else:
            blocker = make()
        kernel((1,), (1,), (np.uint64(1e9),), stream=busy)
        t = threading.Thread(target=blocker)
        t.start()
        time.sleep(0.05)
        line = []
        for call_name, call in calls.items():
            start = time.perf_counter()
            call()
            line.append(f"{call_name} {(time.perf_counter() - start) * 1e3:.2f} ms")
        t.join()
        other.synchronize()
        print(f"{name} waiting on another thread: " + "; ".join(line), flush=True)


if __name__ == "__main__":
    main()
