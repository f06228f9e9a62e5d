"""The ``max_ctas`` sweep: 1250 x 32 KiB swaps' device-time GB/s alone at
each CTA budget, then ``bench``'s matmul interference run (an 8192^3 fp16
product on one stream, swaps on another) at the same budgets.  NOTES item
43.

    python benchmarks/probes/max_ctas_sweep.py out.json
"""

import json
import sys

import cupy
import numpy as np

from cupy_swap import BlockSwapper
from cupy_swap.tools.bench import CaseBuffers, SwapCase, run_with_gemm

budgets = (4, 8, 16, 32, 66, 132)
rng = np.random.default_rng(0)
stream = cupy.cuda.Stream(non_blocking=True)
alone = {}
for d in ("in", "out"):
    bufs = CaseBuffers(SwapCase(d, 32768, 1250), rng)
    for b in budgets:
        sw = BlockSwapper(max_blocks=1250, max_ctas=b, mode="kernel")
        for _ in range(3):
            sw.swap(bufs.src, bufs.dst, bufs.mapping, stream=stream).synchronize()
        ts = []
        for _ in range(20):
            ev = sw.swap(bufs.src, bufs.dst, bufs.mapping, stream=stream, timing=True)
            ev.synchronize()
            ts.append(ev.device_time())
        alone[(d, b)] = bufs.case.total_bytes / np.median(ts) / 1e9
        sw.close()
    print(
        d,
        "alone GB/s (device time):",
        {b: round(alone[(d, b)], 1) for b in budgets},
        "verified",
        bufs.verify(),
        flush=True,
    )
rows = run_with_gemm(budgets)
for r in rows:
    print(
        f"max_ctas {r['max_ctas']:4d}: gemm alone {r['gemm_alone_ms']:.2f} ms beside {r['gemm_beside_swaps_ms']:.2f} ms (+{100 * r['gemm_slowdown']:.1f} %), swaps {r['swap_gbps']:.1f} GB/s ({r['swaps']})",
        flush=True,
    )
json.dump(
    {"alone": {f"{d} {b}": v for (d, b), v in alone.items()}, "with_gemm": rows},
    open(sys.argv[1], "w"),
    indent=1,
)
