"""Tuning sweep: kernel launch shape against the memcpy ceiling, per case.

Run on a GPU machine::

    PYTHONPATH=$PWD python3 benchmarks/tune.py --json out.json [--quick]

For each case it builds the buffers once, measures the contiguous-memcpy
ceiling, then this library under several configurations (CTA budget, loads
descriptor read from a device copy or from pinned host memory, or the
pairs passed inline).  It also measures the host time spent inside
``swap()``.  Results feed ``benchmarks/NOTES.md``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import cupy
import numpy as np

from cupy_swap import BlockSwapper
from cupy_swap.tools.bench import CaseBuffers, SwapCase, memcpy_ceiling, time_blocking

KIB, MIB = 1 << 10, 1 << 20


def host_time_in_swap(sw, bufs, stream, reps=200) -> float:
    """Median host seconds spent inside one ``swap()`` call (no sync inside)."""
    src, dst, m = bufs.src, bufs.dst, bufs.mapping
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        sw.swap(src, dst, m, stream=stream)
        samples.append(time.perf_counter() - t0)
        stream.synchronize()
    return statistics.median(samples)


def measure(case, configs, reps, rng):
    bufs = CaseBuffers(case, rng, spare=2 if case.total_bytes < (1 << 30) else 1)
    stream = cupy.cuda.Stream(non_blocking=True)
    ceil = memcpy_ceiling(bufs, stream, reps)
    rows = []
    src, dst, m = bufs.src, bufs.dst, bufs.mapping
    for cfg in configs:
        sw = BlockSwapper(max_blocks=case.num_blocks, max_ctas=cfg["ctas"])
        sw.mode = cfg.get("mode", "kernel")
        t = time_blocking(lambda sw=sw: sw.swap(src, dst, m, stream=stream), stream, reps)
        ok = bufs.verify() if (case.total_bytes < (512 << 20) or cfg is configs[0] or "mode" in cfg) else None
        row = dict(cfg)
        row["path"] = sw.last_path
        row.update(
            latency_us=t["latency_s"] * 1e6,
            device_us=t["device_s"] * 1e6,
            ratio=ceil["latency_s"] / t["latency_s"],
            device_ratio=ceil["device_s"] / t["device_s"],
            gbps=case.total_bytes / t["latency_s"] / 1e9,
            verified=ok,
        )
        if cfg.get("host_time"):
            row["host_us"] = host_time_in_swap(sw, bufs, stream) * 1e6
        rows.append(row)
    return {
        "case": case.label(),
        "bytes": case.total_bytes,
        "ceiling_latency_us": ceil["latency_s"] * 1e6,
        "ceiling_device_us": ceil["device_s"] * 1e6,
        "ceiling_gbps": case.total_bytes / ceil["latency_s"] / 1e9,
        "rows": rows,
    }


def profile_small_swap():
    """Where the host time of a one-block swap goes."""
    import cProfile
    import pstats

    rng = np.random.default_rng(0)
    bufs = CaseBuffers(SwapCase("in", 32 * KIB, 1), rng)
    sw = BlockSwapper(max_blocks=16)
    stream = cupy.cuda.Stream(non_blocking=True)
    src, dst, m = bufs.src, bufs.dst, bufs.mapping
    print(f"host time in swap(), n=1: {host_time_in_swap(sw, bufs, stream) * 1e6:.1f} us")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(3000):
        sw.swap(src, dst, m, stream=stream)
        stream.synchronize()
    prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(18)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sweep", choices=("paths", "shape"), default="paths")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--profile", action="store_true", help="cProfile 3000 one-block swaps and stop")
    args = ap.parse_args()
    if args.profile:
        return profile_small_swap()
    rng = np.random.default_rng(0)
    sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
    if args.sweep == "shape":
        # CTA budget sweep (experiment 3 in NOTES.md).  The unroll, CTA-size
        # and cache-hint variants of experiments 4-6 were decided and left the
        # product kernel (item 27); commit 4ee5a2f still has them.
        large = [{"ctas": c} for c in (4, 8, 16, 32, sms)]
    else:
        # Paths: kernel against copy engines against auto.
        large = [{"ctas": c} for c in (8, 16, 32)]
        large += [{"ctas": 16, "mode": m} for m in ("dma", "auto")]
    small = [{"ctas": 16, "host_time": True}]
    small += [{"ctas": 16, "mode": m, "host_time": True} for m in ("dma", "auto")]
    big = [{"ctas": 16}, {"ctas": 16, "mode": "auto"}]
    cases = []
    for d in ("out", "in"):
        cases.append((SwapCase(d, 32 * KIB, 1250, parts=64), big))
    for d in ("in", "out"):
        for b in (4 * KIB, 32 * KIB, 256 * KIB, 2 * MIB):
            cases.append((SwapCase(d, b, 1250), large))
            cases.append((SwapCase(d, b, 16), small))
            cases.append((SwapCase(d, b, 1), small))
        for b in (4 * KIB, 32 * KIB):
            cases.append((SwapCase(d, b, 10000), big))
        cases.append((SwapCase(d, 32 * KIB, 1250, contiguous=True), large[-3:]))
    if args.quick:
        cases = [
            c for c in cases if c[0].block_bytes == 32 * KIB and c[0].parts == 1 and c[0].num_blocks <= 1250
        ]
    results = []
    for case, configs in cases:
        reps = args.reps if case.total_bytes < (1 << 30) else 8
        r = measure(case, configs, reps, rng)
        results.append(r)
        best = max(r["rows"], key=lambda x: x["ratio"])
        print(
            f"{r['case']:<36} ceil {r['ceiling_gbps']:6.2f} GB/s {r['ceiling_latency_us']:9.1f} us | best "
            f"{best['ratio']:.3f} (dev {best['device_ratio']:.3f}) with "
            f"{ {k: v for k, v in best.items() if k in ('ctas', 'inline')} }",
            flush=True,
        )
        for row in r["rows"]:
            extra = f" host {row['host_us']:.1f} us" if "host_us" in row else ""
            defs = ",".join(d.replace("CUPY_SWAP_", "") for d in row.get("defines", []))
            print(
                f"    ctas={row['ctas']:>3} inline={row.get('inline', '-')!s:>4} "
                f"{row.get('mode', 'kernel'):<6} {defs:<22} lat {row['latency_us']:9.1f} us ratio "
                f"{row['ratio']:.3f} dev {row['device_ratio']:.3f}{extra} {row['path']} {'-' if row['verified'] is None else 'ok' if row['verified'] else 'BAD'}",
                flush=True,
            )
        del r
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
