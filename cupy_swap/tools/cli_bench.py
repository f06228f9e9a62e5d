"""``bench``: the default table (swap in / out of 1 and 1250 blocks of 32 KiB)
or any sweep asked for, and its parts: ``--peers`` (other ways to swap, one
part), ``--engines`` (engine-shaped swaps against the engines' own
patterns), ``--captured`` (a replay of a swap captured into a CUDA graph
against the eager op: :mod:`cupy_swap.tools.captured_bench`), ``--bidir``,
``--gpus``, ``--host-time``, ``--with-gemm``; charts
(``--plot``, also from a stored run: ``--from-json``).  ``bench --remote``
is :mod:`cupy_swap.tools.remote_bench`'s, dispatched by :func:`.cli.main`.

Every option is checked while parsing, and their combinations by
:func:`check_bench_options` (an option a running part cannot honour is
refused, exit 2, not ignored), all before a GPU is looked for.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

from . import bench, captured_bench, engine_adapters, engines
from . import cli_common as common
from .bench import HOST_LAYOUTS, SwapCase
from .cli_demo import BLOCK_BYTES, BLOCK_TEXT
from .node import DRIVERS, select_devices
from .peers import CONTENDER_COLUMNS, CONTENDER_LABELS, CONTENDERS, PEER_BLOCK_BYTES, PEER_COUNTS
from .plot import check_plot_file, load_run

__all__ = [
    "SHAPING",
    "PART_TAKES",
    "PART_MEASURES",
    "OWNED",
    "TABLE_HEAD",
    "WIDE_TEXT",
    "bench_parts",
    "check_bench_options",
    "add_arguments",
    "bench_examples",
    "cmd_bench",
]


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


def _sweep_arg(text: str) -> str:
    if text not in SWEEPS:
        raise argparse.ArgumentTypeError(f"expected wide, got {text!r}")
    return SWEEPS[text]


def adapters_arg(text: str) -> list[str]:
    """``--adapters``: a comma list of the engines whose adapter rows
    ``--engines`` adds (``vllm``, ``sglang``), or ``none``."""
    names = common.choices_arg((*engine_adapters.ADAPTER_ENGINES, "none"))(text)
    if "none" in names:
        if len(names) > 1:
            raise argparse.ArgumentTypeError("'none' leaves every adapter row out: give it alone")
        return []
    return list(dict.fromkeys(names))


adapters_arg.__name__ = "comma list"  # argparse names the type in its messages


def _plot_file_arg(text: str) -> str:
    try:
        return check_plot_file(common.check_output_file(text))
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _stored_run_arg(text: str):
    """A report of ``bench --peers --json``, read and checked while parsing."""
    try:
        return load_run(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


SHAPING = ("block_bytes", "counts", "directions", "layers", "contiguous", "modes", "max_ctas", "no_baseline")
PART_TAKES = {
    "the table": set(SHAPING),
    "--sweep wide": {"directions", "modes", "max_ctas", "no_baseline"},
    "--peers": {"block_bytes", "counts", "directions", "contiguous", "max_ctas"},
    "--bidir": {"block_bytes", "max_ctas"},
    "--with-gemm": set(),
    "--gpus": {"block_bytes"},
    "--host-time": {"counts"},
    "--engines": {"counts", "directions"},
    "--captured": {"counts", "directions"},
}
# What each part measures instead, said in its refusal.
PART_MEASURES = {
    "--sweep wide": "its own block sizes, counts and parts",
    "--peers": "one part of each case, cupy_swap in mode auto",
    "--bidir": "--bidir-blocks blocks each way, both directions at once, one part, mode auto",
    "--with-gemm": "one fixed case, 1250 x 32 KiB, at CTA budgets 4 to 32",
    "--gpus": "--gpu-blocks blocks per GPU in every direction, one part, mode auto",
    "--host-time": "swap-in of 32 KiB x 1 part and 4 KiB x 64 parts in every mode",
    "--engines": "its own engine shapes (64 x 32 KiB, 61 x 72 KiB, 1 x 2 MiB), random blocks, mode auto",
    "--captured": "its own engine shapes (64 x 32 KiB, 61 x 72 KiB, 1 x 2 MiB), random blocks, device time",
}
# Options that mean something to one part only.
OWNED = {
    "bidir_blocks": "--bidir",
    "bidir_rounds": "--bidir",
    "gpu_blocks": "--gpus",
    "drivers": "--gpus",
    "adapters": "--engines",
}


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
        "--engines": args.engines,
        "--captured": args.captured,
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
        measures, ``--plot`` without one chart's source (``--peers``,
        ``--engines`` or ``--from-json``) or with both, an option
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
    if args.plot and not (args.peers or args.engines):
        raise ValueError(
            "argument --plot: charts the measurements of --peers or --engines; add one of them, "
            "or chart a stored run with --from-json FILE"
        )
    if args.plot and args.peers and args.engines:
        raise ValueError(
            "argument --plot: charts one part; run --peers and --engines separately to chart both"
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
    head = common.environment_lines() + [bench.swapper_settings()]  # the thresholds `auto` runs with
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
    """``bench --from-json FILE [--plot OUT]``: the stored peers or engines
    table, and its chart; no GPU needed."""
    run = args.from_json
    print(f"stored run {run.path}, measured on:")
    for line in run.environment:
        print(f"  {line}")
    if run.kind == "engines":
        _print_engines_table(run.rows)
        _print_adapters_table(_stored_adapters(run.path))
    else:
        _print_peers_legend(all(r.get("contiguous") for r in run.rows))
        print(_peers_head())
        for r in run.rows:
            print(_peers_line(r))
    if args.plot:
        _write_plot(args.plot, run.rows, run.environment, run.kind)
    return common.EXIT_OK


def cmd_bench(args) -> int:
    if args.remote:  # cli.main hands `bench --remote` to remote_bench before parsing
        args.command_parser.error("argument --remote: run it as `cupy-swap bench --remote ...`")
    if getattr(args, "pin", False):  # cli.main hands `bench --pin` to pin_bench before parsing
        args.command_parser.error("argument --pin: run it as `cupy-swap bench --pin ...`")
    _check_bench_usage(args)
    if args.from_json is not None:
        return _replot(args)
    common.require_gpu()
    if args.gpus is not None:  # usage error (exit 2) before anything is measured
        try:
            args.gpus = select_devices(args.gpus, common.device_count())
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
        rows = bench.run_with_gemm()
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
    if args.engines:
        report["engines"] = rows = _bench_engines(args, report)
        ok &= all(r.get(name + "_ok", False) for r in rows for name in engines.CONTENDERS)
        rows = _bench_adapters(args, report)
        ok &= all(
            r.get(c + "_ok", False) for r in rows for c in engine_adapters.ADAPTER_CONTENDERS[r["engine"]]
        )
    if args.captured:
        report["captured"] = rows = _bench_captured(args, report)
        ok &= all(r["replay_ok"] and r["eager_ok"] for r in rows)
    if "the table" in bench_parts(args) or args.sweep:
        report["results"] = results = _bench_table(args)
        ok &= all(r["verified"] for r in results)
    if args.json:
        common.write_report(args.json, report)
    if args.plot:
        kind = "engines" if args.engines else "peers"
        _write_plot(args.plot, report[kind], head, kind)
    return common.EXIT_OK if ok else common.EXIT_MISMATCH


def _bench_bidir(args) -> list:
    """``bench --bidir``: both directions at once, per block size and layout."""
    print(
        "\nfull duplex: swap-in and swap-out in flight together on two streams; GB/s of both "
        f"directions: one pair (blocking) and {args.bidir_rounds} pairs queued back to back"
    )
    rows = []
    for block in args.block_bytes:
        for layout, text in HOST_LAYOUTS.items():
            r = bench.run_bidir(
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
    bar = common.Progress(len(cases) * len(args.modes))
    for case in cases:
        for mode in args.modes:
            r = bench.run_case(
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


def _write_plot(path: str, rows: list, environment: list, kind: str = "peers") -> None:
    """Chart ``rows`` into ``path``; should that fail after all (the path was
    checked before the run), keep the chart in a temporary file and say where."""
    from .plot import plot_run

    title = common.chart_title(environment)
    try:
        plot_run(kind, rows, path, title=title)
    except OSError as e:
        fd, spare = tempfile.mkstemp(prefix="cupy_swap-chart-", suffix=os.path.splitext(path)[1])
        os.close(fd)
        plot_run(kind, rows, spare, title=title)
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


def _print_engines_table(rows: list) -> None:
    print()
    for line in engines.legend_lines():
        print(line)
    print(engines.table_head())
    for r in rows:
        print(engines.table_line(r))
    _print_engines_summary(rows)


def _print_engines_summary(rows: list) -> None:
    s = engines.summary(rows)
    if s["rows"]:
        low, high = s["host_ratio"]
        print(
            f"prepared at or above the best engine pattern in {s['prepared_leads']} of {s['rows']} rows "
            f"(at most {s['max_gain']:.2f}x its GB/s); the best engine pattern's host time is "
            f"{low:.1f}-{high:.1f}x prepared's"
        )
    line = engines.headline(rows)
    if line:
        print(f"headline: {line}")


def _bench_engines(args, report: dict) -> list:
    """``bench --engines``: each row printed as it is measured, and with
    ``--json`` stored at once (a long run that is cut short keeps its rows)."""
    given = getattr(args, "given", frozenset())
    counts = args.counts if "counts" in given else engines.ENGINE_COUNTS
    print()
    for line in engines.legend_lines():
        print(line)
    print(
        "figures: fastest round median of 3 rounds, the calls taking turns; GB/s = bytes / blocking "
        "latency (submit + synchronize); host us = submit alone"
    )
    print(engines.table_head(), flush=True)
    rows, on_row, on_skip = _streamed_rows(
        args,
        report,
        "engines",
        engines.table_line,
        lambda shape, n, why: f"{shape.label():<17} {n:>5}  left out: {why}",
    )
    measured = engines.run_engines(
        counts=counts, directions=args.directions, reps=args.reps, on_row=on_row, on_skip=on_skip
    )
    assert len(measured) == len(rows)
    _print_engines_summary(rows)
    return rows


def _print_adapters_table(rows: list) -> None:
    if not rows:
        return
    print()
    for line in engine_adapters.adapter_legend_lines():
        print(line)
    print(engine_adapters.adapter_table_head())
    for r in rows:
        print(engine_adapters.adapter_table_line(r))
    for line in engine_adapters.adapter_goal_lines(rows):
        print(line)


def _stored_adapters(path: str) -> list:
    """The ``"adapters"`` rows a stored ``bench --engines --json`` report
    holds (none in reports older than them)."""
    import json

    try:
        with open(path) as f:
            rows = json.load(f).get("adapters") or []
    except (OSError, ValueError, AttributeError):
        return []
    return [r for r in rows if isinstance(r, dict) and r.get("engine") in engine_adapters.ADAPTER_CONTENDERS]


def _bench_adapters(args, report: dict) -> list:
    """``bench --engines``' adapter rows (``--adapters``, default every
    engine): each printed as it is measured and, with ``--json``, stored at
    once under ``"adapters"``; then issue 51's goals against them."""
    keys = engine_adapters.adapter_shapes(args.adapters)
    if not keys:
        return []
    given = getattr(args, "given", frozenset())
    counts = args.counts if "counts" in given else engines.ENGINE_COUNTS
    print()
    for line in engine_adapters.adapter_legend_lines():
        print(line)
    print(engine_adapters.adapter_table_head(), flush=True)
    rows, on_row, on_skip = _streamed_rows(
        args, report, "adapters", engine_adapters.adapter_table_line, engine_adapters.adapter_skip_line
    )
    engine_adapters.run_adapters(
        keys, counts=counts, directions=args.directions, reps=args.reps, on_row=on_row, on_skip=on_skip
    )
    for line in engine_adapters.adapter_goal_lines(rows):
        print(line)
    return rows


def _streamed_rows(args, report: dict, key: str, line, skip_line) -> tuple:
    """``(rows, on_row, on_skip)`` for a mode that measures row by row:
    each row printed (``line(row)``) as it comes and, with ``--json``, the
    report stored at once (``report[key]`` is ``rows``); a case left out
    printed as ``skip_line(shape, n, why)``."""
    rows: list = []
    report[key] = rows

    def on_row(row):
        rows.append(row)
        print(line(row), flush=True)
        if args.json:
            common.write_report(args.json, report)

    def on_skip(shape, n, why):
        print(skip_line(shape, n, why), flush=True)

    return rows, on_row, on_skip


def _bench_captured(args, report: dict) -> list:
    """``bench --captured``: each row printed as it is measured, and with
    ``--json`` stored at once; ``--reps`` (when given) is the launches per
    timed batch."""
    given = getattr(args, "given", frozenset())
    counts = args.counts if "counts" in given else captured_bench.COUNTS
    replays = args.reps if "reps" in given else captured_bench.REPLAYS
    print()
    for line in captured_bench.legend_lines(replays):
        print(line)
    print(captured_bench.table_head(), flush=True)
    rows, on_row, on_skip = _streamed_rows(
        args, report, "captured", captured_bench.table_line, captured_bench.skip_line
    )
    captured_bench.run_captured(
        counts=counts, directions=args.directions, replays=replays, on_row=on_row, on_skip=on_skip
    )
    print(captured_bench.summary_line(rows))
    return rows


def bench_examples(prog: str) -> str:
    lines = [
        ("--block-bytes 4k,2m --counts 16", "the table for your cases"),
        ("--engines --json engines.json --plot engines.png", "engine-shaped swaps, stored and charted"),
        ("--captured --json captured.json", "a captured swap's replay against the eager op, device time"),
        ("--peers --json peers.json --plot peers.png", "compare, store the figures, chart them"),
        ("--from-json peers.json --plot peers.png", "chart a stored run again (no GPU needed)"),
    ]
    return "examples:\n" + "\n".join(f"  {text}:\n    {prog} bench {args}" for args, text in lines)


def add_arguments(b) -> None:
    """``bench``'s options on its parser ``b``: every one checked while
    parsing (exit 2 before any GPU is looked for); their combinations by
    :func:`check_bench_options`."""
    what = b.add_argument_group("what to measure (the default table when none of these is given)")
    what.add_argument(
        "--peers",
        action=common.GivenFlag,
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
    what.add_argument("--bidir", action=common.GivenFlag, help="swap-in and swap-out together on two streams")
    what.add_argument(
        "--gpus",
        type=common.gpus_arg,
        default=None,
        action=common.Given,
        help="'all' or a comma list of GPU indices: all of them swapping at once (see --drivers)",
    )
    what.add_argument(
        "--host-time",
        action=common.GivenFlag,
        help="host time per call, every mode, against a bare memcpy call",
    )
    what.add_argument(
        "--with-gemm", action=common.GivenFlag, help="interference with a matmul, CTA budgets 4-32"
    )
    what.add_argument(
        "--engines",
        action=common.GivenFlag,
        help="swaps shaped as engines make them (64 parts of 32 KiB, with separate host arrays and with "
        "one block-first host pool; 61 MLA parts of 72 KiB; one part of 2 MiB) x 1, 16, 256, 1250 blocks "
        "where memory allows, in and out, against the patterns engines use (the pull request's kernel "
        "once per part, vLLM V1's pointer lists + cuMemcpyBatchAsync) and the memcpy ceiling: GB/s and "
        "host us per call; then the adapters' rows (--adapters): cupy_swap.engines' vLLM worker driven as "
        "vLLM drives it against vLLM's worker pattern, its SGLang functions against SGLang's kernel as the "
        "host pool launches it, GB/s and host us per transfer (needs torch with CUDA) (--counts, "
        "--directions change that)",
    )
    what.add_argument(
        "--captured",
        action=common.GivenFlag,
        help="device time of one replay of a swap captured into a CUDA graph (PreparedSwap.captured) "
        "against the same swap by the prepared op with its rows on the GPU: engine shapes (64 parts of "
        "32 KiB, 61 MLA parts of 72 KiB, one part of 2 MiB) x 16, 256 blocks, in and out; CUDA events "
        f"around {captured_bench.REPLAYS} launches back to back, every case checked bit for bit "
        "(--counts, --directions, --reps change that)",
    )
    what.add_argument(
        "--remote",
        action="store_true",
        help="transfers to another process through NIXL; see `cupy-swap bench --remote --help`",
    )
    what.add_argument(  # issue 41: tools/pin_bench.py, dispatched by cli.main like --remote
        "--pin",
        action="store_true",
        help="seconds per GiB pinned (one call against chunks) and the longest stall another thread's swap "
        "sees while a pool pins; see `cupy-swap bench --pin --help`",
    )
    cases = b.add_argument_group(
        "cases (a part that cannot honour one of these refuses it: exit 2, before measuring)"
    )
    cases.add_argument(
        "--block-bytes",
        type=common.sizes_arg,
        metavar="SIZES",
        default=str(BLOCK_BYTES),
        action=common.Given,
        help="bytes per block, comma list, e.g. 4k,32k,2m (default 32k)",
    )
    cases.add_argument(
        "--counts",
        type=common.counts_arg,
        metavar="COUNTS",
        default="1,1250",
        action=common.Given,
        help="block counts, comma list (default 1,1250)",
    )
    cases.add_argument(
        "--directions",
        type=common.choices_arg(("in", "out")),
        metavar="DIRS",
        default="in,out",
        action=common.Given,
        help="in (host -> GPU), out (GPU -> host) or in,out (default)",
    )
    cases.add_argument(
        "--layers",
        type=common.positive_int,
        default=1,
        action=common.Given,
        help="parts per side (layers x K/V)",
    )
    cases.add_argument("--contiguous", action=common.GivenFlag, help="consecutive blocks instead of random")
    cases.add_argument(
        "--modes",
        type=common.choices_arg(("auto", "kernel", "dma", "staged")),
        metavar="MODES",
        default="auto",
        action=common.Given,
        help="comma list of auto,kernel,dma,staged to compare",
    )
    cases.add_argument(
        "--max-ctas",
        type=common.positive_int,
        metavar="N",
        default=None,
        action=common.Given,
        help="CTA budget (default: library default)",
    )
    cases.add_argument("--no-baseline", action=common.GivenFlag, help="skip the one-memcpy-per-block column")
    cases.add_argument(
        "--reps",
        type=common.positive_int,
        default=30,
        action=common.Given,
        help="timed repetitions per figure (--captured: launches per timed batch, default "
        f"{captured_bench.REPLAYS})",
    )
    parts = b.add_argument_group("options of one part")
    parts.add_argument(
        "--bidir-blocks",
        type=common.positive_int,
        default=1250,
        action=common.Given,
        help="blocks each way for --bidir",
    )
    parts.add_argument(
        "--bidir-rounds",
        type=common.positive_int,
        default=10,
        action=common.Given,
        help="pairs queued back to back for --bidir's sustained figure",
    )
    parts.add_argument(
        "--gpu-blocks",
        type=common.positive_int,
        default=1250,
        action=common.Given,
        help="blocks per GPU and direction for --gpus",
    )
    parts.add_argument(
        "--drivers",
        type=common.choices_arg(DRIVERS),
        default=",".join(DRIVERS),
        action=common.Given,
        help="who submits the swaps of --gpus: a thread per GPU, one thread, a process per GPU",
    )
    parts.add_argument(
        "--adapters",
        type=adapters_arg,
        metavar="ENGINES",
        default=",".join(engine_adapters.ADAPTER_ENGINES),
        action=common.Given,
        help="the engines whose adapter rows --engines adds: vllm, sglang (default both), or none",
    )
    out = b.add_argument_group("output")
    out.add_argument(
        "--json",
        metavar="FILE",
        type=common.output_file_arg,
        action=common.Given,
        help="also write every figure to FILE (its directory must exist and be writable)",
    )
    out.add_argument(
        "--plot",
        metavar="FILE",
        type=_plot_file_arg,
        action=common.Given,
        help="chart --peers' GB/s by block size (or --engines' by blocks per swap) into FILE (.png, .svg "
        "or .pdf): one line per contender and the memcpy ceiling, one panel per direction and block count "
        "(or shape); needs matplotlib",
    )
    out.add_argument(
        "--from-json",
        metavar="FILE",
        type=_stored_run_arg,
        action=common.Given,
        help="measure nothing: print the --peers or --engines table stored in FILE by --json (and chart "
        "it with --plot); needs no GPU",
    )
    b.set_defaults(given=frozenset())
