"""Command line behaviour that needs no GPU."""

import subprocess
import sys

import pytest

from cupy_swap.cli import _parse_sizes, build_parser

from .conftest import GPU_OK


def test_parse_sizes():
    assert _parse_sizes("16b,48,4k,32KiB,2m") == [16, 48, 4096, 32768, 2 << 20]


def test_parser_defaults():
    args = build_parser().parse_args(["bench"])
    assert args.counts == "1,1250" and args.block_bytes == "32768" and args.directions == "in,out"


@pytest.mark.skipif(GPU_OK, reason="checks the no-GPU message")
@pytest.mark.parametrize("argv", [[], ["bench"]])
def test_without_gpu_says_so_and_fails(argv):
    r = subprocess.run([sys.executable, "-m", "cupy_swap", *argv], capture_output=True, text=True)
    assert r.returncode != 0
    assert "GPU" in r.stderr and "Traceback" not in r.stderr
