"""The README's examples import and parse their arguments without a GPU and
without torch, and without a GPU end in one line and exit status 3 (each runs
bit-exact on the GPU in test_examples_gpu.py); the README names every one."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from .gpu_helpers import GPU_OK

ROOT = Path(__file__).resolve().parents[1]
# The examples of the README's Examples section (examples/ may hold others, with their own tests).
NAMES = (
    "cuda_graph_swap.py",
    "layer_overlap.py",
    "sglang_layout.py",
    "shared_pool.py",
    "sglang_hicache.py",
    "vllm_offload.py",
    "vllm_swap_blocks.py",
)
EXAMPLES = [ROOT / "examples" / name for name in NAMES]
# Runs an example as `python examples/NAME.py ARGS`, with `import torch` failing.
WITHOUT_TORCH = (
    "import runpy, sys; sys.modules['torch'] = None; path = sys.argv[1]; sys.argv = sys.argv[1:]; "
    "runpy.run_path(path, run_name='__main__')"
)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_help_runs_without_a_gpu_or_torch(path):
    r = subprocess.run(
        [sys.executable, "-c", WITHOUT_TORCH, str(path), "--help"], capture_output=True, text=True, cwd=ROOT
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("usage: ") and "--" in r.stdout
    text = path.read_text()
    assert len(text.splitlines()) <= 125, f"{path.name}: keep an example short enough to read in one go"
    assert f"python examples/{path.name}" in text  # its docstring says how to run it


@pytest.mark.skipif(GPU_OK, reason="checks what an example says without a GPU")
@pytest.mark.parametrize("torch", ["with torch if installed", "without torch"])
@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_without_a_gpu_says_so_in_one_line_and_exits_3(path, torch):
    argv = [sys.executable, str(path)]
    if torch == "without torch":
        argv[1:1] = ["-c", WITHOUT_TORCH]
    r = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 3, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{path}: ") and r.stdout == "", r.stderr
    assert "GPU" in lines[0] or "CuPy" in lines[0] or "driver" in lines[0]


def test_the_readme_names_every_example():
    readme = (ROOT / "README.md").read_text()
    missing = [p.name for p in EXAMPLES if f"examples/{p.name}" not in readme]
    assert not missing, f"README.md does not mention {missing}"


def test_the_examples_use_only_the_public_api():
    import cupy_swap

    public = set(cupy_swap.__all__) | {"SwapEvent"}
    for path in EXAMPLES:
        used = set(re.findall(r"\bcupy_swap\.(\w+)", path.read_text()))
        assert used and used <= public, f"{path.name}: {sorted(used - public)} are not public API"
