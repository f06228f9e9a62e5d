"""Why does a prepared op lose 256 KiB x 16 to the seed's kernel by ~30 us
when its kernel's queued device time is within 5% of memcpy?

For each case and CTA budget: blocking latency of the prepared op (submit +
synchronize, median), the device time between events around it in that
blocking loop, and its device time with the host hidden behind a spin
kernel (queued); the seed's kernel with its mapping on the GPU (one CTA per
block) and one contiguous memcpy of the same bytes beside it.  If blocking
device time exceeds queued device time, the kernel itself runs slower when
it starts on an idle GPU, and the budget is where to look.

    python benchmarks/probes/cta_blocking_probe.py
"""

import functools
import sys
from pathlib import Path

import cupy

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for lean_goals

import numpy as np  # noqa: E402
from lean_goals import queued_device_s  # noqa: E402

from cupy_swap import BlockSwapper  # noqa: E402
from cupy_swap.tools.bench import CaseBuffers, SwapCase, memcpy_ceiling, time_blocking  # noqa: E402
from cupy_swap.tools.peers import contender_calls  # noqa: E402

KIB = 1024
CASES = [
    (d, b, n)
    for d in ("in", "out")
    for b, n in ((32 * KIB, 16), (256 * KIB, 16), (1024 * KIB, 4), (32 * KIB, 1250))
]
BUDGETS = (8, 16, 32, 64, 132)
REPS = 30


def main() -> None:
    rng = np.random.default_rng(0)
    stream = cupy.cuda.Stream(non_blocking=True)
    print(
        f"{'case':<20} {'ctas':>4} {'blocking':>9} {'dev(blk)':>9} {'dev(q)':>8} {'seed':>8} {'memcpy':>8}  us"
    )
    for direction, block, n in CASES:
        bufs = CaseBuffers(SwapCase(direction, block, n), rng)
        ceiling = memcpy_ceiling(bufs, stream, REPS)["latency_s"]
        seed = None
        for budget in BUDGETS:
            sw = BlockSwapper(max_blocks=n, max_ctas=budget, mode="kernel")
            op = sw.prepare(bufs.src, bufs.dst)
            if seed is None:
                seed_call = contender_calls(bufs, stream, sw)["seed_resident"]
                seed = time_blocking(seed_call, stream, REPS)["latency_s"]
            call = functools.partial(op, bufs.mapping, stream=stream)
            blocking = time_blocking(call, stream, REPS)
            queued = queued_device_s(call, stream, REPS)
            ok = bufs.verify()
            label = f"{direction} {block // KIB} KiB x {n}"
            print(
                f"{label:<20} {budget:4d} {blocking['latency_s'] * 1e6:9.1f} {blocking['device_s'] * 1e6:9.1f} "
                f"{queued * 1e6:8.1f} {seed * 1e6:8.1f} {ceiling * 1e6:8.1f}  {'ok' if ok else 'MISMATCH'}",
                flush=True,
            )
            sw.close()


if __name__ == "__main__":
    main()
