"""Each example runs as a user runs it (``python examples/NAME.py``) and
checks its swaps bit for bit against NumPy; it prints one ``ok:`` line per
check and exits 0."""

import subprocess
import sys
from pathlib import Path

import pytest

from .gpu_helpers import require_gpu

pytestmark = pytest.mark.gpu

require_gpu()

ROOT = Path(__file__).resolve().parents[1]


def _run(name: str, *args: str) -> list[str]:
    r = subprocess.run(
        [sys.executable, str(ROOT / "examples" / name), *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert r.returncode == 0, (
        f"{name} exited {r.returncode}\n--- stdout ---\n{r.stdout}\n--- stderr ---\n{r.stderr}"
    )
    return r.stdout.splitlines()


def _torch_cuda():
    torch = pytest.importorskip("torch", reason="needs PyTorch: pip install torch, or the torch extra")
    if not torch.cuda.is_available():
        pytest.skip("needs PyTorch with CUDA")


def test_cuda_graph_swap():
    lines = _run("cuda_graph_swap.py")
    assert lines[0] == "ok: CuPy graph captured once, replayed with 5 new mappings: bit-exact"
    assert len(lines) == 2 and lines[1].startswith(("ok: torch.cuda.graph", "skipped: torch.cuda.graph"))


@pytest.mark.torch
def test_cuda_graph_swap_with_torch():
    _torch_cuda()
    assert _run("cuda_graph_swap.py", "--steps", "3", "--blocks", "256")[1] == (
        "ok: torch.cuda.graph captured once, replayed with 3 new mappings: bit-exact"
    )


def test_inside_cuda_graph():
    """Issue 40: a decode step captured once (pick kernel, captured swap,
    consumer kernel), replayed with new scores, every replay checked."""
    lines = _run("inside_cuda_graph.py", "--replays", "200")
    assert len(lines) == 1 and lines[0].startswith("ok: 200 replays of one graph (pick, swap, consume), ")
    assert lines[0].endswith("blocks loaded: bit-exact")


def test_layer_overlap():
    lines = _run("layer_overlap.py")
    assert len(lines) == 2 and all(line.startswith("ok: ") and line.endswith("bit-exact") for line in lines)


def test_shared_pool():
    lines = _run("shared_pool.py", "--workers", "2")
    assert len(lines) == 2 and all(line.startswith("ok: worker ") for line in lines)


@pytest.mark.torch
def test_sglang_layout():
    _torch_cuda()
    lines = _run("sglang_layout.py")
    assert [line.split(" host pool")[0] for line in lines] == ["ok: layer-first", "ok: page-first"]


@pytest.mark.torch
def test_vllm_swap_blocks():
    _torch_cuda()
    lines = _run(
        "vllm_swap_blocks.py", "--layers", "3"
    )  # not the default: the layer count comes from the caches
    assert len(lines) == 2 and lines[1].startswith("ok: 3 layers x K/V x 300 blocks")


@pytest.mark.torch
@pytest.mark.parametrize("mla", [False, True], ids=["llama-3-8b", "mla"])
def test_vllm_offload(mla):
    _torch_cuda()
    lines = _run("vllm_offload.py", *(["--mla"] if mla else []))
    want = (
        "ok: MLA, DeepSeek-V3: 61 parts x 40 blocks" if mla else "ok: Llama-3-8B: 32 parts x 40 blocks"
    )  # one tensor per layer, K and V inside
    assert len(lines) == 1 and lines[0].startswith(want) and lines[0].endswith("bit-exact")


@pytest.mark.torch
def test_sglang_hicache():
    _torch_cuda()
    lines = _run("sglang_hicache.py")
    assert [line.split(" host pool")[0] for line in lines] == ["ok: layer_first", "ok: page_first_direct"]
    assert all("64 parts x 24 pages" in line and line.endswith("bit-exact") for line in lines)
