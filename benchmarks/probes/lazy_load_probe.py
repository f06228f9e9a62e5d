"""Does loading a kernel wait for the GPU's queued work?  (NOTES 74: the
late-check test hung in 20 of 20 fresh processes; the suspect is CUDA's
lazy loading, where a first load may synchronize the context.)

In a fresh process: a kernel that waits for a host flag (at most LIMIT_S)
holds stream A; then, timed, on the main thread: ``get_function`` of a
kernel of a module never used before, and its first launch on stream B with
B synchronized.  A load that waits for the device returns only when the
flag-wait ends (LIMIT_S); one that does not, in milliseconds.  The last
line compares with ``CUDA_MODULE_LOADING`` as the process was started.
Run on the GPU machine, twice:

    python benchmarks/probes/lazy_load_probe.py
    CUDA_MODULE_LOADING=EAGER python benchmarks/probes/lazy_load_probe.py
"""

from __future__ import annotations

import os
import time

import cupy as cp
import numpy as np

LIMIT_S = float(os.environ.get("LIMIT_S", "5"))
HOLD = r"""extern "C" __global__ void hold(const volatile int* flag, unsigned long long limit_ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do { __nanosleep(1000); asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now)); }
    while (*flag == 0 && now - start < limit_ns);
}"""
FRESH = r"""extern "C" __global__ void fresh(int* out) { out[threadIdx.x] = threadIdx.x; }"""


def main() -> None:
    mode = os.environ.get("CUDA_MODULE_LOADING", "(default)")
    flag_mem = cp.cuda.alloc_pinned_memory(4)
    flag = np.frombuffer(flag_mem, np.int32, 1)
    flag[0] = 0
    hold = cp.RawKernel(HOLD, "hold")
    a, b = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    module = cp.RawModule(code=FRESH)
    module.compile()  # compiled (and the module loaded) before the hold: only the kernel's load is timed
    out = cp.zeros(32, cp.int32)
    cp.cuda.Device().synchronize()
    hold((1,), (1,), (flag.ctypes.data, np.uint64(LIMIT_S * 1e9)), stream=a)
    held = cp.cuda.Event()
    held.record(a)
    t0 = time.perf_counter()
    fresh = module.get_function("fresh")
    t1 = time.perf_counter()
    fresh((1,), (32,), (out,), stream=b)
    b.synchronize()
    t2 = time.perf_counter()
    still_held = not held.done
    flag[0] = 1
    a.synchronize()
    print(
        f"CUDA_MODULE_LOADING={mode}: get_function {1e3 * (t1 - t0):.1f} ms, first launch + sync "
        f"{1e3 * (t2 - t1):.1f} ms, stream A still held after: {still_held} (hold limit {LIMIT_S:.0f} s); "
        f"result ok: {bool((out == cp.arange(32)).all())}"
    )


if __name__ == "__main__":
    main()
