"""Issue 49, finding 7: examples/disagg_prefill.py checks its numbers while
parsing, as ``cupy_swap bench --remote`` does: one line, exit status 2,
before any CUDA or NIXL work.  It checked none (``--blocks 0`` waited 61 s
then failed; ``--blocks 600``, ``--layers 0``, ``--blocks -3`` printed two
tracebacks and exit 1)."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

DISAGG = Path(__file__).resolve().parents[1] / "examples" / "disagg_prefill.py"
WITHOUT_NIXL = {"CUPY_SWAP_NIXL_MODULE": "no_such_nixl_module"}  # what cupy_swap.remote imports


def _disagg(*argv):
    t0 = time.monotonic()
    r = subprocess.run(
        [sys.executable, str(DISAGG), *argv],
        capture_output=True,
        text=True,
        cwd=DISAGG.parents[1],
        timeout=120,
        env=dict(os.environ, **WITHOUT_NIXL),
    )
    return r, time.monotonic() - t0


@pytest.mark.parametrize(
    "argv,said",
    [
        (["--blocks", "0"], "argument --blocks: '0' is not a positive whole number"),
        (["--blocks", "-3"], "argument --blocks: '-3' is not a positive whole number"),
        (["--layers", "0"], "argument --layers: '0' is not a positive whole number"),
        (["--gpu-blocks", "-1"], "argument --gpu-blocks: '-1' is not a positive whole number"),
        (["--host-blocks", "1.5"], "argument --host-blocks: '1.5' is not a positive whole number"),
        (["--blocks", "600"], "argument --blocks: 600 blocks do not fit in --gpu-blocks 512"),
        (
            ["--blocks", "64", "--host-blocks", "32"],
            "argument --blocks: 64 blocks do not fit in --host-blocks 32",
        ),
        (
            ["--layers", "100000000"],
            "(--gpu-blocks 512 + --host-blocks 1024) needs 9375000.0 GiB of host memory, more than this host's",
        ),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else "",
)
@pytest.mark.parametrize("host_only", [False, True], ids=["gpu", "host-only"])
def test_a_bad_number_is_refused_in_one_line_with_exit_2(argv, said, host_only):
    r, took = _disagg(*argv, *(["--host-only"] if host_only else []))
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stdout == "" and "Traceback" not in r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("disagg_prefill.py: error: ") and said in line and line.endswith("(see --help)")
    assert took < 30  # refused while parsing, not after a wait for the other process


def test_good_numbers_pass_to_the_checks_of_the_machine():
    r, _ = _disagg(
        "--host-only", "--blocks", "512", "--gpu-blocks", "512", "--host-blocks", "512", "--layers", "1"
    )
    assert r.returncode == 3, r.stdout + r.stderr  # parsed; then: no NIXL here, one line, exit 3
    (line,) = r.stdout.strip().splitlines()
    assert line.startswith("disagg_prefill: cupy_swap.remote needs NIXL (")


def test_help_says_exit_status_2():
    r, _ = _disagg("--help")
    assert r.returncode == 0 and "2 a bad argument" in " ".join(r.stdout.split())
