"""The command line at tiny sizes, on a GPU."""

import json
import subprocess
import sys

import pytest

from .gpu_helpers import require_gpu

pytestmark = pytest.mark.gpu

require_gpu()


def _run(*argv):
    return subprocess.run([sys.executable, "-m", "cupy_swap", *argv], capture_output=True, text=True)


def test_bench_tiny_with_json(tmp_path):
    out = tmp_path / "bench.json"
    r = _run(
        "bench",
        "--block-bytes",
        "4k",
        "--counts",
        "3",
        "--reps",
        "3",
        "--modes",
        "kernel,dma,auto",
        "--json",
        str(out),
    )
    assert r.returncode == 0, r.stderr
    assert "block = one layer's" in r.stdout and "ratio" in r.stdout
    data = json.loads(out.read_text())
    assert len(data["results"]) == 6 and all(x["verified"] for x in data["results"])
    assert {x["path"] for x in data["results"]} <= {"kernel", "dma"}


def test_bench_bidir_tiny():
    r = _run("bench", "--bidir", "--bidir-blocks", "16", "--reps", "3")
    assert r.returncode == 0, r.stderr
    assert "full duplex" in r.stdout and "MISMATCH" not in r.stdout


def test_info_and_calibrate(tmp_path):
    r = _run("info")
    assert r.returncode == 0, r.stderr
    assert "host memory reachable by kernels" in r.stdout and "copy engines" in r.stdout
    env_cmd = [sys.executable, "-m", "cupy_swap", "calibrate", "--reps", "3"]
    import os

    r = subprocess.run(
        env_cmd, capture_output=True, text=True, env=dict(os.environ, CUPY_SWAP_CACHE_DIR=str(tmp_path))
    )
    assert r.returncode == 0, r.stderr
    (path,) = tmp_path.glob("calibration-*.json")
    data = json.loads(path.read_text())
    assert data["dma_min_copy_bytes"] > 0 and data["dma_max_copies"] >= 0
