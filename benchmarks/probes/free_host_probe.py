"""What does freeing pinned host memory wait for, on a machine with two GPUs?

A 1 s spin kernel is queued on a non-blocking stream of one GPU; then, with
one GPU or the other current, one call runs and is timed: ``cudaFreeHost``
of a small portable pinned buffer, ``cudaHostUnregister`` of a registered
range, and ``cudaHostAlloc``.  A call that takes ~1 s waited for the queued
spin; one that takes microseconds did not.  The library's releaser relies
on the free waiting for every GPU that may still read the memory.

    python benchmarks/probes/free_host_probe.py
"""

import time

import cupy as cp
import numpy as np
from cupy.cuda import runtime

PORTABLE_MAPPED = 3
SPIN = r"""
extern "C" __global__ void spin(unsigned long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now)); } while (now - start < ns);
}
"""


def spin(device: int, ms: float):
    with cp.cuda.Device(device):
        s = cp.cuda.Stream(non_blocking=True)
        cp.RawKernel(SPIN, "spin")((1,), (1,), (np.uint64(ms * 1e6),), stream=s)
        return s


def timed(name: str, busy: int, current: int, call) -> None:
    for d in (0, 1):
        cp.cuda.Device(d).synchronize()
    s = spin(busy, 1000)
    runtime.setDevice(current)
    t = time.perf_counter()
    call()
    dt = time.perf_counter() - t
    print(f"{name:<22} GPU {busy} busy, GPU {current} current: {dt * 1e3:8.2f} ms, spin done: {s.done}")
    s.synchronize()


def main() -> None:
    for d in (0, 1):
        spin(d, 1).synchronize()
    for busy in (0, 1):
        for current in (0, 1):
            runtime.setDevice(0)
            ptr = runtime.hostAlloc(4096, PORTABLE_MAPPED)
            timed("cudaFreeHost", busy, current, lambda p=ptr: runtime.freeHost(p))
            buf = np.zeros(1 << 20, np.uint8)
            runtime.hostRegister(buf.ctypes.data, buf.nbytes, PORTABLE_MAPPED)
            timed("cudaHostUnregister", busy, current, lambda b=buf: runtime.hostUnregister(b.ctypes.data))
            timed("cudaHostAlloc", busy, current, lambda: runtime.hostAlloc(8, PORTABLE_MAPPED))


if __name__ == "__main__":
    main()
