"""Why does a prepared copy-engine swap of 16 x 2 MiB cost several times
the prebuilt ``cuMemcpyBatchAsync`` call of the same copies?  Host time
(fastest round median, ``host_times``) of: the batch call on prebuilt
arrays; on fresh copies of them made per call; the library's copy list
plus the call; the whole prepared op.

    python benchmarks/probes/batch_cost_probe.py
"""

import cupy
import numpy as np

from cupy_swap import BlockSwapper
from cupy_swap.core.copies import copy_list
from cupy_swap.tools.bench import CaseBuffers, SwapCase, host_time, host_times

KIB = 1024


def main() -> None:
    rng = np.random.default_rng(0)
    stream = cupy.cuda.Stream(non_blocking=True)
    for block, n in ((2048 * KIB, 16), (256 * KIB, 16), (32 * KIB, 16)):
        bufs = CaseBuffers(SwapCase("in", block, n), rng)
        sw = BlockSwapper(max_blocks=n)
        op = sw.prepare(bufs.src, bufs.dst)
        m, layout, dma, h = bufs.mapping, op._decided.layout, sw._dma, stream.ptr
        d, s, z = copy_list(layout, m)
        calls = {
            "batch, prebuilt arrays": lambda: dma.issue(d, s, z, h, 1),  # noqa: B023
            "batch, fresh array copies": lambda: dma.issue(d.copy(), s.copy(), z.copy(), h, 1),  # noqa: B023
            "copy_list + batch": lambda: dma.issue(*copy_list(layout, m), h, 1),  # noqa: B023
            "copy_list alone": lambda: copy_list(layout, m),  # noqa: B023
            "prepared op, mode dma": lambda: op(m, stream=stream, mode="dma"),  # noqa: B023
        }
        for call in calls.values():
            host_time(call, stream, 10)
        times = host_times(calls, stream, 200)
        print(f"{block // KIB} KiB x {n}:")
        for name, t in times.items():
            print(f"  {name:<28} {t * 1e6:8.1f} us", flush=True)
        assert bufs.verify()


if __name__ == "__main__":
    main()
