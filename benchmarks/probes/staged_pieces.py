"""Where a staged swap's time goes (issue 50, item 5: duplex with host runs
each way reaches 0.67 of the memcpy pair for one blocking pair): 1250 x
32 KiB, host blocks in one run, GPU blocks random, as ``bench --bidir``
lays them out.  Per direction: host µs of ``swap()`` alone, blocking µs
and device µs beside one memcpy of the same bytes, then a profile.

    python benchmarks/probes/staged_pieces.py
"""

import cProfile
import functools
import io
import pstats

import numpy as np

N, BLOCK, REPS = 1250, 32 << 10, 30


def staged_cases():
    """Per direction, ``(direction, bufs, sw, stream, swap, memcpy)``: the
    swap's buffers and mapping, one swapper and stream for both, the swap
    call and one ``cudaMemcpyAsync`` of the same bytes."""
    import cupy
    from cupy.cuda import runtime

    from cupy_swap import BlockSwapper
    from cupy_swap.tools.bench import CaseBuffers, SwapCase, bidir_mapping

    rng = np.random.default_rng(0)
    stream = cupy.cuda.Stream(non_blocking=True)
    sw = BlockSwapper(max_blocks=N)
    for direction in ("in", "out"):
        bufs = CaseBuffers(SwapCase(direction, BLOCK, N), rng)
        bufs.mapping = bidir_mapping("host-runs", N, bufs.host_blocks, rng, direction)
        call = functools.partial(sw.swap, bufs.src, bufs.dst, bufs.mapping, stream=stream)
        nbytes, gpu, host = bufs.flat_gpu.nbytes, bufs.flat_gpu.data.ptr, bufs.flat_host.ctypes.data
        ends = (gpu, host, nbytes, 1) if direction == "in" else (host, gpu, nbytes, 2)
        yield direction, bufs, sw, stream, call, functools.partial(runtime.memcpyAsync, *ends, stream.ptr)


def main() -> None:
    from cupy_swap.tools.bench import host_time, time_blocking

    for direction, bufs, sw, stream, call, memcpy in staged_cases():
        call()
        stream.synchronize()
        print(f"{direction}: path {sw.last_path}")
        for name, fn in (("memcpy", memcpy), ("swap()", call)):
            t = time_blocking(fn, stream, REPS)
            h = host_time(fn, stream, REPS)
            print(
                f"  {name:8} blocking {t['latency_s'] * 1e6:8.1f} µs  device {t['device_s'] * 1e6:8.1f}"
                f"  host {h * 1e6:7.1f}",
                flush=True,
            )
        assert bufs.verify(), "bytes differ"
        prof = cProfile.Profile()
        for _ in range(REPS):
            prof.enable()
            call()
            prof.disable()
            stream.synchronize()
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(22)
        print("\n".join(line for line in out.getvalue().splitlines() if line.strip()), flush=True)


if __name__ == "__main__":
    main()
