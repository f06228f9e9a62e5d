"""The README's examples import and parse their arguments without a GPU and
without torch, and without a GPU end in one line and exit status 3 (each runs
bit-exact on the GPU in test_examples_gpu.py); the README names every one."""

import os
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
    "inside_cuda_graph.py",
    "layer_overlap.py",
    "sglang_layout.py",
    "shared_pool.py",
    "host_pool.py",
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


# Runs an example with `import cupy` and `import torch` failing (no cuda12/cuda13 extra, no torch).
WITHOUT_CUPY = WITHOUT_TORCH.replace(
    "sys.modules['torch'] = None", "sys.modules['torch'] = sys.modules['cupy'] = None"
)
ALL_EXAMPLES = sorted((ROOT / "examples").glob("*.py"))  # disagg_prefill.py and any other too


@pytest.mark.parametrize("path", ALL_EXAMPLES, ids=lambda p: p.name)
def test_example_help_runs_without_cupy(path):
    """Issue 51: five examples imported CuPy before parsing, so their --help
    said "needs CuPy" and exited 3 where CuPy was not installed."""
    assert "sys.modules['cupy'] = None" in WITHOUT_CUPY
    r = subprocess.run(
        [sys.executable, "-c", WITHOUT_CUPY, str(path), "--help"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("usage: ") and "--help" in r.stdout and r.stderr == "", r.stdout + r.stderr


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_without_cupy_says_so_in_one_line_and_exits_3(path):
    r = subprocess.run(
        [sys.executable, "-c", WITHOUT_CUPY, str(path)], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert r.returncode == 3, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{path}: ") and r.stdout == "", r.stdout + r.stderr
    assert "CuPy" in lines[0] and "cuda12" in lines[0], lines[0]  # what is missing and how to install it


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

    public = set(cupy_swap.__all__) | {"SwapEvent", "engines"}  # engines: documented adapters (README)
    for path in EXAMPLES:
        used = set(re.findall(r"\bcupy_swap\.(\w+)", path.read_text()))
        assert used and used <= public, f"{path.name}: {sorted(used - public)} are not public API"


# examples/disagg_prefill.py (cupy_swap.remote, NIXL): one line and exit 3 where it cannot run.
DISAGG = ROOT / "examples" / "disagg_prefill.py"
WITHOUT_NIXL = {"CUPY_SWAP_NIXL_MODULE": "no_such_nixl_module"}  # what cupy_swap.remote imports


def _disagg(*argv, env=None):
    return subprocess.run(
        [sys.executable, str(DISAGG), *argv],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        env=dict(os.environ, **(env or {})),
    )


def test_disagg_prefill_help_says_the_exit_codes():
    r = _disagg("--help")
    assert r.returncode == 0, r.stderr
    text = " ".join(r.stdout.split())
    assert "exit status: 0 every byte checked; 1 a block differs" in text
    assert "3 no usable GPU (without --host-only) or no NIXL" in text
    assert "--layers LAYERS layers, a K and a V part each" in text  # every option has its help


def test_disagg_prefill_host_only_without_nixl_says_so_in_one_line_and_exits_3():
    """Issue 39: without NIXL, --host-only ended in two tracebacks (decode's
    and prefill's), exit 1."""
    r = _disagg("--host-only", env=WITHOUT_NIXL)
    assert r.returncode == 3, r.stdout + r.stderr
    assert "Traceback" not in r.stdout + r.stderr and r.stderr == ""
    (line,) = r.stdout.strip().splitlines()
    assert line.startswith("disagg_prefill: cupy_swap.remote needs NIXL (")
    assert 'pip install --no-deps "nixl-cu12>=1.5.1,<1.6"' in line


@pytest.mark.skipif(GPU_OK, reason="checks what the example says without a GPU")
@pytest.mark.parametrize("nixl", ["NIXL as installed", "without NIXL"])
def test_disagg_prefill_without_a_gpu_names_the_cause_in_one_line_and_exits_3(nixl):
    """Issue 39: without a driver it printed CuPy's "driver version is
    insufficient"; it now says what the library says (no driver, no device,
    no CuPy, a driver too old) and points at --host-only."""
    from cupy_swap.cuda import availability

    r = _disagg(env=WITHOUT_NIXL if nixl == "without NIXL" else None)
    assert r.returncode == 3, r.stdout + r.stderr
    assert "Traceback" not in r.stdout + r.stderr
    (line,) = r.stdout.strip().splitlines()
    assert line.startswith("disagg_prefill: needs a GPU (") and "--host-only runs it" in line
    if availability.probe_driver() is None:  # this machine has no NVIDIA driver at all
        assert "no NVIDIA driver found" in line and "insufficient" not in line.lower()
