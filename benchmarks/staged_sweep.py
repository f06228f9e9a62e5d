"""Swaps with host blocks in one run and GPU blocks random, both ways: the
kernel against the staged path (copy engines + a scatter or gather kernel)
and what ``auto`` picks, across sizes.  Sets where ``auto`` should start
staging (``STAGED_MIN_BYTES``).

    PYTHONPATH=$PWD python3 benchmarks/staged_sweep.py [--json FILE]
"""

import argparse
import json

import cupy
import numpy as np

from cupy_swap import BlockSwapper
from cupy_swap.tools.bench import (
    CaseBuffers,
    SwapCase,
    bidir_mapping,
    host_time,
    memcpy_ceiling,
    swapper_settings,
    time_blocking,
)

KIB = 1 << 10


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    rows = []
    cases = [(32 * KIB, n) for n in (16, 64, 128, 256, 1250, 10000)]
    cases += [(4 * KIB, 1250), (4 * KIB, 10000), (256 * KIB, 1250), (16 * KIB, 1250)]
    settings = swapper_settings()  # the thresholds auto ran with
    print(settings)
    print(
        f"{'case':<18} {'memcpy':>8} {'kernel':>8} {'staged':>8} {'auto':>8}  {'host k/s':>12}  auto path  (ratios)"
    )
    for direction, (block, n) in [(d, c) for d in ("in", "out") for c in cases]:
        case = SwapCase(direction, block, n)
        bufs = CaseBuffers(case, rng)
        bufs.mapping = bidir_mapping("host-runs", n, bufs.host_blocks, rng, direction)
        stream = cupy.cuda.Stream(non_blocking=True)
        sw = BlockSwapper(max_blocks=n)
        ceiling = memcpy_ceiling(bufs, stream, args.reps)["latency_s"]
        row = {"direction": direction, "block_bytes": block, "num_blocks": n, "ceiling_s": ceiling}
        for mode in ("kernel", "staged", "auto"):

            def swap(mode=mode, sw=sw, bufs=bufs, stream=stream):
                sw.swap(bufs.src, bufs.dst, bufs.mapping, stream=stream, mode=mode)

            row[mode] = time_blocking(swap, stream, args.reps)["latency_s"]
            row[mode + "_path"] = sw.last_path
            row[mode + "_ok"] = bufs.verify()
            if mode != "auto":
                row[mode + "_host_s"] = host_time(swap, stream, reps=50)
        rows.append(row)
        ok = all(row[m + "_ok"] for m in ("kernel", "staged", "auto"))
        print(
            f"{direction:>3} {block // KIB:>4} KiB x {n:<6} {ceiling * 1e6:8.1f} {row['kernel'] * 1e6:8.1f} "
            f"{row['staged'] * 1e6:8.1f} {row['auto'] * 1e6:8.1f}  "
            f"{row['kernel_host_s'] * 1e6:5.1f}/{row['staged_host_s'] * 1e6:5.1f}  {row['auto_path']:<8} "
            f"({ceiling / row['kernel']:.3f} / {ceiling / row['staged']:.3f} / {ceiling / row['auto']:.3f})"
            f"{'' if ok else '  MISMATCH'}",
            flush=True,
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"settings": settings, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
