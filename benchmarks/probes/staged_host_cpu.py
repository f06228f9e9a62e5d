"""The Python of a staged swap, on any machine (issue 50, item 5: a staged
swap's host time is the gap of the duplex pair with host runs, NOTES 85):
the plan and the enqueue of 1250 x 32 KiB (host blocks one run, GPU blocks
random) over the stand-ins of ``tests/fakes.py``'s ``staged_stand_in``,
every CUDA call recorded instead of made.  Prints µs per swap (minimum of
five rounds) and how many CUDA calls, copies and launches it enqueued.

    python benchmarks/probes/staged_host_cpu.py
"""

import functools
import sys
import timeit
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from tests.fakes import FakeGpu, staged_stand_in  # noqa: E402

N, ROUNDS, CALLS = 1250, 5, 200


def main() -> None:
    rng = np.random.default_rng(0)
    gpu = FakeGpu()
    with pytest.MonkeyPatch.context() as mp:
        run, calls, stager = staged_stand_in(mp, gpu)
        for direction in ("in", "out"):
            blocks = (np.arange(5, 5 + N), rng.choice(2500, N, replace=False))
            m = np.column_stack(blocks if direction == "in" else blocks[::-1]).astype(np.int64)
            calls.clear()
            plan = run(direction, m)
            kinds = [c[0] for c in calls]
            one = functools.partial(run, direction, m)
            us = min(timeit.repeat(one, number=CALLS, repeat=ROUNDS)) / CALLS * 1e6
            print(
                f"{direction}: chunks {plan.sizes}, {us:5.1f} µs a swap (plan + enqueue); "
                f"{kinds.count('record')} records, {kinds.count('wait')} waits, "
                f"{kinds.count('copy')} copies, {kinds.count('launch')} launches",
                flush=True,
            )
        stager.close()
    gpu.release()


if __name__ == "__main__":
    main()
