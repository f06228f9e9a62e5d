"""Where a swap's blocking latency goes: host time inside ``swap()``, the
kernel alone (a captured graph replayed, timed with events), and the rest
(launch latency, descriptor copy, synchronize).

    PYTHONPATH=$PWD python3 benchmarks/breakdown.py
"""

import statistics

import cupy
import numpy as np

from cupy_swap import BlockSwapper
from cupy_swap.tools.bench import CaseBuffers, SwapCase, host_time, memcpy_ceiling, time_blocking

KIB = 1 << 10


def main():
    rng = np.random.default_rng(0)
    print(
        f"{'case':<26} {'mode':<6} {'ceiling':>8} {'swap()':>8} {'host':>7} {'kernel':>8} {'ratio':>6}  (us)"
    )
    for case, modes in [
        (SwapCase("in", 32 * KIB, 1), ("dma", "kernel")),
        (SwapCase("out", 32 * KIB, 1), ("dma", "kernel")),
        (SwapCase("in", 4 * KIB, 1250), ("kernel",)),
        (SwapCase("out", 4 * KIB, 1250), ("kernel",)),
        (SwapCase("in", 32 * KIB, 1250), ("kernel",)),
        (SwapCase("out", 32 * KIB, 1250), ("kernel",)),
    ]:
        bufs = CaseBuffers(case, rng)
        stream = cupy.cuda.Stream(non_blocking=True)
        ceiling = memcpy_ceiling(bufs, stream, 30)["latency_s"]
        for mode in modes:
            sw = BlockSwapper(max_blocks=case.num_blocks, mode=mode)
            src, dst, m = bufs.src, bufs.dst, bufs.mapping

            def swap(sw=sw, src=src, dst=dst, m=m, stream=stream):
                sw.swap(src, dst, m, stream=stream)

            lat = time_blocking(swap, stream, 30)["latency_s"]
            host = host_time(swap, stream)
            kernel = float("nan")
            if mode == "kernel":
                gs = sw.graph_swap(src, dst)
                gs.set_mapping(m, stream=stream)
                stream.synchronize()
                stream.begin_capture()
                gs.launch(stream=stream)
                graph = stream.end_capture()
                times = []
                for _ in range(30):
                    a, b = cupy.cuda.Event(), cupy.cuda.Event()
                    a.record(stream)
                    graph.launch(stream)
                    b.record(stream)
                    b.synchronize()
                    times.append(cupy.cuda.get_elapsed_time(a, b) * 1e-3)
                kernel = statistics.median(times)
            print(
                f"{case.label():<26} {mode:<6} {ceiling * 1e6:8.1f} {lat * 1e6:8.1f} {host * 1e6:7.1f} "
                f"{kernel * 1e6:8.1f} {ceiling / lat:6.3f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
