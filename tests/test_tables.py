"""``benchmarks/make_tables.py`` turns stored device runs into the tables the
README and NOTES quote; here on made-up runs of the stored shape."""

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _make_tables():
    spec = importlib.util.spec_from_file_location("make_tables", ROOT / "benchmarks" / "make_tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _together(driver, direction, gbps, memcpy, verified=True):
    return {
        "driver": driver,
        "direction": direction,
        "gbps": gbps,
        "memcpy_gbps": memcpy,
        "ratio": gbps / memcpy,
        "verified": verified,
    }


def test_gpus_table_marks_each_row_against_its_drivers_goal(tmp_path):
    run_32k = {
        "block_bytes": 32 << 10,
        "num_blocks": 1250,
        "together": [
            _together("threads", "in", 91.0, 100.0),  # goal 0.90: met
            _together("one-thread", "in", 91.0, 100.0),  # goal 0.92: not met
            _together("processes", "duplex", 150.0, 180.0, verified=False),  # no goal
        ],
    }
    run_2m = {
        "block_bytes": 2 << 20,
        "num_blocks": 1250,
        "together": [_together("threads", "out", 97.5, 100.0)],
    }
    path = tmp_path / "gpus.json"
    path.write_text(json.dumps({"gpus": [run_32k, run_2m]}))
    lines = _make_tables().gpus_table(path)
    assert lines[2] == "| 1250 x 32 KiB | threads | in | 91.0 | 100.0 | 0.910 | >= 0.90 (met) | yes |"
    assert lines[3] == "| 1250 x 32 KiB | one-thread | in | 91.0 | 100.0 | 0.910 | >= 0.92 (not met) | yes |"
    assert lines[4] == "| 1250 x 32 KiB | processes | duplex | 150.0 | 180.0 | 0.833 | - | NO |"
    assert lines[5] == "| 1250 x 2 MiB | threads | out | 97.5 | 100.0 | 0.975 | >= 0.97 (met) | yes |"
    assert len(lines) == 6


RESULTS = ROOT / "benchmarks" / "results"


def test_help_says_every_form_and_exits_0():
    r = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "make_tables.py"), "--help"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    for form in ("--page DIR COMMIT", "--peers FILE", "--gpus FILE", "--bench DIR COMMIT"):
        assert form in r.stdout
    r = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "make_tables.py")], capture_output=True, text=True
    )
    assert r.returncode == 2 and "one of the arguments" in r.stderr and "Traceback" not in r.stderr


def test_the_results_page_is_made_from_the_stored_run():
    """benchmarks/results/README.md is exactly what --page makes from the
    files beside it, so no figure on it can drift from the stored run."""
    page = (RESULTS / "README.md").read_text()
    ((commit, engines_at),) = re.findall(
        r"make_tables\.py --page benchmarks/results (\w+)(?: --engines-at (\w+))?;", page
    )
    assert page == "\n".join(_make_tables().results_page(RESULTS, commit, engines_at or None)) + "\n"


def test_only_current_files_and_the_history_folder_sit_in_results():
    assert sorted(p.name for p in RESULTS.iterdir()) == [
        "README.md",
        "captured.log",
        "engines.json",
        "engines_chart.png",
        "history",
        "host_time.log",
        "peers.json",
        "peers_chart.png",
        "pytest.log",
    ]
    index = (RESULTS / "history" / "README.md").read_text()
    for folder in (RESULTS / "history").iterdir():
        if folder.is_dir():
            assert f"[{folder.name}/](" in index, f"history/README.md does not list {folder.name}/"


def _peer_row(direction, block_bytes, n, ceiling, others, swap, prepared):
    row = {"direction": direction, "block_bytes": block_bytes, "num_blocks": n, "ceiling_gbps": ceiling}
    row.update(zip(("seed_upload", "seed_resident", "graph_memcpy", "batch_memcpy"), others))
    row.update(cupy_swap=swap, cupy_swap_prepared=prepared, path="kernel")
    return row


def test_peers_summary_counts_leads_and_spans_ratios():
    tables = _make_tables()
    rows = [
        _peer_row("in", 4096, 1, 1.0, (0.1, 0.2, 0.5, 0.4), 0.2, 0.25),  # 0.50
        _peer_row("in", 4096, 1250, 50.0, (30, 40, 2, 3), 30.0, 32.0),  # 0.80
        _peer_row("in", 32768, 1250, 54.0, (45, 50, 10, 30), 49.0, 48.0),  # 0.96
        _peer_row("out", 2 << 20, 1250, 55.0, (50, 50, 50, 54), 55.0, 54.0),  # swap() leads
    ]
    rows[0]["graph_memcpy_ok"] = False  # a contender whose copy was wrong is no one's best
    text = tables.peers_summary(rows)
    assert text.startswith("cupy_swap is at or above the best other way in 1 of 4 rows.")
    assert "0.96-1.00 with 1250 blocks of 32 KiB or more;" in text
    assert "0.80 with 1250 smaller blocks;" in text
    assert "0.62 with 1 to 16 blocks" in text  # 0.25 / 0.4, not / 0.5
