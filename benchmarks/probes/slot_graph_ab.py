"""Host time of a prepared call with its slot graphs (``cudaGraphLaunch``)
against the same call with plain ``cuLaunchKernel`` launches, two swappers
of the same buffers in one process, taking turns (bench.host_times), beside
a bare ``cudaMemcpyAsync`` call; then a cProfile of the graph op at n = 16.
Decides whether the builder thread earns its place (NOTES item 68).

    PYTHONPATH=$PWD python benchmarks/probes/slot_graph_ab.py
"""

import cProfile
import functools
import os
import pstats

# Slot graphs are opt-in (NOTES 68); this probe measures them.
os.environ.setdefault("CUPY_SWAP_SLOT_GRAPHS", "1")

import cupy as cp
import numpy as np
from cupy.cuda import runtime

import cupy_swap as cs
from cupy_swap.cuda import graph_builder
from cupy_swap.tools.bench import host_times

BLOCKS = 4096


def main() -> None:
    rng = np.random.default_rng(0)
    stream = cp.cuda.Stream(non_blocking=True)
    for block in (4096, 32768):
        host = cs.empty_pinned((BLOCKS, block), np.uint8)
        gpu = cp.empty((BLOCKS, block), cp.uint8)
        flat = cp.empty(16 * block, cp.uint8)
        for direction in ("in", "out"):
            src, dst = (host, gpu) if direction == "in" else (gpu, host)
            plain_sw, graph_sw = cs.BlockSwapper(max_blocks=2048), cs.BlockSwapper(max_blocks=2048)
            plain, graph = plain_sw.prepare(src, dst), graph_sw.prepare(src, dst)
            for n in (1, 16, 1250):
                m = np.stack([rng.choice(BLOCKS, n, replace=False), rng.choice(BLOCKS, n, replace=False)], 1)
                m = m.astype(np.int64)
                for _ in range(3 * graph_builder.BUILD_AFTER):
                    plain(m, stream=stream, mode="kernel")
                    graph(m, stream=stream, mode="kernel")
                graph_builder.builder.drain()
                kp, kg = plain._decided.kernel, graph._decided.kernel
                kp._execs, kp._calls = None, -(1 << 62)  # plain launches for good
                if kg._execs is None:
                    print("graph op has no graphs", block, direction, n)
                calls = {
                    "plain": functools.partial(plain, m, stream=stream, mode="kernel"),
                    "graph": functools.partial(graph, m, stream=stream, mode="kernel"),
                    "memcpy": functools.partial(
                        runtime.memcpyAsync, flat.data.ptr, host.ctypes.data, 16 * block, 1, stream.ptr
                    ),
                }
                t = host_times(calls, stream, reps=400, rounds=5)
                print(
                    f"{direction:3s} {block:6d} x {n:4d}: plain {t['plain'] * 1e6:5.1f} us  "
                    f"graph {t['graph'] * 1e6:5.1f} us  memcpy call {t['memcpy'] * 1e6:4.1f} us",
                    flush=True,
                )
                if block == 32768 and n == 16 and direction == "in":
                    prof = cProfile.Profile()
                    prof.enable()
                    for _ in range(3000):
                        graph(m, stream=stream, mode="kernel")
                    prof.disable()
                    stream.synchronize()
                    pstats.Stats(prof).sort_stats("tottime").print_stats(18)
            stream.synchronize()
            plain_sw.close()
            graph_sw.close()


if __name__ == "__main__":
    main()
