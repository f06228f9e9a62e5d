"""Does a slot-graph build on the builder thread hold up another thread's
swap calls while the device is busy?  (NOTES items 61 and 63: a build on the
call path once waited 298 ms for another stream's work; the builder thread
moves builds off the call path, which helps only if a stalled build does not
stall this thread's launches too.)

Run on the GPU machine from the checkout:  python benchmarks/probes/graph_build_thread.py
It keeps stream A busy for SPIN_MS, meanwhile makes fresh ops (each builds
its slot graphs on the builder thread after BUILD_AFTER calls) and times
every call of one warm op on stream B.  It prints the longest call of the
warm op with and without builds running, and how long the builds took.
"""

from __future__ import annotations

import os
import statistics
import time

# Slot graphs are opt-in (NOTES 68); this probe measures them.
os.environ.setdefault("CUPY_SWAP_SLOT_GRAPHS", "1")

import cupy as cp
import numpy as np

import cupy_swap as cs
from cupy_swap.cuda import graph_builder

SPIN_MS = float(os.environ.get("SPIN_MS", "300"))
SPIN = cp.RawKernel(
    r"""extern "C" __global__ void spin(unsigned long long ns) {
    unsigned long long s, n;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(s));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(n)); } while (n - s < ns);
}""",
    "spin",
)


def trial(sw, warm, host, gpu, builds: bool) -> tuple:
    a, b = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    m = np.stack([np.arange(16), np.arange(16)], 1)
    SPIN((1,), (1,), (np.uint64(SPIN_MS * 1e6),), stream=a)
    spun = cp.cuda.Event()
    spun.record(a)
    fresh = []
    times = []
    t0 = time.perf_counter()
    while not spun.done:
        if builds and len(fresh) < 8:  # a new op, called until the builder is asked for its graphs
            op = sw.prepare(host, gpu[len(fresh) :])
            for _ in range(graph_builder.BUILD_AFTER):
                op(m, stream=b)
            fresh.append(op)
        s = time.perf_counter()
        warm(m, stream=b)
        times.append(time.perf_counter() - s)
        b.synchronize()
    built_s = time.perf_counter()
    graph_builder.builder.drain()
    built_s = time.perf_counter() - built_s
    a.synchronize()
    return (
        max(times) * 1e6,
        statistics.median(times) * 1e6,
        len(times),
        built_s * 1e3,
        time.perf_counter() - t0,
    )


def main() -> None:
    t = time.perf_counter()
    sw = cs.BlockSwapper(max_blocks=64)
    print(
        f"swapper made in {(time.perf_counter() - t) * 1e3:.1f} ms (graph_builder.prewarm: {sw._launcher.graphs_ok})"
    )
    host = cs.empty_pinned((64, 32768), np.uint8)
    gpu = cp.empty((80, 32768), cp.uint8)
    warm = sw.prepare(host, gpu[:64])
    m = np.stack([np.arange(16), np.arange(16)], 1)
    for _ in range(3 * graph_builder.BUILD_AFTER):
        warm(m).synchronize()
    graph_builder.builder.drain()
    print("warm op launches graphs:", warm._decided.kernel._execs is not None)
    for builds in (False, True, False, True):
        worst, median, calls, drain_ms, wall = trial(sw, warm, host, gpu, builds)
        print(
            f"builds={builds}: {calls} calls of the warm op during a {SPIN_MS:.0f} ms spin: "
            f"longest {worst:.0f} us, median {median:.1f} us; builder drained {drain_ms:.0f} ms after the spin "
            f"({wall:.2f} s in all)"
        )


if __name__ == "__main__":
    main()
