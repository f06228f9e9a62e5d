"""``benchmarks/make_tables.py`` turns stored device runs into the tables the
README and NOTES quote; here on made-up runs of the stored shape."""

import importlib.util
import json
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
