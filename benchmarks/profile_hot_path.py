"""Where a call's host time goes, on the device's host: host time (stream
drained outside the clock, median of 300) of a prepared call, of ``swap()``,
and of the seed's kernel launched through ``cupy.RawKernel`` with its
mapping already on the GPU (the contender with the least Python), next to a
bare ``cudaMemcpyAsync``; then a cProfile of the prepared call of each case
in ``PROFILED``.

    PYTHONPATH=$PWD python3 benchmarks/profile_hot_path.py
"""

import cProfile
import pstats

import cupy
import numpy as np
from cupy.cuda import runtime

from cupy_swap import BlockSwapper
from cupy_swap.tools.bench import CaseBuffers, SwapCase, host_time
from cupy_swap.tools.peers import contender_calls

CASES = [(1, 32768, 1), (1, 32768, 16), (1, 4096, 1250), (64, 4096, 16), (64, 4096, 1250)]
PROFILED = [(1, 32768, 16), (1, 4096, 1250)]


def main():
    rng = np.random.default_rng(0)
    stream = cupy.cuda.Stream(non_blocking=True)
    host = cupy.cuda.alloc_pinned_memory(32768)
    dev = cupy.empty(32768, cupy.uint8)
    memcpy = host_time(lambda: runtime.memcpyAsync(dev.data.ptr, host.ptr, 32768, 1, stream.ptr), stream, 300)
    print(f"bare cudaMemcpyAsync: {memcpy * 1e6:.2f} us")
    print(f"{'case':<22} {'prepared':>9} {'swap()':>9} {'seed':>9}   us of host time per call")
    for parts, block, n in CASES:
        bufs = CaseBuffers(SwapCase("in", block, n, parts), rng)
        sw = BlockSwapper(max_blocks=n)
        op = sw.prepare(bufs.src, bufs.dst)
        m, src, dst = bufs.mapping, bufs.src, bufs.dst
        calls = (lambda: op(m, stream=stream), lambda: sw.swap(src, dst, m, stream=stream))  # noqa: B023
        for fn in calls:
            host_time(fn, stream, 20)
        prepared, swap = (host_time(fn, stream, 300) for fn in calls)
        seed = float("nan")
        if parts == 1:
            seed_call = contender_calls(bufs, stream, sw)["seed_resident"]
            host_time(seed_call, stream, 20)
            seed = host_time(seed_call, stream, 300)
        label = f"{parts} x {block >> 10} KiB x {n}"
        print(f"{label:<22} {prepared * 1e6:9.2f} {swap * 1e6:9.2f} {seed * 1e6:9.2f}   path {sw.last_path}")
        if (parts, block, n) in PROFILED:
            profile(lambda: op(m, stream=stream), stream)  # noqa: B023


def profile(call, stream):
    prof = cProfile.Profile()
    for _ in range(300):
        prof.enable()
        call()
        prof.disable()
        stream.synchronize()
    pstats.Stats(prof).sort_stats("tottime").print_stats(14)


if __name__ == "__main__":
    main()
