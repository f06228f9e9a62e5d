"""Command line: ``python -m cupy_swap [demo|bench|info|calibrate] ...`` (also ``cupy-swap``).

``demo`` (the default) swaps a demo cache in and out, prints GB/s against the
contiguous-memcpy ceiling, and checks every byte.  ``bench`` prints the
seed's table (swap in / out of 1 and 1250 pages) or any sweep you ask for.
``info`` says what the library found; ``calibrate`` stores per-device
thresholds.

Arguments are checked (argparse, exit 2) before anything looks for a GPU,
``bench --gpus`` against the GPU count as soon as CUDA answers, and all of
them before anything is measured; without CuPy or a usable GPU every command
exits with :data:`EXIT_NO_GPU` (3).  Options given without a command are the
demo's (``python -m cupy_swap --reps 5``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

from .. import __version__
from ..cuda.availability import no_gpu_message
from .bench import HOST_LAYOUTS, SwapCase, gpu_status, run_bidir, run_case, run_with_gemm, swapper_settings
from .node import DRIVERS, select_devices
from .peers import CONTENDERS as PEER_NAMES

PAGE_BYTES = 16 * 8 * 128 * 2  # 16 tokens x 8 KV heads x 128 dims x fp16 = 32 KiB
PAGE_TEXT = (
    "page = one block of one layer's K or V cache: "
    "16 tokens x 8 KV heads x 128 dims x fp16 = 32 KiB (vLLM, Llama-3-8B)"
)
DEMO_PAGES = 1250

EXIT_OK = 0
EXIT_MISMATCH = 1  # a swap's bytes did not match (demo, bench)
EXIT_USAGE = 2  # argparse's own code for a bad command line
EXIT_NO_GPU = 3  # no usable NVIDIA GPU: no driver, no device, driver too old, or no CuPy

# One line per command: the top-level --help lists them in plain text.
COMMANDS = {
    "demo": f"swap {DEMO_PAGES} random 32 KiB pages out and in; print GB/s against memcpy; check every byte",
    "bench": f"the seed's table (1 and {DEMO_PAGES} pages, in and out), or a sweep of your own",
    "info": "what the library found: GPUs, host mapping, copy engines, modes, calibration",
    "calibrate": "measure the kernel / copy-engine thresholds of this GPU and store them",
}


def _commands_text(prog: str) -> str:
    return (
        f"commands (demo runs when none is given, and options without a command are its own: "
        f"`{prog} --reps 5`):\n"
        + "\n".join(f"  {name:<10} {line}" for name, line in COMMANDS.items())
        + f"\n\n`{prog} COMMAND --help` lists a command's options."
    )


EXIT_TEXT = f"""\
exit status:
  {EXIT_OK}  success
  {EXIT_MISMATCH}  a swap's bytes did not match
  {EXIT_USAGE}  bad command line (checked before anything is measured; bench --gpus as soon as
     the GPU count is known, the rest before any GPU is looked for)
  {EXIT_NO_GPU}  no usable NVIDIA GPU (no driver, no device, a driver too old, or CuPy missing)"""


def _require_gpu() -> str:
    """The GPU's description, or exit :data:`EXIT_NO_GPU` saying what is
    missing: CuPy, or a usable GPU (and why)."""
    ok, what = gpu_status()
    if not ok:
        if what.startswith("CuPy"):  # gpu_status's reason when `import cupy` failed
            needs = f"CuPy (exit status {EXIT_NO_GPU}: CuPy missing)"
        else:
            needs = f"an NVIDIA GPU and its driver (exit status {EXIT_NO_GPU}: no usable GPU)"
        print(
            f"cupy_swap: {no_gpu_message(what)}.\nThis command needs {needs}.",
            file=sys.stderr,
        )
        raise SystemExit(EXIT_NO_GPU)
    return what


def _device_count() -> int:
    """CUDA devices visible to this process (CUDA is known to answer)."""
    from cupy.cuda import runtime

    return runtime.getDeviceCount()


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


def _fmt_row(r: dict) -> str:
    case = SwapCase(r["direction"], r["block_bytes"], r["num_blocks"], r["parts"], r["contiguous"])
    per_block = f"{r['per_block_gbps']:8.2f}" if "per_block_gbps" in r else "       -"
    flag = "ok" if r["verified"] else "MISMATCH"
    return (
        f"{case.label():<36} {r['mode']:<6} {r['path']:<6} {r['gbps']:8.2f} {r['ceiling_gbps']:8.2f} "
        f"{per_block} {r['ratio']:6.3f} {r['device_ratio']:6.3f} {r['latency_s'] * 1e6:10.1f}  {flag}"
    )


TABLE_HEAD = (
    f"{'case (dir, block x count)':<36} {'mode':<6} {'path':<6} {'GB/s':>8} {'memcpy':>8} {'per-blk':>8} "
    f"{'ratio':>6} {'dev':>6} {'latency':>10}  check\n"
    f"{'':<36} {'':<6} {'':<6} {'':>8} {'ceiling':>8} {'memcpy':>8} {'':>6} {'ratio':>6} {'us':>10}"
)

# The goal cases: `bench --sweep goals`.
GOAL_SIZES = (4096, 32768, 256 << 10, 2 << 20)


def _goal_cases() -> list[SwapCase]:
    cases = []
    for d in ("in", "out"):
        for b in GOAL_SIZES:
            for n in (1, 16, 1250):
                cases.append(SwapCase(d, b, n))
        for b in (4096, 32768):
            cases.append(SwapCase(d, b, 10000))
        cases.append(SwapCase(d, 32768, 1250, parts=64))
    return cases


def demo_footprint(pages: int = DEMO_PAGES, page_bytes: int = PAGE_BYTES) -> int:
    """Bytes the demo allocates on each side (pinned host memory, and GPU
    memory) for one direction: :class:`cupy_swap.tools.bench.CaseBuffers`' cache of
    ``max(2 * pages, pages + 1)`` blocks plus one contiguous ``pages``-block
    buffer for the memcpy ceiling.  The two directions run one after the
    other."""
    return (max(2 * pages, pages + 1) + pages) * page_bytes


def cmd_demo(args) -> int:
    what = _require_gpu()
    print(f"cupy_swap {__version__} demo on {what}")
    print(PAGE_TEXT)
    mb = demo_footprint() / 1e6
    print(f"allocates {mb:.0f} MB of pinned host memory and {mb:.0f} MB of GPU memory per direction")
    ok_all = True
    for direction in ("out", "in"):
        r = run_case(SwapCase(direction, PAGE_BYTES, DEMO_PAGES), reps=args.reps, baseline=False)
        ok_all &= r["verified"]
        print(
            f"swap {direction:>3} {DEMO_PAGES} random pages ({r['bytes'] / 1e6:.1f} MB): {r['gbps']:.1f} GB/s, "
            f"{r['ratio']:.2f} of a contiguous cudaMemcpyAsync ({r['ceiling_gbps']:.1f} GB/s); "
            f"bit-exact: {'yes' if r['verified'] else 'NO'}"
        )
    return EXIT_OK if ok_all else EXIT_MISMATCH


def _parse_sizes(text: str) -> list[int]:
    """``"4k,32KiB,2m,16b,48"`` -> byte counts.

    Raises
    ------
    ValueError
        For a token that is not a positive whole number with an optional
        ``b``, ``k``/``KiB`` or ``m``/``MiB`` suffix.
    """
    out = []
    for raw in text.split(","):
        tok = raw.strip().lower()
        mult = 1
        for suffix, m in (("kib", 1 << 10), ("k", 1 << 10), ("mib", 1 << 20), ("m", 1 << 20), ("b", 1)):
            if tok.endswith(suffix):
                tok, mult = tok[: -len(suffix)], m
                break
        if not tok.strip().isdigit() or int(tok) <= 0:
            raise ValueError(f"{raw.strip()!r} is not a size such as 4096, 4k, 32KiB or 2m")
        out.append(int(tok) * mult)
    return out


def _sizes_arg(text: str) -> list[int]:
    try:
        return _parse_sizes(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive whole number")
    return n


def _gpus_arg(text: str):
    if text == "all":
        return "all"
    try:
        devices = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected 'all' or a comma list of GPU indices, got {text!r}"
        ) from None
    if not devices or any(d < 0 for d in devices) or len(set(devices)) != len(devices):
        raise argparse.ArgumentTypeError(f"expected distinct non-negative GPU indices, got {text!r}")
    return devices


def check_output_file(path: str) -> str:
    """``path`` when a file can be written there, checked before a run so
    that its figures are not lost at the end.

    Parameters
    ----------
    path : str
        A file to create or overwrite.

    Returns
    -------
    str
        ``path`` unchanged.

    Raises
    ------
    ValueError
        When ``path`` is empty or a directory, its directory does not exist
        or is not a directory, or the file or its directory is not writable.
    """
    if not path:
        raise ValueError("expected a file name, got ''")
    if os.path.isdir(path):
        raise ValueError(f"expected a file name, got {path!r}, a directory")
    parent = os.path.dirname(path) or "."
    if not os.path.exists(parent):
        raise ValueError(f"expected an existing directory for {path!r}, but {parent!r} does not exist")
    if not os.path.isdir(parent):
        raise ValueError(f"expected a directory for {path!r}, but {parent!r} is not one")
    if os.path.exists(path):
        if not os.access(path, os.W_OK):
            raise ValueError(f"expected a writable file, but {path!r} is not writable")
    elif not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"expected a writable directory for {path!r}, but {parent!r} is not writable")
    return path


def _output_file_arg(text: str) -> str:
    try:
        return check_output_file(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _counts_arg(text: str) -> list[int]:
    return [_positive_int(t.strip()) for t in text.split(",")]


def _choices_arg(allowed: tuple[str, ...]):
    def parse(text: str) -> list[str]:
        out = [t.strip() for t in text.split(",")]
        bad = [t for t in out if t not in allowed]
        if bad:
            raise argparse.ArgumentTypeError(
                f"{', '.join(map(repr, bad))} not among {', '.join(allowed)} (a comma list of those)"
            )
        return out

    parse.__name__ = "comma list"  # argparse names the type in its messages
    return parse


def _header(args) -> list[str]:
    head = environment_lines() + [swapper_settings()]  # the thresholds `auto` runs with
    for line in head:
        print(line)
    print(PAGE_TEXT)
    print(
        f"figures: blocking latency (submit + synchronize), median of {args.reps}; GB/s = 1e9 B/s; "
        "ratio = cupy_swap / one contiguous cudaMemcpyAsync of the same bytes; dev = device-event ratio"
    )
    return head


def _bench_gpus(args) -> list[dict]:
    """``bench --gpus``: every listed GPU swapping at once (tools/node.py);
    ``args.gpus`` is already checked against this machine's GPUs."""
    from .node import run_node

    devices = args.gpus
    print(
        f"\n{len(devices)} GPU(s) {devices} at once, one swapper each, one pinned pool (one "
        f"shared_pinned pool for processes); {args.gpu_blocks} random blocks per GPU and direction; "
        f"GB/s of all GPUs together per step (barrier-aligned, first start to last end, median of "
        f"{args.reps}); ratio to one contiguous memcpy per GPU and direction, same harness"
    )
    results = []
    for block in args.block_bytes:
        print(f"block {block // 1024} KiB:", flush=True)
        results.append(
            run_node(
                devices,
                block_bytes=block,
                n=args.gpu_blocks,
                reps=args.reps,
                drivers=args.drivers,
                progress=lambda line: print(line, flush=True),
            )
        )
    return results


def _write_report(path: str, report: dict) -> None:
    """Write ``report`` as JSON to ``path``; should that fail after all (the
    path was checked before the run), keep the figures in a temporary file
    and say where."""
    try:
        with open(path, "w") as f:
            json.dump(report, f, indent=1)
    except OSError as e:
        fd, spare = tempfile.mkstemp(prefix="cupy_swap-bench-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump(report, f, indent=1)
        print(f"cupy_swap: could not write --json {path} ({e}); the figures are in {spare}", file=sys.stderr)


def cmd_bench(args) -> int:
    _require_gpu()
    if args.gpus is not None:  # usage error (exit 2) before anything is measured
        try:
            args.gpus = select_devices(args.gpus, _device_count())
        except ValueError as e:
            args.command_parser.error(f"argument --gpus: {e}")
    head = _header(args)
    report = {"environment": head, "page": PAGE_TEXT, "argv": sys.argv[1:]}
    ok = True
    if args.bidir:
        print(
            "\nfull duplex: swap-in and swap-out in flight together on two streams; GB/s of both "
            f"directions: one pair (blocking) and {args.bidir_rounds} pairs queued back to back"
        )
        rows = []
        for layout, text in HOST_LAYOUTS.items():
            r = run_bidir(
                args.block_bytes[0],
                args.bidir_blocks,
                layout=layout,
                reps=args.reps,
                rounds=args.bidir_rounds,
                max_ctas=args.max_ctas,
            )
            rows.append(r)
            ok &= r["verified"]
            print(
                f"  {args.bidir_blocks} x {r['block_bytes'] // 1024} KiB each way, {text}: paths in/out "
                f"{'/'.join(r['paths'])}, {'ok' if r['verified'] else 'MISMATCH'}\n"
                f"      one pair {r['gbps']:6.1f} GB/s (memcpy pair {r['ceiling_gbps']:6.1f}, ratio "
                f"{r['ratio']:.3f}); sustained {r['sustained_gbps']:6.1f} GB/s (memcpy "
                f"{r['sustained_ceiling_gbps']:6.1f}, ratio {r['sustained_ratio']:.3f})"
            )
        report["bidir"] = rows
    if args.with_gemm:
        print("\ninterference: 8192^3 fp16 matmul on one stream, swaps (1250 x 32 KiB, in/out) on another")
        rows = run_with_gemm()
        for r in rows:
            print(
                f"  max_ctas={r['max_ctas']:>3}: matmul {r['gemm_alone_ms']:.2f} -> {r['gemm_beside_swaps_ms']:.2f} ms "
                f"(+{100 * r['gemm_slowdown']:.1f}%), swaps {r['swap_gbps']:.1f} GB/s"
            )
        report["with_gemm"] = rows
    if args.gpus is not None:
        report["gpus"] = rows = _bench_gpus(args)
        ok &= all(r["verified"] for result in rows for r in result["together"])
    if args.peers:
        report["peers"] = rows = _bench_peers(args.reps)
        ok &= all(r[name + "_ok"] for r in rows for name in PEER_NAMES)
    if args.host_time:
        report["host_time"] = _bench_host_time(args.reps)
    if (
        not (args.bidir or args.with_gemm or args.peers or args.host_time or args.gpus is not None)
        or args.sweep
    ):
        if args.sweep == "goals":
            cases = _goal_cases()
        else:
            cases = [
                SwapCase(d, b, n, args.layers, args.contiguous)
                for b in args.block_bytes
                for n in args.counts
                for d in args.directions
            ]
        modes = args.modes
        print()
        print(TABLE_HEAD)
        results = []
        bar = Progress(len(cases) * len(modes))
        for case in cases:
            for mode in modes:
                r = run_case(
                    case, max_ctas=args.max_ctas, reps=args.reps, baseline=not args.no_baseline, mode=mode
                )
                results.append(r)
                ok &= r["verified"]
                bar.step(case.label())
                if not bar.enabled:
                    print(_fmt_row(r), flush=True)
        bar.close()
        if bar.enabled:
            for r in results:
                print(_fmt_row(r))
        report["results"] = results
    if args.json:
        _write_report(args.json, report)
    return EXIT_OK if ok else EXIT_MISMATCH


PEER_HEAD = ("seed+up", "seed", "graph", "batch", "swap()", "prepared")


def _bench_peers(reps: int) -> list:
    """``bench --peers``: every contender of :mod:`cupy_swap.peers` on the
    24 cases, GB/s, the leader marked with ``*``."""
    from .peers import PEER_CASES, run_peers_case

    print(
        "\npeers: blocking GB/s (submit + synchronize, median), one part, random distinct blocks; "
        "* = fastest contender; seed+up = the seed's kernel with the mapping uploaded per call, "
        "seed = with the mapping already on the GPU, graph = one cudaMemcpyAsync per block "
        "replayed from a CUDA graph, batch = cuMemcpyBatchAsync with prebuilt arrays (one copy: "
        "cudaMemcpyAsync); ! = bytes did not match"
    )
    print(f"{'case':<22} {'memcpy':>7} " + " ".join(f"{h:>9}" for h in PEER_HEAD) + "  auto path")
    rows = []
    for case in PEER_CASES:
        r = run_peers_case(case, reps=min(reps, 20) if case.total_bytes > (1 << 28) else reps)
        rows.append(r)
        cells = []
        for name in PEER_NAMES:
            mark = "!" if not r[name + "_ok"] else ("*" if r["lead"] == name else " ")
            cells.append(f"{r[name]:8.2f}{mark}")
        print(
            f"{case.label():<22} {r['ceiling_gbps']:7.2f} " + " ".join(cells) + f"  {r['path']}", flush=True
        )
    return rows


def _bench_host_time(reps: int) -> dict:
    """``bench --host-time``: host time per call against a bare memcpy call."""
    from .bench import run_host_time

    result = run_host_time(reps=max(reps, 200))
    print(
        f"\nhost time per call (submit only, median; swap-in), against a bare cudaMemcpyAsync call: "
        f"{result['memcpy_us']:.1f} us"
    )
    print(f"{'parts x block':<16} {'n':>5} {'mode':<7} {'form':<9} {'path':<7} {'us':>8} {'x memcpy':>9}")
    for r in result["rows"]:
        print(
            f"{r['parts']:>3} x {r['block_bytes'] // 1024:>3} KiB    {r['n']:>5} {r['mode']:<7} {r['form']:<9} "
            f"{r['path']:<7} {r['host_us']:8.1f} {r['ratio']:9.2f}"
        )
    return result


def cmd_info(args) -> int:
    from ..cuda import copy_engine as dma
    from ..cuda import memory

    ok, what = gpu_status()
    print(f"cupy_swap {__version__}")
    if not ok:
        # Without CuPy nothing is known about the GPUs: say what is missing, not "no GPU".
        print(f"{'CuPy: missing' if what.startswith('CuPy') else 'GPU: none'} ({no_gpu_message(what)})")
        return EXIT_NO_GPU
    import cupy
    from cupy.cuda import runtime

    for line in environment_lines():
        print(line)
    for dev in range(runtime.getDeviceCount()):
        props = runtime.getDeviceProperties(dev)
        name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
        attr = lambda a, dev=dev: runtime.deviceGetAttribute(a, dev)  # noqa: E731
        mapped, why = memory.host_mapping_status(dev)
        print(f"GPU {dev}: {name}, compute capability {props['major']}.{props['minor']}")
        print(f"  SMs: {props['multiProcessorCount']}, memory: {props['totalGlobalMem'] / 2**30:.1f} GiB")
        print(f"  unified addressing: {bool(attr(runtime.cudaDevAttrUnifiedAddressing))}")
        print(f"  can map host memory: {bool(attr(runtime.cudaDevAttrCanMapHostMemory))}")
        print(f"  copy engines (async engine count): {attr(runtime.cudaDevAttrAsyncEngineCount)}")
        print(f"  host memory reachable by kernels: {'yes' if mapped else 'no'} ({why})")
        modes = (
            ["auto", "kernel", "dma", "staged"]
            if mapped
            else ["auto (dma or staged for host arrays)", "dma", "staged", "kernel (GPU->GPU only)"]
        )
        print(f"  modes: {', '.join(modes)}")
    print(
        f"cuMemcpyBatchAsync: {'available' if dma.batch_available() else 'not available (one memcpy per copy)'}"
    )
    from ..cuda.settings import calibration_path, load_calibration

    path = calibration_path(runtime.getDevice())
    cal = load_calibration(runtime.getDevice())
    print(f"calibration: {path} ({'loaded: ' + json.dumps(cal) if cal else 'none; built-in defaults'})")
    print(f"CuPy {cupy.__version__}")
    return 0


def cmd_calibrate(args) -> int:
    _require_gpu()
    from .calibrate import calibrate

    result, path = calibrate(reps=args.reps, progress=print)
    print(f"wrote {path}: {json.dumps(result)}")
    return EXIT_OK


def default_prog() -> str:
    """How the user ran the command line: ``python -m cupy_swap`` or
    ``cupy-swap`` (the console script, and anything else)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return "python -m cupy_swap" if getattr(spec, "name", None) == "cupy_swap.__main__" else "cupy-swap"


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    """The command line.  Every argument is checked here, so a bad one is
    reported (exit 2) before any command looks for a GPU; ``bench --gpus``
    is checked against the GPU count by :func:`cmd_bench`, through
    ``args.command_parser`` (each command's own parser, whose usage line its
    errors print).

    Parameters
    ----------
    prog : str, optional
        The program name in usage lines; :func:`default_prog` by default.
        A command's parser is named ``"{prog} {command}"``.
    """
    prog = prog or default_prog()
    p = argparse.ArgumentParser(
        prog=prog,
        usage="%(prog)s [-h] [--version] [COMMAND] [options]",
        description="Swap paged KV-cache blocks between GPU memory and pinned host memory; "
        "measure and check it on this machine.",
        epilog=f"{_commands_text(prog)}\n\n{EXIT_TEXT}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"cupy_swap {__version__}")
    # The commands are listed once, in the epilog; argparse's own list is hidden.
    sub = p.add_subparsers(dest="command", metavar="COMMAND", help=argparse.SUPPRESS)

    def command(name: str):
        parser = sub.add_parser(
            name,
            prog=f"{prog} {name}",
            description=COMMANDS[name],
            epilog=EXIT_TEXT,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        parser.set_defaults(command_parser=parser)
        return parser

    d = command("demo")
    d.add_argument("--reps", type=_positive_int, default=30, help="timed repetitions per direction")
    b = command("bench")
    b.add_argument(
        "--block-bytes", type=_sizes_arg, default=str(PAGE_BYTES), help="comma list, e.g. 4k,32k,2m"
    )
    b.add_argument("--counts", type=_counts_arg, default="1,1250", help="comma list of block counts")
    b.add_argument(
        "--directions", type=_choices_arg(("in", "out")), default="in,out", help="in, out or in,out"
    )
    b.add_argument("--layers", type=_positive_int, default=1, help="parts per side (layers x K/V)")
    b.add_argument("--contiguous", action="store_true", help="consecutive blocks instead of random")
    b.add_argument(
        "--max-ctas", type=_positive_int, default=None, help="CTA budget (default: library default)"
    )
    b.add_argument(
        "--modes",
        type=_choices_arg(("auto", "kernel", "dma", "staged")),
        default="auto",
        help="comma list of auto,kernel,dma,staged to compare",
    )
    b.add_argument("--sweep", choices=("goals",), help="the performance goals' cases instead of the table")
    b.add_argument("--bidir", action="store_true", help="swap-in and swap-out together on two streams")
    b.add_argument("--bidir-blocks", type=_positive_int, default=1250)
    b.add_argument(
        "--bidir-rounds",
        type=_positive_int,
        default=10,
        help="pairs queued back to back for the sustained figure",
    )
    b.add_argument(
        "--gpus",
        type=_gpus_arg,
        default=None,
        help="'all' or a comma list of GPU indices: all of them swapping at once (see --drivers)",
    )
    b.add_argument(
        "--gpu-blocks", type=_positive_int, default=1250, help="blocks per GPU and direction for --gpus"
    )
    b.add_argument(
        "--drivers",
        type=_choices_arg(DRIVERS),
        default=",".join(DRIVERS),
        help="who issues the swaps of --gpus: a thread per GPU, one thread, a process per GPU",
    )
    b.add_argument("--with-gemm", action="store_true", help="interference with a matmul, CTA budgets 4-32")
    b.add_argument(
        "--peers",
        action="store_true",
        help="the seed's kernel, per-block memcpy in a CUDA graph and cuMemcpyBatchAsync beside cupy_swap",
    )
    b.add_argument(
        "--host-time", action="store_true", help="host time per call, every mode, against a bare memcpy call"
    )
    b.add_argument("--reps", type=_positive_int, default=30)
    b.add_argument("--no-baseline", action="store_true", help="skip one-memcpy-per-block")
    b.add_argument(
        "--json",
        metavar="FILE",
        type=_output_file_arg,
        help="also write every figure to FILE (its directory must exist and be writable)",
    )
    i = command("info")
    i.set_defaults(reps=0)
    c = command("calibrate")
    c.add_argument("--reps", type=_positive_int, default=20)
    return p


def _is_top_level_option(token: str) -> bool:
    """``-h``, ``--help``, ``--version`` or an abbreviation argparse takes for one."""
    return token == "-h" or (len(token) > 2 and any(o.startswith(token) for o in ("--help", "--version")))


def parse_args(argv=None, prog: str | None = None) -> argparse.Namespace:
    """Parse a command line (``sys.argv[1:]`` by default).  With no command,
    the demo runs, and options before any command are the demo's:
    ``--reps 5`` is ``demo --reps 5``; ``-h`` and ``--version`` stay the top
    level's.

    Raises
    ------
    SystemExit
        Code 2 (argparse) for a bad command line, 0 after ``--help`` or
        ``--version``.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or (argv[0].startswith("-") and not _is_top_level_option(argv[0])):
        argv = ["demo", *argv]
    args, extra = build_parser(prog).parse_known_args(argv)
    if extra:  # argparse leaves these to the top level; the command's own usage says more
        args.command_parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    return {"demo": cmd_demo, "bench": cmd_bench, "info": cmd_info, "calibrate": cmd_calibrate}[args.command](
        args
    )


if __name__ == "__main__":
    sys.exit(main())
