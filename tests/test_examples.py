"""The README's examples import and parse their arguments without a GPU (each
runs bit-exact on the GPU in test_examples_gpu.py); the README names every one."""

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# The examples of the README's Examples section (examples/ may hold others, with their own tests).
NAMES = (
    "cuda_graph_swap.py",
    "layer_overlap.py",
    "sglang_layout.py",
    "shared_pool.py",
    "vllm_swap_blocks.py",
)
EXAMPLES = [ROOT / "examples" / name for name in NAMES]
NEEDS_TORCH = {"sglang_layout.py", "vllm_swap_blocks.py"}  # torch at the top; the others use it if present


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_help_runs_without_a_gpu(path):
    if path.name in NEEDS_TORCH and importlib.util.find_spec("torch") is None:
        pytest.skip("needs PyTorch (pip install torch, or the torch extra)")
    r = subprocess.run([sys.executable, str(path), "--help"], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("usage: ") and "--" in r.stdout
    text = path.read_text()
    assert len(text.splitlines()) <= 90, f"{path.name}: keep an example short enough to read in one go"
    assert f"python examples/{path.name}" in text  # its docstring says how to run it


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
