"""Turn stored device runs into the markdown the project's pages quote.

    python benchmarks/make_tables.py --page benchmarks/results COMMIT [--engines-at COMMIT] > benchmarks/results/README.md
    python benchmarks/make_tables.py --peers peers.json    # the README's performance table
    python benchmarks/make_tables.py --gpus gpus.json      # the two-GPU table (bench --gpus)
    python benchmarks/make_tables.py --bench DIR COMMIT    # the tables of `run_device.sh bench`
    python benchmarks/make_tables.py --readme DIR COMMIT   # the README tables of 0.1.0
    python benchmarks/make_tables.py --counts benchmarks/results   # the README's engines counts

``--page`` writes the current results page from the stored run in a
folder: ``peers.json`` (``bench --peers --json``, measured at COMMIT) and,
where present, ``peers_chart.png``, ``engines.json`` (``bench --engines
--json``, the same call) with ``engines_chart.png``, ``host_time.log``,
``captured.log`` (``bench --captured``) and
``pytest.log``.
Every figure the README quotes is a copy of one on that page.
"""

import argparse
import json
from pathlib import Path

FILES_NOTE = """
## Files

- `seed_table.json`, `goals.json`, `duplex.json`: `python -m cupy_swap bench ... --json`.
- `staged_sweep.txt`: `benchmarks/staged_sweep.py`, kernel against staged swaps by size.
- `pytest_benchmark.json`: the pytest-benchmark suite on its 32 KiB x 1250 and 2 MiB x 1 cases.
- `pytest.log`, `goals.log`: the full test run on the device and the sweep's console output.
- `pytest_x2.log`: the full test run on two H200s (`nvidia-h200-x2`), multi-GPU tests included,
  on a later commit (named in its second line).
- `earlier/`: results of earlier commits that NOTES.md quotes (each file names its commit there).

Every file here was written by one call of `benchmarks/run_device.sh` on the commit above.
"""


def size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB" if n >= 1024 else f"{n} B"


def yes(flag: bool) -> str:
    return "yes" if flag else "NO"


def table(columns: list, rows: list) -> list:
    """A markdown table."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    return lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]


def case_rows(results: list) -> list:
    return [
        [
            r["direction"],
            size(r["block_bytes"]),
            r["num_blocks"],
            r["parts"],
            r["mode"],
            r["path"],
            f"{r['gbps']:.2f}",
            f"{r['ceiling_gbps']:.2f}",
            f"{r['ratio']:.3f}",
            f"{r['device_ratio']:.3f}",
            f"{r['latency_s'] * 1e6:.1f}",
            f"{r['per_block_gbps']:.2f}" if "per_block_gbps" in r else "-",
            yes(r["verified"]),
        ]
        for r in results
    ]


CASE_COLUMNS = [
    "dir", "block", "n", "parts", "mode", "path", "GB/s", "memcpy ceiling GB/s", "ratio",
    "device ratio", "latency us", "per-block memcpy GB/s", "bit-exact",
]  # fmt: skip


BIDIR_COLUMNS = [
    "blocks each way", "host layout", "paths in/out", "one pair GB/s", "memcpy pair GB/s", "ratio",
    "sustained GB/s", "memcpy sustained GB/s", "ratio", "bit-exact",
]  # fmt: skip


def bidir_table(duplex: dict) -> list:
    """The full-duplex table of a ``bench --bidir --json`` report."""
    rows = [
        [
            f"{r['num_blocks']} x {size(r['block_bytes'])}",
            r.get("layout", "contiguous" if r.get("contiguous") else "random"),
            "/".join(r["paths"]),
            f"{r['gbps']:.1f}",
            f"{r['ceiling_gbps']:.1f}",
            f"{r['ratio']:.3f}",
            f"{r['sustained_gbps']:.1f}" if "sustained_gbps" in r else "-",
            f"{r['sustained_ceiling_gbps']:.1f}" if "sustained_gbps" in r else "-",
            f"{r['sustained_ratio']:.3f}" if "sustained_gbps" in r else "-",
            yes(r["verified"]),
        ]
        for r in duplex.get("bidir", [])
    ]
    return table(BIDIR_COLUMNS, rows)


def _find(results: list, **want) -> dict:
    (row,) = [r for r in results if all(r[k] == v for k, v in want.items())]
    return row


def readme_tables(src: Path, commit: str) -> list:
    """The README's tables, each with the file and command behind it."""
    seed = json.loads((src / "seed_table.json").read_text())["results"]
    duplex = json.loads((src / "duplex.json").read_text())
    rows = {
        d: _find(seed, direction=d, block_bytes=32768, num_blocks=1250, mode="auto") for d in ("in", "out")
    }
    out = [f"<!-- made by: python benchmarks/make_tables.py --readme benchmarks/results {commit} -->", ""]
    out += ["| | swap in | swap out |", "|---|---|---|"]
    out.append(
        "| one `cudaMemcpyAsync` per block (the old way) | "
        + " | ".join(f"{rows[d]['per_block_gbps']:.1f} GB/s" for d in ("in", "out"))
        + " |"
    )
    out.append(
        "| **cupy_swap** (`auto`: one kernel launch) | "
        + " | ".join(
            f"**{rows[d]['gbps']:.1f} GB/s** ({rows[d]['ratio']:.2f} of memcpy)" for d in ("in", "out")
        )
        + " |"
    )
    goals = json.loads((src / "goals.json").read_text())["results"]
    again = {d: _find(goals, direction=d, block_bytes=32768, num_blocks=1250, parts=1) for d in ("in", "out")}
    out.append(
        "| cupy_swap again, later in the same run (goal sweep) | "
        + " | ".join(f"{again[d]['gbps']:.1f} GB/s ({again[d]['ratio']:.2f})" for d in ("in", "out"))
        + " |"
    )
    out.append(
        "| one contiguous `cudaMemcpyAsync` of the same bytes (ceiling) | "
        + " | ".join(f"{rows[d]['ceiling_gbps']:.1f} GB/s" for d in ("in", "out"))
        + " |"
    )
    out += ["", "Full duplex:", ""]
    out += ["| host blocks | paths in/out | sustained (pairs queued) | ratio | one pair, blocking | ratio |"]
    out += ["|---|---|---|---|---|---|"]
    names = {
        "random": "random, both sides",
        "host-runs": "one run, GPU blocks random",
        "contiguous": "one run, both sides",
    }
    for r in duplex.get("bidir", []):
        out.append(
            f"| {names.get(r['layout'], r['layout'])} | {'/'.join(r['paths'])} | "
            f"{r['sustained_gbps']:.1f} GB/s ({r['rounds']} pairs) | {r['sustained_ratio']:.3f} | "
            f"{r['gbps']:.1f} GB/s | {r['ratio']:.3f} |"
        )
    out += [
        "",
        "CTA budget:",
        "",
        "| `max_ctas` | matmul slowdown | swap GB/s during the matmul |",
        "|---|---|---|",
    ]
    for r in duplex.get("with_gemm", []):
        out.append(f"| {r['max_ctas']} | +{100 * r['gemm_slowdown']:.0f}% | {r['swap_gbps']:.1f} |")
    return out


# The other ways to swap that bench --peers measures, none of which checks
# the mapping or returns an event; and what each column of the page holds.
OTHERS = ("seed_upload", "seed_resident", "graph_memcpy", "batch_memcpy")
ARROWS = {"in": "host -> GPU", "out": "GPU -> host"}
PAGE_LEGEND = (
    "- `memcpy`: one contiguous `cudaMemcpyAsync` of the same bytes, the ceiling.",
    "- `ref+map`, `ref`: the swap kernel proposed in vLLM pull request 11531 (one CTA of 1024 "
    "threads per block), its mapping uploaded per call or already on the GPU.",
    "- `graph`: one `cudaMemcpyAsync` per block, replayed from a prebuilt CUDA graph.",
    "- `batch`: one `cuMemcpyBatchAsync` call with prebuilt address arrays.",
    "- `swap()`: cupy_swap's one-off call; `prepared`: a call of an op made once by `sw.prepare()`.",
    "- `of best`: `prepared` divided by the fastest of `ref+map`, `ref`, `graph` and `batch`.",
    '- `path`: what `mode="auto"` chose: `kernel` (one launch) or `dma` (the copy engines).',
)


def gbps(x: float) -> str:
    return f"{x:.2f}" if x < 10 else f"{x:.1f}"


def best_other(row: dict) -> str:
    """The fastest of the other ways on one ``bench --peers`` row (of those whose copy was exact)."""
    return max((k for k in OTHERS if row.get(k + "_ok", True)), key=lambda k: row[k])


def peers_table(peers_json: Path) -> list:
    """The README's performance table from a stored ``bench --peers --json``:
    per case the memcpy ceiling, the fastest other contender and cupy_swap."""
    from cupy_swap.tools.peers import CONTENDER_COLUMNS

    rows = json.loads(peers_json.read_text())["peers"]
    out = [
        "| direction | blocks | memcpy ceiling | best other way | cupy_swap prepared | cupy_swap `swap()` |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        best = best_other(r)
        arrow = ARROWS[r["direction"]]
        mark = {k: "**" if r[k] >= r[best] else "" for k in ("cupy_swap", "cupy_swap_prepared")}
        out.append(
            f"| {arrow} | {r['num_blocks']} x {size(r['block_bytes'])} | {gbps(r['ceiling_gbps'])} | "
            f"{gbps(r[best])} ({CONTENDER_COLUMNS[best]}) | {mark['cupy_swap_prepared']}"
            f"{gbps(r['cupy_swap_prepared'])}{mark['cupy_swap_prepared']} | {mark['cupy_swap']}"
            f"{gbps(r['cupy_swap'])}{mark['cupy_swap']} |"
        )
    return out


# Ratio to the memcpy aggregate of the same driver that a two-GPU row should
# reach, per (driver, block bytes); other cases have no goal.
GPUS_GOALS = {("threads", 32 << 10): 0.90, ("one-thread", 32 << 10): 0.92, ("processes", 32 << 10): 0.92}
GPUS_GOALS.update({(driver, 2 << 20): 0.97 for driver in ("threads", "one-thread", "processes")})


def gpus_table(gpus_json: Path) -> list:
    """The two-GPU table from a stored ``bench --gpus ... --json``: per block
    size, driver and direction, GB/s of all GPUs together against the memcpy
    aggregate of the same driver, with the goal and whether every copy was
    bit-exact."""
    runs = json.loads(gpus_json.read_text())["gpus"]
    out = [
        "| block | driver | direction | GB/s, all GPUs | memcpy GB/s | ratio | goal | bit-exact |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        for r in run["together"]:
            goal = None if r["direction"] == "duplex" else GPUS_GOALS.get((r["driver"], run["block_bytes"]))
            met = "" if goal is None else (" (met)" if round(r["ratio"], 3) >= goal else " (not met)")
            out.append(
                f"| {run['num_blocks']} x {size(run['block_bytes'])} | {r['driver']} | {r['direction']} | "
                f"{r['gbps']:.1f} | {r['memcpy_gbps']:.1f} | {r['ratio']:.3f} | "
                f"{'-' if goal is None else f'>= {goal:.2f}'}{met} | {yes(r['verified'])} |"
            )
    return out


def _span(ratios: list) -> str:
    low, high = min(ratios), max(ratios)
    return f"{low:.2f}" if f"{low:.2f}" == f"{high:.2f}" else f"{low:.2f}-{high:.2f}"


def peers_summary(rows: list) -> str:
    """What the peers rows say, in sentences: in how many rows cupy_swap
    leads, and how far a prepared op is from the best other way for many
    large blocks, many small ones, and few."""
    ratio = [(r, r["cupy_swap_prepared"] / r[best_other(r)]) for r in rows]
    leads = sum(max(r["cupy_swap"], r["cupy_swap_prepared"]) >= r[best_other(r)] for r in rows)
    many = max(r["num_blocks"] for r in rows)
    big = [x for r, x in ratio if r["num_blocks"] == many and r["block_bytes"] >= 32 << 10]
    small = [x for r, x in ratio if r["num_blocks"] == many and r["block_bytes"] < 32 << 10]
    few = [x for r, x in ratio if r["num_blocks"] <= 16]
    out = [
        f"cupy_swap is at or above the best other way in {leads} of {len(rows)} rows.",
        "A prepared op, against the best other way:",
    ]
    if big:
        out.append(f"{_span(big)} with {many} blocks of 32 KiB or more;")
    if small:
        out.append(f"{_span(small)} with {many} smaller blocks;")
    if few:
        out.append(
            f"{_span(few)} with 1 to 16 blocks, where the time a call spends on the host "
            "(Python, microseconds) is most of what the swap takes."
        )
    return " ".join(out)


def _log_summary(path: Path) -> list:
    """A pytest log's second line (what ran, on which commit) and its result line."""
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    return [f"`{path.name}`: {lines[1]}", "", f"Result: **{lines[-1]}**"]


def engines_section(folder: Path, commit: str | None = None) -> list:
    """The results page's section of the stored ``bench --engines`` run
    (``engines.json``, the chart ``engines_chart.png`` where present);
    ``commit``: where it ran, if not at the page's commit."""
    from cupy_swap.tools import engines

    report = json.loads((folder / "engines.json").read_text())
    argv = " ".join(Path(a).name if "/" in a else a for a in report["argv"])
    at = f", at commit {commit}" if commit else ""
    out = [
        "## At the shapes engines swap",
        "",
        f"`python -m cupy_swap {argv}`, on the machine above{at}.",
        "",
        *engines.method_lines(),
        *engines.findings(report["engines"]),
        "",
    ]
    if (folder / "engines_chart.png").exists():
        chart = "python -m cupy_swap bench --from-json engines.json --plot engines_chart.png"
        out += ["![GB/s of engine-shaped swaps](engines_chart.png)", "", f"The chart: `{chart}`.", ""]
    return out


# "within 0.3 %": prepared below the faster engine pattern by at most this share of it.
WITHIN = 0.003


def engines_standing(rows: list, within: float = WITHIN) -> dict:
    """Where the prepared op stands against the faster engine pattern in each
    row of a ``bench --engines`` run whose bytes matched: ``leads`` (at or
    above it), ``close`` (below by at most ``within`` of it) and ``behind``
    (the rest), each a list of rows."""
    out: dict = {"leads": [], "close": [], "behind": []}
    for r in rows:
        if not (r.get("best_engine") and r.get("prepared_ok")):
            continue
        ratio = r["prepared"] / r[r["best_engine"]]
        out["leads" if ratio >= 1.0 else "close" if ratio >= 1.0 - within else "behind"].append(r)
    return out


def _case(r: dict) -> str:
    """``"61 x 72 KiB out"``: a row's cache and direction in words."""
    from cupy_swap.tools import engines

    label = next(s.label() for s in engines.SHAPES if s.key == r["shape"]).replace(", pool", " pool")
    return f"{label} {r['direction']}"


def readme_counts(folder: Path) -> list:
    """The README's sentences that count the rows of the stored engines run
    (``engines.json`` in ``folder``): the headline's and the performance
    section's; tests/test_packaging.py finds each in the README."""
    from cupy_swap.tools import engines

    rows = json.loads((folder / "engines.json").read_text())["engines"]
    s = engines_standing(rows)
    leads, close, behind = (s[k] for k in ("leads", "close", "behind"))
    total = len(leads) + len(close) + len(behind)
    counts = sorted({r["num_blocks"] for r in rows})
    short = [r for r in leads + close + behind if r["num_blocks"] <= 256]
    short_leads = [r for r in leads if r["num_blocks"] <= 256]
    by_n: dict = {}
    for r in close:
        by_n.setdefault(r["num_blocks"], []).append(_case(r))
    close_text = "; ".join(
        f"at {n} blocks: {', '.join(cases)}" for n, cases in sorted(by_n.items(), reverse=True)
    )
    behind_cases = [
        f"{_case(r)} at {r['num_blocks']} blocks ({r['prepared']:.1f} against {r[r['best_engine']]:.1f} GB/s)"
        for r in sorted(behind, key=lambda r: (r["shape"], r["num_blocks"]))
    ]
    behind_text = " and ".join(filter(None, [", ".join(behind_cases[:-1]), *behind_cases[-1:]]))
    pct = f"{100 * WITHIN:g} %"
    closer = f" and within {pct} of the faster in {len(close)} more" if close else ""
    trails = f"Of the {len(close) + len(behind)} rows it trails (in: host -> GPU, out: GPU -> host), "
    are = "is" if len(close) == 1 else "are"
    if not close and not behind:
        trails = "It trails in no row."
    elif not close:
        trails += f"none is within {pct} of the faster pattern: {behind_text}."
    elif not behind:
        trails += (
            f"{'all' if len(close) > 1 else 'it'} {are} within {pct} of the faster pattern ({close_text})."
        )
    else:
        trails += f"{len(close)} {are} within {pct} of the faster pattern ({close_text}); the others are {behind_text}."
    return [
        f"Over {total} engine-shaped cases it is at or above both in {len(leads)}{closer} (below).",
        f"Prepared is at or above both engine patterns in {len(leads)} of {total} rows "
        f"(n = {', '.join(map(str, counts))}; {len(short_leads)} of {len(short)} up to 256 blocks), by up to "
        f"{engines.summary(rows)['max_gain']:.1f}x in GB/s,",
        trails,
    ]


def results_page(folder: Path, commit: str, engines_commit: str | None = None) -> list:
    """The current results page (``benchmarks/results/README.md``) from the
    stored run in ``folder`` (its ``bench --engines`` run at
    ``engines_commit`` where that is another commit)."""
    from cupy_swap.tools.peers import CONTENDER_COLUMNS, CONTENDERS

    run = json.loads((folder / "peers.json").read_text())
    rows = run["peers"]
    out = [
        "# Measured results",
        "",
        f"<!-- made by: python benchmarks/make_tables.py --page benchmarks/results {commit}"
        f"{f' --engines-at {engines_commit}' if engines_commit else ''}; do not edit -->",
        "",
        f"The figures the project's README quotes. The speed table is one stored run at commit {commit}, on:",
        "",
        "```",
        *run["environment"],
        "```",
        "",
        "## Speed against other ways to swap",
        "",
        f"`python -m cupy_swap {' '.join(Path(a).name if '/' in a else a for a in run['argv'])}`: "
        "blocking GB/s (1e9 bytes per second, submit and synchronize, median), "
        "one array per side, random distinct blocks, every copy checked bit for bit.",
        "",
        *PAGE_LEGEND,
        "",
    ]
    names = [CONTENDER_COLUMNS[n] for n in CONTENDERS]
    table_rows = []
    for r in rows:
        best = r[best_other(r)]
        table_rows.append(
            [ARROWS[r["direction"]], f"{r['num_blocks']} x {size(r['block_bytes'])}", gbps(r["ceiling_gbps"])]
            + [gbps(r[n]) if n in r else "-" for n in CONTENDERS]
            + [f"{r['cupy_swap_prepared'] / best:.2f}", r.get("path", "-")]
        )
    out += table(["direction", "blocks", "memcpy", *names, "of best", "path"], table_rows)
    out += ["", peers_summary(rows), ""]
    if (folder / "peers_chart.png").exists():
        chart = "python -m cupy_swap bench --from-json peers.json --plot peers_chart.png"
        out += ["![GB/s against block size](peers_chart.png)", "", f"The chart: `{chart}`.", ""]
    if (folder / "engines.json").exists():
        out += engines_section(folder, engines_commit)
    if (folder / "host_time.log").exists():
        out += [
            "## Host time per call",
            "",
            "`host_time.log` (its first line names the commit it measured):",
            "",
        ]
        out += ["```", *(folder / "host_time.log").read_text().rstrip().splitlines(), "```", ""]
    if (folder / "captured.log").exists():
        out += [
            "## Inside a CUDA graph",
            "",
            "`captured.log` (`python -m cupy_swap bench --captured --reps 30`; its first line names the commit "
            "it measured): a replay of a graph holding `PreparedSwap.captured`'s launch against the same op "
            "called eagerly with its rows on the GPU.",
            "",
        ]
        out += ["```", *(folder / "captured.log").read_text().rstrip().splitlines(), "```", ""]
    if (folder / "pytest.log").exists():
        out += ["## The test suite on the GPU", "", *_log_summary(folder / "pytest.log"), ""]
    out += [
        "## Earlier runs",
        "",
        "[history/](history/README.md) keeps every earlier device run, in folders named by what they "
        "hold; none of them measures the current code.",
    ]
    return out


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python benchmarks/make_tables.py",
        description="Print markdown made from stored device runs (no GPU needed).",
    )
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument(
        "--page",
        nargs=2,
        metavar=("DIR", "COMMIT"),
        help="the current results page from DIR (peers.json measured at COMMIT; peers_chart.png, "
        "engines.json, host_time.log, captured.log, pytest.log where present)",
    )
    what.add_argument(
        "--peers", metavar="FILE", help="the README's performance table from bench --peers --json"
    )
    what.add_argument("--gpus", metavar="FILE", help="the two-GPU table from bench --gpus --json")
    what.add_argument(
        "--bench",
        nargs=2,
        metavar=("DIR", "COMMIT"),
        help="the tables of the files `benchmarks/run_device.sh bench` writes into DIR, run at COMMIT",
    )
    what.add_argument(
        "--readme", nargs=2, metavar=("DIR", "COMMIT"), help="the README tables of 0.1.0 from the same files"
    )
    what.add_argument(
        "--counts",
        metavar="DIR",
        help="the README's sentences that count the engines rows of DIR/engines.json (headline, performance)",
    )
    p.add_argument(
        "--engines-at",
        metavar="COMMIT",
        help="with --page: the commit engines.json was measured at, where it is not COMMIT",
    )
    return p


def main(argv=None) -> None:
    args = _parser().parse_args(argv)
    if args.gpus:
        lines = gpus_table(Path(args.gpus))
    elif args.peers:
        lines = peers_table(Path(args.peers))
    elif args.page:
        lines = results_page(Path(args.page[0]), args.page[1], args.engines_at)
    elif args.readme:
        lines = readme_tables(Path(args.readme[0]), args.readme[1])
    elif args.counts:
        lines = readme_counts(Path(args.counts))
    else:
        lines = bench_tables(Path(args.bench[0]), args.bench[1])
    print("\n".join(lines))


def bench_tables(src: Path, commit: str) -> list:
    """The tables of one ``benchmarks/run_device.sh bench`` folder."""
    seed = json.loads((src / "seed_table.json").read_text())
    goals = json.loads((src / "goals.json").read_text())
    duplex = json.loads((src / "duplex.json").read_text())
    out = [f"# Results measured on the device H200 (commit {commit})", ""]
    out += ["```", *seed["environment"], seed["page"], "```", ""]
    out += ["Commands: `benchmarks/run_device.sh` (each section names its own below).", ""]
    out += ["## The seed's table: 1 and 1250 pages, each way", ""]
    out += [f"`python -m cupy_swap {' '.join(seed['argv'])}`", ""]
    out += table(CASE_COLUMNS, case_rows(seed["results"])) + [""]
    out += ["## Goal sweep (mode auto, random distinct blocks)", ""]
    out += [f"`python -m cupy_swap {' '.join(goals['argv'])}`", ""]
    out += table(CASE_COLUMNS, case_rows(goals["results"])) + [""]
    out += ["## Full duplex (swap-in and swap-out together, two streams)", ""]
    out += [f"`python -m cupy_swap {' '.join(duplex['argv'])}`", ""]
    out += bidir_table(duplex)
    out += ["", "## Interference with a matrix product (8192^3 fp16, another stream)", ""]
    gemm = [
        [
            r["max_ctas"],
            f"{r['gemm_alone_ms']:.2f}",
            f"{r['gemm_beside_swaps_ms']:.2f}",
            f"{100 * r['gemm_slowdown']:.1f}%",
            f"{r['swap_gbps']:.1f}",
        ]
        for r in duplex.get("with_gemm", [])
    ]
    out += table(["CTA budget", "matmul alone ms", "matmul beside swaps ms", "slowdown", "swap GB/s"], gemm)
    sweep = src / "staged_sweep.txt"
    if sweep.exists():
        out += ["", "## Staged against kernel, host blocks in one run (blocking latency, us)", ""]
        out += ["`python benchmarks/staged_sweep.py` (its first line: the thresholds `auto` ran with)", ""]
        out += ["```", *sweep.read_text().rstrip().splitlines(), "```"]
    return out + FILES_NOTE.splitlines()


if __name__ == "__main__":
    main()
