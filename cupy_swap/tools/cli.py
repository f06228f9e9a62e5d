"""Command line: ``python -m cupy_swap [demo|bench|info|calibrate] ...`` (also ``cupy-swap``).

``demo`` (the default) swaps a demo cache in and out, prints GB/s against the
contiguous-memcpy ceiling, and checks every byte.  ``bench`` prints the
default table (swap in / out of 1 and 1250 blocks of 32 KiB) or any sweep you
ask for, and charts the ``--peers`` comparison (``--plot``, also from a
stored run: ``--from-json``).  ``info`` says what the library found;
``calibrate`` stores per-device thresholds.

Arguments are checked (argparse, exit 2) before anything looks for a GPU,
and so are the combinations of ``bench`` options (an option a part of the
bench cannot honour is refused, not ignored) and ``--plot``'s need for
matplotlib; ``bench --gpus`` is checked against the GPU count as soon as CUDA
answers, and all of them before anything is measured.  Without CuPy or a
usable GPU every command but ``bench --from-json`` exits with
:data:`EXIT_NO_GPU` (3).  Options given without a command are the demo's
(``python -m cupy_swap --reps 5``).
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
from .peers import CONTENDER_COLUMNS, CONTENDER_LABELS, CONTENDERS, PEER_BLOCK_BYTES, PEER_COUNTS
from .plot import check_plot_file, load_run

BLOCK_BYTES = 16 * 8 * 128 * 2  # 16 tokens x 8 KV heads x 128 dims x fp16 = 32 KiB
BLOCK_TEXT = (
    "block = one layer's K or V cache for 16 tokens: "
    "16 tokens x 8 KV heads x 128 dims x fp16 = 32 KiB (vLLM, Llama-3-8B)"
)
DEMO_BLOCKS = 1250

EXIT_OK = 0
EXIT_MISMATCH = 1  # a swap's bytes did not match (demo, bench)
EXIT_USAGE = 2  # argparse's own code for a bad command line
EXIT_NO_GPU = 3  # no usable NVIDIA GPU: no driver, no device, driver too old, or no CuPy

# One line per command: the top-level --help lists them in plain text.
COMMANDS = {
    "demo": f"swap {DEMO_BLOCKS} random 32 KiB blocks out and in; print GB/s against memcpy; check every byte",
    "bench": f"the default table (1 and {DEMO_BLOCKS} blocks of 32 KiB, in and out), a sweep of your own, "
    "or a chart of GB/s by block size against other ways to swap",
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

# `bench --sweep wide`: small to large blocks, few to many, and a many-layer
# cache; `goals` is its former name, still accepted.
WIDE_SIZES = (4096, 32768, 256 << 10, 2 << 20)
SWEEPS = {"wide": "wide", "goals": "wide"}
WIDE_TEXT = (
    "wide: 4 KiB to 2 MiB blocks x 1, 16 and 1250; 10000 blocks of 4 and 32 KiB; "
    "1250 x 32 KiB in 64 parts (32 layers x K/V)"
)


def _wide_cases(directions=("in", "out")) -> list[SwapCase]:
    """The cases of ``bench --sweep wide`` in ``directions``."""
    cases = []
    for d in directions:
        for b in WIDE_SIZES:
            for n in (1, 16, 1250):
                cases.append(SwapCase(d, b, n))
        for b in (4096, 32768):
            cases.append(SwapCase(d, b, 10000))
        cases.append(SwapCase(d, 32768, 1250, parts=64))
    return cases


def demo_footprint(blocks: int = DEMO_BLOCKS, block_bytes: int = BLOCK_BYTES) -> int:
    """Bytes the demo allocates on each side (pinned host memory, and GPU
    memory) for one direction: :class:`cupy_swap.tools.bench.CaseBuffers`' cache of
    ``max(2 * blocks, blocks + 1)`` blocks plus one contiguous ``blocks``-block
    buffer for the memcpy ceiling.  The two directions run one after the
    other."""
    return (max(2 * blocks, blocks + 1) + blocks) * block_bytes


def cmd_demo(args) -> int:
    what = _require_gpu()
    print(f"cupy_swap {__version__} demo on {what}")
    print(BLOCK_TEXT)
    mb = demo_footprint() / 1e6
    print(f"allocates {mb:.0f} MB of pinned host memory and {mb:.0f} MB of GPU memory per direction")
    ok_all = True
    for direction in ("out", "in"):
        r = run_case(SwapCase(direction, BLOCK_BYTES, DEMO_BLOCKS), reps=args.reps, baseline=False)
        ok_all &= r["verified"]
        print(
            f"swap {direction:>3} {DEMO_BLOCKS} random blocks ({r['bytes'] / 1e6:.1f} MB): {r['gbps']:.1f} GB/s, "
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


def _sweep_arg(text: str) -> str:
    if text not in SWEEPS:
        raise argparse.ArgumentTypeError(f"expected wide, got {text!r}")
    return SWEEPS[text]


def _plot_file_arg(text: str) -> str:
    try:
        return check_plot_file(check_output_file(text))
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _stored_run_arg(text: str):
    """A report of ``bench --peers --json``, read and checked while parsing."""
    try:
        return load_run(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


class _Given(argparse.Action):
    """``store``, noting the option's dest in ``namespace.given``, so that
    ``bench`` can tell an option the user gave from one left at its default."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        namespace.given = getattr(namespace, "given", frozenset()) | {self.dest}


class _GivenFlag(_Given):
    """``store_true`` that notes the option as :class:`_Given` does."""

    def __init__(self, option_strings, dest, default=False, help=None):
        super().__init__(option_strings, dest, nargs=0, default=default, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        super().__call__(parser, namespace, True, option_string)


# `bench` options that shape the cases, and the parts of `bench` that honour
# each.  A running part refuses (exit 2) any given option it would ignore.
SHAPING = ("block_bytes", "counts", "directions", "layers", "contiguous", "modes", "max_ctas", "no_baseline")
PART_TAKES = {
    "the table": set(SHAPING),
    "--sweep wide": {"directions", "modes", "max_ctas", "no_baseline"},
    "--peers": {"block_bytes", "counts", "directions", "contiguous", "max_ctas"},
    "--bidir": {"block_bytes", "max_ctas"},
    "--with-gemm": set(),
    "--gpus": {"block_bytes"},
    "--host-time": {"counts"},
}
# What each part measures instead, said in its refusal.
PART_MEASURES = {
    "--sweep wide": "its own block sizes, counts and parts",
    "--peers": "one part of each case, cupy_swap in mode auto",
    "--bidir": "--bidir-blocks blocks each way, both directions at once, one part, mode auto",
    "--with-gemm": "one fixed case, 1250 x 32 KiB, at CTA budgets 4 to 32",
    "--gpus": "--gpu-blocks blocks per GPU in every direction, one part, mode auto",
    "--host-time": "swap-in of 32 KiB x 1 part and 4 KiB x 64 parts in every mode",
}
# Options that mean something to one part only.
OWNED = {"bidir_blocks": "--bidir", "bidir_rounds": "--bidir", "gpu_blocks": "--gpus", "drivers": "--gpus"}


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def bench_parts(args) -> list[str]:
    """The parts of ``bench`` that ``args`` runs, named as in :data:`PART_TAKES`."""
    flags = {
        "--peers": args.peers,
        "--bidir": args.bidir,
        "--with-gemm": args.with_gemm,
        "--gpus": args.gpus is not None,
        "--host-time": args.host_time,
    }
    parts = [name for name, on in flags.items() if on]
    if args.sweep:
        parts.append("--sweep wide")
    elif not parts:  # the table runs when nothing else is asked for
        parts.append("the table")
    return parts


def check_bench_options(args) -> None:
    """Refuse a ``bench`` command line that would ignore an option given.

    Raises
    ------
    ValueError
        Naming the options and why: ``--from-json`` with anything that
        measures, ``--plot`` without ``--peers`` or ``--from-json``, an option
        of a part that does not run, or an option a running part cannot honour.
    """
    given = getattr(args, "given", frozenset())
    if args.from_json is not None:
        extra = sorted(given - {"from_json", "plot"})
        if extra:
            raise ValueError(
                "argument --from-json: shows a stored run and measures nothing; "
                f"leave out {', '.join(map(_flag, extra))}"
            )
        return
    if args.plot and not args.peers:
        raise ValueError(
            "argument --plot: charts the measurements of --peers; add --peers, "
            "or chart a stored run with --from-json FILE"
        )
    parts = bench_parts(args)
    for dest, owner in OWNED.items():
        if dest in given and owner not in parts:
            raise ValueError(f"argument {_flag(dest)}: applies to {owner} only; add {owner} or leave it out")
    for part in parts:
        refused = [_flag(d) for d in SHAPING if d in given and d not in PART_TAKES[part]]
        if refused:
            them = "it" if len(refused) == 1 else "them"
            raise ValueError(
                f"{part} cannot honour {', '.join(refused)} (it measures {PART_MEASURES[part]}); "
                f"leave {them} out, or give {them} to a bench run without {part}"
            )


def _header(args) -> list[str]:
    head = environment_lines() + [swapper_settings()]  # the thresholds `auto` runs with
    for line in head:
        print(line)
    print(BLOCK_TEXT)
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


def _check_bench_usage(args) -> None:
    """Exit 2 (the command's usage line) for a combination ``bench`` would
    not honour, or ``--plot`` without matplotlib: before any GPU is looked
    for, so before anything is measured."""
    try:
        check_bench_options(args)
    except ValueError as e:
        args.command_parser.error(str(e))
    if args.plot:
        from .plot import matplotlib_missing

        missing = matplotlib_missing()
        if missing:
            args.command_parser.error(f"argument --plot: {missing}")


def _replot(args) -> int:
    """``bench --from-json FILE [--plot OUT]``: the stored peers table, and
    its chart; no GPU needed."""
    run = args.from_json
    print(f"stored run {run.path}, measured on:")
    for line in run.environment:
        print(f"  {line}")
    _print_peers_legend(all(r.get("contiguous") for r in run.rows))
    print(_peers_head())
    for r in run.rows:
        print(_peers_line(r))
    if args.plot:
        _write_plot(args.plot, run.rows, run.environment)
    return EXIT_OK


def cmd_bench(args) -> int:
    _check_bench_usage(args)
    if args.from_json is not None:
        return _replot(args)
    _require_gpu()
    if args.gpus is not None:  # usage error (exit 2) before anything is measured
        try:
            args.gpus = select_devices(args.gpus, _device_count())
        except ValueError as e:
            args.command_parser.error(f"argument --gpus: {e}")
    head = _header(args)
    report = {"environment": head, "page": BLOCK_TEXT, "argv": sys.argv[1:]}
    ok = True
    if args.bidir:
        report["bidir"] = rows = _bench_bidir(args)
        ok &= all(r["verified"] for r in rows)
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
        report["peers"] = rows = _bench_peers(args)
        ok &= all(r[name + "_ok"] for r in rows for name in CONTENDERS)
    if args.host_time:
        report["host_time"] = _bench_host_time(args)
    if "the table" in bench_parts(args) or args.sweep:
        report["results"] = results = _bench_table(args)
        ok &= all(r["verified"] for r in results)
    if args.json:
        _write_report(args.json, report)
    if args.plot:
        _write_plot(args.plot, report["peers"], head)
    return EXIT_OK if ok else EXIT_MISMATCH


def _bench_bidir(args) -> list:
    """``bench --bidir``: both directions at once, per block size and layout."""
    print(
        "\nfull duplex: swap-in and swap-out in flight together on two streams; GB/s of both "
        f"directions: one pair (blocking) and {args.bidir_rounds} pairs queued back to back"
    )
    rows = []
    for block in args.block_bytes:
        for layout, text in HOST_LAYOUTS.items():
            r = run_bidir(
                block,
                args.bidir_blocks,
                layout=layout,
                reps=args.reps,
                rounds=args.bidir_rounds,
                max_ctas=args.max_ctas,
            )
            rows.append(r)
            print(
                f"  {args.bidir_blocks} x {r['block_bytes'] // 1024} KiB each way, {text}: paths in/out "
                f"{'/'.join(r['paths'])}, {'ok' if r['verified'] else 'MISMATCH'}\n"
                f"      one pair {r['gbps']:6.1f} GB/s (memcpy pair {r['ceiling_gbps']:6.1f}, ratio "
                f"{r['ratio']:.3f}); sustained {r['sustained_gbps']:6.1f} GB/s (memcpy "
                f"{r['sustained_ceiling_gbps']:6.1f}, ratio {r['sustained_ratio']:.3f})"
            )
    return rows


def _bench_table(args) -> list:
    """The table: ``--sweep wide``'s cases, or every block size x count x
    direction asked for, in every mode asked for."""
    if args.sweep:
        cases = _wide_cases(args.directions)
    else:
        cases = [
            SwapCase(d, b, n, args.layers, args.contiguous)
            for b in args.block_bytes
            for n in args.counts
            for d in args.directions
        ]
    print()
    print(TABLE_HEAD)
    results = []
    bar = Progress(len(cases) * len(args.modes))
    for case in cases:
        for mode in args.modes:
            r = run_case(
                case, max_ctas=args.max_ctas, reps=args.reps, baseline=not args.no_baseline, mode=mode
            )
            results.append(r)
            bar.step(case.label())
            if not bar.enabled:
                print(_fmt_row(r), flush=True)
    bar.close()
    if bar.enabled:
        for r in results:
            print(_fmt_row(r))
    return results


def _chart_title(environment: list) -> str | None:
    """The GPU and its PCIe link, from a report's environment lines."""
    wanted = [line for line in environment if line.startswith(("GPU", "PCIe link"))]
    return "; ".join(wanted) or None


def _write_plot(path: str, rows: list, environment: list) -> None:
    """Chart ``rows`` into ``path``; should that fail after all (the path was
    checked before the run), keep the chart in a temporary file and say where."""
    from .plot import plot_peers

    title = _chart_title(environment)
    try:
        plot_peers(rows, path, title=title)
    except OSError as e:
        fd, spare = tempfile.mkstemp(prefix="cupy_swap-chart-", suffix=os.path.splitext(path)[1])
        os.close(fd)
        plot_peers(rows, spare, title=title)
        print(f"cupy_swap: could not write --plot {path} ({e}); the chart is in {spare}", file=sys.stderr)
        return
    print(f"\nchart: {path}")


def _peer_cases(args) -> list:
    """``--peers``' cases: the options given, the comparison grid otherwise."""
    from .peers import peer_cases

    given = getattr(args, "given", frozenset())
    return peer_cases(
        args.directions,
        args.block_bytes if "block_bytes" in given else PEER_BLOCK_BYTES,
        args.counts if "counts" in given else PEER_COUNTS,
        args.contiguous,
    )


def _print_peers_legend(contiguous: bool = False) -> None:
    blocks = "consecutive blocks" if contiguous else "random blocks"
    print(f"\nother ways to swap: blocking GB/s (submit + synchronize, median), one part, {blocks}")
    columns = {"memcpy": "one contiguous cudaMemcpyAsync of the same bytes (the ceiling)"}
    columns.update((CONTENDER_COLUMNS[n], CONTENDER_LABELS[n]) for n in CONTENDERS)
    for column, text in columns.items():
        print(f"  {column:<9} {text}")
    print("  * = fastest, ! = bytes did not match; auto path = what swap() chose")


def _peers_head() -> str:
    cells = " ".join(f"{CONTENDER_COLUMNS[n]:>9}" for n in CONTENDERS)
    return f"{'case':<22} {'memcpy':>7} {cells}  auto path"


def _peers_line(r: dict) -> str:
    """One row of the peers table; a contender the row lacks shows ``-``."""
    case = SwapCase(r["direction"], r["block_bytes"], r["num_blocks"])  # the legend says the layout
    cells = []
    for name in CONTENDERS:
        if name not in r:
            cells.append(f"{'-':>8} ")
            continue
        mark = "!" if not r.get(name + "_ok", True) else ("*" if r.get("lead") == name else " ")
        cells.append(f"{r[name]:8.2f}{mark}")
    return f"{case.label():<22} {r['ceiling_gbps']:7.2f} " + " ".join(cells) + f"  {r.get('path', '-')}"


def _bench_peers(args) -> list:
    """``bench --peers``: every contender of :mod:`cupy_swap.tools.peers` on
    each case, GB/s, the leader marked with ``*``."""
    from .peers import run_peers_case

    _print_peers_legend(args.contiguous)
    print(_peers_head())
    rows = []
    for case in _peer_cases(args):
        reps = min(args.reps, 20) if case.total_bytes > (1 << 28) else args.reps
        r = run_peers_case(case, reps=reps, max_ctas=args.max_ctas)
        rows.append(r)
        print(_peers_line(r), flush=True)
    return rows


def _bench_host_time(args) -> dict:
    """``bench --host-time``: host time per call against a bare memcpy call."""
    from .bench import run_host_time

    counts = args.counts if "counts" in getattr(args, "given", frozenset()) else (1, 16, 1250)
    result = run_host_time(counts=counts, reps=max(args.reps, 200))
    print(
        f"\nhost time per call (submit only, fastest of five round medians; swap-in), against a bare "
        f"cudaMemcpyAsync call timed in the same rounds: {result['memcpy_us']:.1f} us at best"
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
        # Without CuPy nothing is known about the GPUs: say what is missing, not "no GPU"; on
        # stderr, as every other command's diagnosis.
        missing = "CuPy: missing" if what.startswith("CuPy") else "GPU: none"
        print(f"cupy_swap: {missing} ({no_gpu_message(what)})", file=sys.stderr)
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


def _bench_examples(prog: str) -> str:
    lines = [
        ("--block-bytes 4k,2m --counts 16", "the table for your cases"),
        ("--peers --json peers.json --plot peers.png", "compare, store the figures, chart them"),
        ("--from-json peers.json --plot peers.png", "chart a stored run again (no GPU needed)"),
    ]
    return "examples:\n" + "\n".join(f"  {text}:\n    {prog} bench {args}" for args, text in lines)


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

    def command(name: str, epilog: str = ""):
        parser = sub.add_parser(
            name,
            prog=f"{prog} {name}",
            description=COMMANDS[name],
            epilog=f"{epilog}\n\n{EXIT_TEXT}" if epilog else EXIT_TEXT,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        parser.set_defaults(command_parser=parser)
        return parser

    d = command("demo")
    d.add_argument("--reps", type=_positive_int, default=30, help="timed repetitions per direction")
    b = command("bench", epilog=_bench_examples(prog))
    what = b.add_argument_group("what to measure (the default table when none of these is given)")
    what.add_argument(
        "--peers",
        action=_GivenFlag,
        help="GB/s against other ways to swap: the swap kernel of vLLM pull request 11531 (mapping uploaded "
        "per call, or already "
        "on the GPU), one memcpy per block from a CUDA graph, cuMemcpyBatchAsync, and the memcpy ceiling; "
        "4 KiB to 2 MiB x 1, 16, 1250 blocks, in and out (--block-bytes, --counts, --directions change that)",
    )
    what.add_argument(
        "--sweep",
        type=_sweep_arg,
        metavar="{wide}",
        help=f"a fixed sweep instead of the default table; {WIDE_TEXT}",
    )
    what.add_argument("--bidir", action=_GivenFlag, help="swap-in and swap-out together on two streams")
    what.add_argument(
        "--gpus",
        type=_gpus_arg,
        default=None,
        action=_Given,
        help="'all' or a comma list of GPU indices: all of them swapping at once (see --drivers)",
    )
    what.add_argument(
        "--host-time", action=_GivenFlag, help="host time per call, every mode, against a bare memcpy call"
    )
    what.add_argument("--with-gemm", action=_GivenFlag, help="interference with a matmul, CTA budgets 4-32")
    cases = b.add_argument_group(
        "cases (a part that cannot honour one of these refuses it: exit 2, before measuring)"
    )
    cases.add_argument(
        "--block-bytes",
        type=_sizes_arg,
        metavar="SIZES",
        default=str(BLOCK_BYTES),
        action=_Given,
        help="bytes per block, comma list, e.g. 4k,32k,2m (default 32k)",
    )
    cases.add_argument(
        "--counts",
        type=_counts_arg,
        metavar="COUNTS",
        default="1,1250",
        action=_Given,
        help="block counts, comma list (default 1,1250)",
    )
    cases.add_argument(
        "--directions",
        type=_choices_arg(("in", "out")),
        metavar="DIRS",
        default="in,out",
        action=_Given,
        help="in (host -> GPU), out (GPU -> host) or in,out (default)",
    )
    cases.add_argument(
        "--layers", type=_positive_int, default=1, action=_Given, help="parts per side (layers x K/V)"
    )
    cases.add_argument("--contiguous", action=_GivenFlag, help="consecutive blocks instead of random")
    cases.add_argument(
        "--modes",
        type=_choices_arg(("auto", "kernel", "dma", "staged")),
        metavar="MODES",
        default="auto",
        action=_Given,
        help="comma list of auto,kernel,dma,staged to compare",
    )
    cases.add_argument(
        "--max-ctas",
        type=_positive_int,
        metavar="N",
        default=None,
        action=_Given,
        help="CTA budget (default: library default)",
    )
    cases.add_argument("--no-baseline", action=_GivenFlag, help="skip the one-memcpy-per-block column")
    cases.add_argument(
        "--reps", type=_positive_int, default=30, action=_Given, help="timed repetitions per figure"
    )
    parts = b.add_argument_group("options of one part")
    parts.add_argument(
        "--bidir-blocks", type=_positive_int, default=1250, action=_Given, help="blocks each way for --bidir"
    )
    parts.add_argument(
        "--bidir-rounds",
        type=_positive_int,
        default=10,
        action=_Given,
        help="pairs queued back to back for --bidir's sustained figure",
    )
    parts.add_argument(
        "--gpu-blocks",
        type=_positive_int,
        default=1250,
        action=_Given,
        help="blocks per GPU and direction for --gpus",
    )
    parts.add_argument(
        "--drivers",
        type=_choices_arg(DRIVERS),
        default=",".join(DRIVERS),
        action=_Given,
        help="who submits the swaps of --gpus: a thread per GPU, one thread, a process per GPU",
    )
    out = b.add_argument_group("output")
    out.add_argument(
        "--json",
        metavar="FILE",
        type=_output_file_arg,
        action=_Given,
        help="also write every figure to FILE (its directory must exist and be writable)",
    )
    out.add_argument(
        "--plot",
        metavar="FILE",
        type=_plot_file_arg,
        action=_Given,
        help="chart --peers' GB/s by block size into FILE (.png, .svg or .pdf): one line per contender "
        "and the memcpy ceiling, one panel per direction and block count; needs matplotlib",
    )
    out.add_argument(
        "--from-json",
        metavar="FILE",
        type=_stored_run_arg,
        action=_Given,
        help="measure nothing: print the --peers table stored in FILE by --peers --json (and chart it "
        "with --plot); needs no GPU",
    )
    b.set_defaults(given=frozenset())
    i = command("info")
    i.set_defaults(reps=0)
    c = command("calibrate")
    c.add_argument("--reps", type=_positive_int, default=20, help="timed repetitions per measurement")
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
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["bench"] and "--remote" in argv:  # transfers to another process, through NIXL
        from .remote_bench import main as remote_main

        return remote_main([a for a in argv[1:] if a != "--remote"])
    args = parse_args(argv)
    return {"demo": cmd_demo, "bench": cmd_bench, "info": cmd_info, "calibrate": cmd_calibrate}[args.command](
        args
    )


if __name__ == "__main__":
    sys.exit(main())
