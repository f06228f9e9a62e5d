"""Turn the JSON that ``benchmarks/run_device.sh`` writes into the markdown
tables of ``benchmarks/results/RESULTS.md``.

    python benchmarks/make_tables.py RESULTS_DIR COMMIT > benchmarks/results/RESULTS.md
"""

import json
import sys
from pathlib import Path


def size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB" if n >= 1024 else f"{n} B"


def case_table(results: list, with_modes: bool) -> list[str]:
    head = "| dir | block | n | parts | mode | path | GB/s | memcpy ceiling GB/s | ratio | device ratio | latency us | per-block memcpy GB/s | bit-exact |"
    lines = [head, "|" + "---|" * head.count("|")[:-1] if False else "|" + "---|" * (head.count("|") - 1)]
    for r in results:
        pb = f"{r['per_block_gbps']:.2f}" if "per_block_gbps" in r else "-"
        lines.append(
            f"| {r['direction']} | {size(r['block_bytes'])} | {r['num_blocks']} | {r['parts']} | {r['mode']} | "
            f"{r['path']} | {r['gbps']:.2f} | {r['ceiling_gbps']:.2f} | {r['ratio']:.3f} | {r['device_ratio']:.3f} | "
            f"{r['latency_s'] * 1e6:.1f} | {pb} | {'yes' if r['verified'] else 'NO'} |"
        )
    return lines


def main() -> None:
    src, commit = Path(sys.argv[1]), sys.argv[2]
    out = [f"# Results measured on the device H200 (commit {commit})", ""]
    seed = json.loads((src / "seed_table.json").read_text())
    out += ["```", *seed["environment"], seed["page"], "```", ""]
    out += ["## The seed's table: 1 and 1250 pages, each way", ""]
    out += case_table(seed["results"], True) + [""]
    goals = json.loads((src / "goals.json").read_text())
    out += ["## Goal sweep (mode auto, random distinct blocks)", ""]
    out += case_table(goals["results"], False) + [""]
    duplex = json.loads((src / "duplex.json").read_text())
    out += ["## Full duplex (swap-in and swap-out together, two streams)", ""]
    out += [
        "| blocks each way | mapping | paths in/out | GB/s together | ceiling GB/s | ratio | bit-exact |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in duplex.get("bidir", []):
        out.append(
            f"| {r['num_blocks']} x {size(r['block_bytes'])} | {'contiguous runs' if r['contiguous'] else 'random'} | "
            f"{'/'.join(r['paths'])} | {r['gbps']:.1f} | {r['ceiling_gbps']:.1f} | {r['ratio']:.3f} | {'yes' if r['verified'] else 'NO'} |"
        )
    out += ["", "## Interference with a matrix product (8192^3 fp16, another stream)", ""]
    out += [
        "| CTA budget | matmul alone ms | matmul beside swaps ms | slowdown | swap GB/s |",
        "|---|---|---|---|---|",
    ]
    for r in duplex.get("with_gemm", []):
        out.append(
            f"| {r['max_ctas']} | {r['gemm_alone_ms']:.2f} | {r['gemm_beside_swaps_ms']:.2f} | "
            f"{100 * r['gemm_slowdown']:.1f}% | {r['swap_gbps']:.1f} |"
        )
    print("\n".join(out))


if __name__ == "__main__":
    main()
