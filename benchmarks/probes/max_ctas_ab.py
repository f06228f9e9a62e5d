"""CTA budgets 8, 16 and 32 on the kernel rows of ``bench --peers``: blocking
GB/s of a prepared op, best of 3 alternating rounds of 20, beside the pull
request's kernel (``ref``: mapping on the GPU; ``ref+map``: uploaded per
call) timed in the same rounds.  NOTES item 43.

    python benchmarks/probes/max_ctas_ab.py
"""

import functools

import cupy
import numpy as np

from cupy_swap import BlockSwapper
from cupy_swap.tools.bench import CaseBuffers, SwapCase, time_blocking
from cupy_swap.tools.peers import contender_calls

rng = np.random.default_rng(0)
stream = cupy.cuda.Stream(non_blocking=True)
budgets = (8, 16, 32)
print(
    "case                 "
    + "  ".join(f"ctas{b:<3d}" for b in budgets)
    + "   ref  ref+map  (GB/s, blocking, best round)"
)
for d in ("in", "out"):
    for block in (4096, 32768, 262144):
        for n in (16, 1250):
            bufs = CaseBuffers(SwapCase(d, block, n), rng, spare=2)
            sws = {b: BlockSwapper(max_blocks=n, max_ctas=b) for b in budgets}
            calls = contender_calls(bufs, stream, sws[8])
            fns = {
                b: functools.partial(sws[b].prepare(bufs.src, bufs.dst), bufs.mapping, stream=stream)
                for b in budgets
            }
            fns["ref"], fns["ref+map"] = calls["seed_resident"], calls["seed_upload"]
            best = dict.fromkeys(fns, 0.0)
            for _ in range(3):
                for k, fn in fns.items():
                    t = time_blocking(fn, stream, 20)["latency_s"]
                    best[k] = max(best[k], bufs.case.total_bytes / t / 1e9)
            ok = bufs.verify()
            print(
                f"{d:>3} {block >> 10:4d} KiB x {n:5d}  "
                + "  ".join(f"{best[b]:7.2f}" for b in budgets)
                + f"  {best['ref']:6.2f} {best['ref+map']:7.2f}  {'ok' if ok else 'MISMATCH'}",
                flush=True,
            )
            for s in sws.values():
                s.close()
