"""Where do the copy engines beat the kernel?  Blocking latency of ``mode=
"kernel"`` against ``mode="dma"`` (random scattered blocks, one part) over
block size and pair count, both directions, in one run; the thresholds of
``Policy`` (``cupy_swap/core/route.py``) are read off this table.

    PYTHONPATH=$PWD python3 benchmarks/route_sweep.py --json route_sweep.json
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from cupy_swap.tools.bench import CaseBuffers, SwapCase, time_blocking

KIB = 1 << 10
BLOCKS = (16 * KIB, 32 * KIB, 64 * KIB, 128 * KIB, 256 * KIB, 512 * KIB, 1024 * KIB, 2048 * KIB)
COUNTS = (1, 2, 4, 16, 64, 256, 1250)


def measure(direction: str, block: int, n: int, rng, stream, reps: int) -> tuple[dict, bool]:
    """Blocking latency of both modes for one shape; whether both copied right."""
    from cupy_swap import BlockSwapper

    bufs = CaseBuffers(SwapCase(direction, block, n), rng)
    sw = BlockSwapper(max_blocks=n)
    row, ok = {"direction": direction, "block_bytes": block, "n": n}, True
    reps = reps if block * n < (256 << 20) else max(5, reps // 4)
    for mode in ("kernel", "dma"):
        t = time_blocking(
            lambda mode=mode: sw.swap(bufs.src, bufs.dst, bufs.mapping, stream=stream, mode=mode),
            stream,
            reps,
        )
        row[mode + "_us"] = t["latency_s"] * 1e6
        ok = ok and bufs.verify()
    return row, ok


def main(argv=None) -> int:
    import cupy

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", metavar="FILE")
    p.add_argument("--reps", type=int, default=20)
    args = p.parse_args(argv)
    rng = np.random.default_rng(0)
    stream = cupy.cuda.Stream(non_blocking=True)
    rows, ok = [], True
    print(f"{'dir':<4}{'block':>9}{'n':>6}{'kernel us':>12}{'dma us':>12}  faster", flush=True)
    for direction in ("in", "out"):
        for block in BLOCKS:
            for n in COUNTS:
                if block * n > (600 << 20):  # clearly copy-engine territory, and slow to fill
                    continue
                row, good = measure(direction, block, n, rng, stream, args.reps)
                ok = ok and good
                rows.append(row)
                faster = "dma" if row["dma_us"] < row["kernel_us"] else "kernel"
                print(
                    f"{direction:<4}{block >> 10:>7}Ki{n:>6}{row['kernel_us']:>12.1f}{row['dma_us']:>12.1f}  {faster}",
                    flush=True,
                )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    print("every copy bit-exact" if ok else "MISMATCH", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
