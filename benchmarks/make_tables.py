"""Turn the JSON that ``benchmarks/run_device.sh`` writes into the markdown
tables of ``benchmarks/results/RESULTS.md``.

    python benchmarks/make_tables.py RESULTS_DIR COMMIT [LATER_COMMIT] > benchmarks/results/RESULTS.md

LATER_COMMIT names the commit of ``duplex_default_staging.json`` when it differs.
"""

import json
import sys
from pathlib import Path

FILES_NOTE = """
## Files

- `breakdown.txt`: host time inside `swap()` against the kernel alone (the same swap
  captured in a CUDA graph and replayed), from `benchmarks/breakdown.py`.
- `seed_table.json`, `goals.json`, `duplex.json`: `python -m cupy_swap bench ... --json`.
- `duplex_default_staging.json`: `bench --bidir` again, in a later call, with the final
  default staging size.
- `duplex_final_code.json`: `bench --bidir` on the released code (after the review fixes);
  NOTES.md item 24 lists all its runs.
- `staged_sweep.txt`: `benchmarks/staged_sweep.py`, kernel against staged swaps by size.
- `pytest_benchmark.json`: the pytest-benchmark suite on its 32 KiB x 1250 and 2 MiB x 1 cases.
- `tune_shape.json`, `tune_paths.json`: the sweeps behind the defaults (earlier commits; NOTES.md).
- `pytest.log`, `goals.log`: the GPU test run and the sweep's console output.
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


def main() -> None:
    src, commit = Path(sys.argv[1]), sys.argv[2]
    seed = json.loads((src / "seed_table.json").read_text())
    goals = json.loads((src / "goals.json").read_text())
    duplex = json.loads((src / "duplex.json").read_text())
    out = [f"# Results measured on the device H200 (commit {commit})", ""]
    out += ["```", *seed["environment"], seed["page"], "```", ""]
    out += ["## The seed's table: 1 and 1250 pages, each way", ""]
    out += table(CASE_COLUMNS, case_rows(seed["results"])) + [""]
    out += ["## Goal sweep (mode auto, random distinct blocks)", ""]
    out += table(CASE_COLUMNS, case_rows(goals["results"])) + [""]
    out += ["## Full duplex (swap-in and swap-out together, two streams)", ""]
    out += bidir_table(duplex)
    extra = src / "duplex_default_staging.json"
    if extra.exists():
        note = json.loads(extra.read_text())
        later = sys.argv[3] if len(sys.argv) > 3 else commit
        out += ["", f"Again in a later call (commit {later}, with the final defaults):", ""]
        out += bidir_table(note)
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
        out += ["```", *sweep.read_text().rstrip().splitlines(), "```"]
    print("\n".join(out) + "\n" + FILES_NOTE)


if __name__ == "__main__":
    main()
