"""Command line: ``python -m cupy_swap [demo|bench] ...`` (also ``cupy-swap``).

``demo`` (the default) swaps a demo cache in and out, prints GB/s against the
contiguous-memcpy ceiling, and checks every byte.  ``bench`` prints the
seed's table (swap in / out of 1 and 1250 pages) or any sweep you ask for.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from . import __version__
from .bench import (
    CaseBuffers,
    SwapCase,
    gpu_status,
    memcpy_ceiling,
    per_block_memcpy,
    time_blocking,
)

PAGE_BYTES = 16 * 8 * 128 * 2  # 16 tokens x 8 KV heads x 128 dims x fp16 = 32 KiB
PAGE_TEXT = (
    "page = one block of one layer's K or V cache: "
    "16 tokens x 8 KV heads x 128 dims x fp16 = 32 KiB (vLLM, Llama-3-8B)"
)


def _require_gpu() -> str:
    ok, what = gpu_status()
    if not ok:
        print(f"cupy_swap: {what}.\nThis command needs an NVIDIA GPU with a working driver.", file=sys.stderr)
        raise SystemExit(2)
    return what


def environment_lines() -> list[str]:
    """GPU, PCIe link (NVML, when available), driver, CUDA and CuPy versions."""
    import cupy
    from cupy.cuda import runtime

    dev = runtime.getDevice()
    props = runtime.getDeviceProperties(dev)
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    drv, rt = runtime.driverGetVersion(), runtime.runtimeGetVersion()
    lines = [
        f"GPU {dev}: {name}, {props['multiProcessorCount']} SMs",
        f"driver CUDA {drv // 1000}.{drv % 1000 // 10}, runtime CUDA {rt // 1000}.{rt % 1000 // 10}, "
        f"CuPy {cupy.__version__}, cupy_swap {__version__}",
    ]
    try:
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(dev)
        gen = pynvml.nvmlDeviceGetCurrPcieLinkGeneration(h)
        width = pynvml.nvmlDeviceGetCurrPcieLinkWidth(h)
        mgen = pynvml.nvmlDeviceGetMaxPcieLinkGeneration(h)
        mwidth = pynvml.nvmlDeviceGetMaxPcieLinkWidth(h)
        ver = pynvml.nvmlSystemGetDriverVersion()
        ver = ver.decode() if isinstance(ver, bytes) else ver
        lines.append(f"PCIe link: Gen{gen} x{width} (max Gen{mgen} x{mwidth}), driver {ver}")
    except Exception as e:  # NVML missing or refused: say so, do not guess
        lines.append(f"PCIe link: unknown (NVML unavailable: {type(e).__name__})")
    return lines


class Progress:
    """A one-line progress bar on stderr, shown only for sweeps that run
    longer than a couple of seconds and only on a terminal."""

    def __init__(self, total: int, enabled: bool = True):
        self.total, self.done, self.t0 = total, 0, time.perf_counter()
        self.enabled = enabled and sys.stderr.isatty()

    def step(self, label: str) -> None:
        self.done += 1
        if self.enabled and time.perf_counter() - self.t0 > 2.0:
            width = 30
            fill = width * self.done // self.total
            sys.stderr.write(f"\r[{'#' * fill}{'.' * (width - fill)}] {self.done}/{self.total} {label:<40}")
            sys.stderr.flush()

    def close(self) -> None:
        if self.enabled and time.perf_counter() - self.t0 > 2.0:
            sys.stderr.write("\r" + " " * 80 + "\r")


def run_case(case: SwapCase, *, max_ctas=None, reps=30, baseline=True, seed=0) -> dict:
    """Measure one case: this library, the memcpy ceiling, and (optionally)
    one memcpy per block.  Verifies the copy bit-exactly after timing."""
    import cupy

    from .swapper import BlockSwapper

    rng = np.random.default_rng(seed)
    bufs = CaseBuffers(case, rng)
    stream = cupy.cuda.Stream(non_blocking=True)
    sw = BlockSwapper(max_blocks=max(case.num_blocks, 1), max_ctas=max_ctas)
    src, dst, mapping = bufs.src, bufs.dst, bufs.mapping

    def swap():
        sw.swap(src, dst, mapping, stream=stream)

    ours = time_blocking(swap, stream, reps)
    ok = bufs.verify()
    ceiling = memcpy_ceiling(bufs, stream, reps)
    result = {
        "direction": case.direction,
        "block_bytes": case.block_bytes,
        "num_blocks": case.num_blocks,
        "parts": case.parts,
        "contiguous": case.contiguous,
        "bytes": case.total_bytes,
        "max_ctas": sw.max_ctas,
        "path": "kernel",
        "verified": ok,
        "latency_s": ours["latency_s"],
        "device_s": ours["device_s"],
        "gbps": case.total_bytes / ours["latency_s"] / 1e9,
        "device_gbps": case.total_bytes / ours["device_s"] / 1e9,
        "ceiling_gbps": case.total_bytes / ceiling["latency_s"] / 1e9,
        "ceiling_device_gbps": case.total_bytes / ceiling["device_s"] / 1e9,
    }
    result["ratio"] = result["gbps"] / result["ceiling_gbps"]
    result["device_ratio"] = result["device_gbps"] / result["ceiling_device_gbps"]
    if baseline:
        per_block = per_block_memcpy(bufs, stream, max(5, reps // 3))
        result["per_block_gbps"] = case.total_bytes / per_block["latency_s"] / 1e9
    return result


def _fmt_row(r: dict) -> str:
    case = SwapCase(r["direction"], r["block_bytes"], r["num_blocks"], r["parts"], r["contiguous"])
    per_block = f"{r['per_block_gbps']:8.2f}" if "per_block_gbps" in r else "       -"
    flag = "ok" if r["verified"] else "MISMATCH"
    return (
        f"{case.label():<34} {r['gbps']:8.2f} {r['ceiling_gbps']:8.2f} {per_block} "
        f"{r['ratio']:6.3f} {r['device_ratio']:6.3f}  {flag}"
    )


TABLE_HEAD = (
    f"{'case (dir, block x count)':<34} {'cupy_swap':>8} {'memcpy':>8} {'per-blk':>8} "
    f"{'ratio':>6} {'dev':>6}  check\n"
    f"{'':<34} {'GB/s':>8} {'ceiling':>8} {'memcpy':>8} {'':>6} {'ratio':>6}"
)


def cmd_demo(args) -> int:
    what = _require_gpu()
    print(f"cupy_swap {__version__} demo on {what}")
    print(PAGE_TEXT)
    ok_all = True
    for direction in ("out", "in"):
        r = run_case(SwapCase(direction, PAGE_BYTES, 1250), reps=args.reps, baseline=False)
        ok_all &= r["verified"]
        print(
            f"swap {direction:>3} 1250 random pages ({r['bytes'] / 1e6:.1f} MB): {r['gbps']:.1f} GB/s, "
            f"{r['ratio']:.2f} of a contiguous cudaMemcpyAsync ({r['ceiling_gbps']:.1f} GB/s); "
            f"bit-exact: {'yes' if r['verified'] else 'NO'}"
        )
    return 0 if ok_all else 1


def _parse_sizes(text: str) -> list[int]:
    out = []
    for tok in text.split(","):
        tok = tok.strip().lower()
        mult = 1
        for suffix, m in (("kib", 1 << 10), ("k", 1 << 10), ("mib", 1 << 20), ("m", 1 << 20), ("b", 1)):
            if tok.endswith(suffix):
                tok, mult = tok[: -len(suffix)], m
                break
        out.append(int(tok) * mult)
    return out


def cmd_bench(args) -> int:
    _require_gpu()
    sizes = _parse_sizes(args.block_bytes)
    counts = [int(c) for c in args.counts.split(",")]
    directions = args.directions.split(",")
    cases = [
        SwapCase(d, b, n, args.layers, args.contiguous) for b in sizes for n in counts for d in directions
    ]
    head = environment_lines()
    for line in head:
        print(line)
    print(PAGE_TEXT)
    print(
        "figures: blocking latency (submit + synchronize), median of "
        f"{args.reps}; GB/s = 1e9 B/s; ratio = cupy_swap / contiguous memcpy"
    )
    print(TABLE_HEAD)
    results = []
    bar = Progress(len(cases))
    for case in cases:
        r = run_case(case, max_ctas=args.max_ctas, reps=args.reps, baseline=not args.no_baseline)
        results.append(r)
        bar.step(case.label())
        if not bar.enabled:
            print(_fmt_row(r), flush=True)
    bar.close()
    if bar.enabled:
        for r in results:
            print(_fmt_row(r))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"environment": head, "page": PAGE_TEXT, "results": results}, f, indent=1)
    return 0 if all(r["verified"] for r in results) else 1


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cupy-swap", description=__doc__.split("\n\n")[0])
    p.add_argument("--version", action="version", version=f"cupy_swap {__version__}")
    sub = p.add_subparsers(dest="command")
    d = sub.add_parser("demo", help="swap a demo cache in and out; print GB/s and check bytes")
    d.add_argument("--reps", type=int, default=30)
    b = sub.add_parser("bench", help="the seed's table, or a sweep of your own")
    b.add_argument("--block-bytes", default=str(PAGE_BYTES), help="comma list, e.g. 4k,32k,2m")
    b.add_argument("--counts", default="1,1250", help="comma list of block counts")
    b.add_argument("--directions", default="in,out")
    b.add_argument("--layers", type=int, default=1, help="parts per side (layers x K/V)")
    b.add_argument("--contiguous", action="store_true", help="consecutive blocks instead of random")
    b.add_argument("--max-ctas", type=int, default=None, help="CTA budget (default: library default)")
    b.add_argument("--reps", type=int, default=30)
    b.add_argument("--no-baseline", action="store_true", help="skip one-memcpy-per-block")
    b.add_argument("--json", metavar="FILE", help="also write every figure to FILE")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.command in (None, "demo"):
        if args.command is None:
            args.reps = 30
        return cmd_demo(args)
    return cmd_bench(args)


if __name__ == "__main__":
    sys.exit(main())
