"""Device time of a kernel swap with its rows checked in the launch and on
the host, and with its mapping on the GPU (always checked in the launch),
beside one contiguous memcpy of the same bytes: what the in-launch check
costs the copy (issue 25: the default check is chosen from this table).

    python benchmarks/probes/check_cost.py
"""

import numpy as np

from cupy_swap import BlockSwapper
from cupy_swap.tools.bench import CaseBuffers, SwapCase

KIB = 1024
REPS = 30


def device_us(op, m, stream, **kw) -> float:
    """Median device time of ``op(m)`` (events around the launch)."""
    for _ in range(3):
        op(m, stream=stream, **kw).synchronize()
    return float(
        np.median([op(m, stream=stream, timing=True, **kw).device_time() * 1e6 for _ in range(REPS)])
    )


def memcpy_us(bufs, direction, stream) -> float:
    import cupy

    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    nbytes, gpu, host = bufs.flat_gpu.nbytes, bufs.flat_gpu.data.ptr, bufs.flat_host.ctypes.data
    times = []
    for _ in range(REPS):
        start.record(stream)
        if direction == "in":
            cupy.cuda.runtime.memcpyAsync(gpu, host, nbytes, 1, stream.ptr)
        else:
            cupy.cuda.runtime.memcpyAsync(host, gpu, nbytes, 2, stream.ptr)
        end.record(stream)
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end) * 1e3)
    return float(np.median(times))


def main() -> None:
    import cupy

    rng = np.random.default_rng(0)
    stream = cupy.cuda.Stream(non_blocking=True)
    print("us of device time      in launch  on host  GPU rows  memcpy   launch/host")
    for direction in ("in", "out"):
        for block, n in ((4 * KIB, 16), (32 * KIB, 16), (4 * KIB, 1250), (32 * KIB, 1250), (4 * KIB, 4096)):
            bufs = CaseBuffers(SwapCase(direction, block, n), rng)
            sw = BlockSwapper(max_blocks=4096)
            op = sw.prepare(bufs.src, bufs.dst)
            launch = device_us(op, bufs.mapping, stream, check="launch")
            host = device_us(op, bufs.mapping, stream, check="host")
            on_gpu = device_us(op, cupy.asarray(bufs.mapping), stream)
            copy = memcpy_us(bufs, direction, stream)
            print(
                f"{direction:>3} {block // KIB:3} KiB x {n:5} {launch:10.1f} {host:8.1f} {on_gpu:9.1f}"
                f" {copy:7.1f} {launch / host:10.3f}",
                flush=True,
            )
            sw.close()


if __name__ == "__main__":
    main()
