"""torch interop on a GPU: zero-copy parts, CPU-tensor mappings, streams."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import cupy_swap as cs

from .gpu_helpers import require_gpu, require_torch_cuda

pytestmark = [pytest.mark.gpu, pytest.mark.torch]

require_gpu()
torch = require_torch_cuda()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.int8])
@pytest.mark.parametrize("direction", ["in", "out"])
def test_torch_tensors_bit_exact(dtype, direction):
    g = torch.Generator().manual_seed(7)
    cpu = torch.randint(-100, 100, (300, 16, 8, 64), generator=g).to(dtype).pin_memory()
    gpu = torch.randint(-100, 100, (200, 16, 8, 64), generator=g).to(dtype).cuda()
    sw = cs.BlockSwapper(max_blocks=256)
    mapping = torch.stack(
        [torch.randperm(200, generator=g)[:150], torch.randperm(300, generator=g)[:150]], dim=1
    )
    if direction == "out":
        before = cpu.clone()
        sw.swap_out(gpu, cpu, mapping, stream=torch.cuda.current_stream()).synchronize()
        before[mapping[:, 1]] = gpu[mapping[:, 0]].cpu()
        assert torch.equal(cpu.view(torch.uint8), before.view(torch.uint8))
    else:
        m = mapping[:, [1, 0]].contiguous()
        before = gpu.clone()
        sw.swap_in(cpu, gpu, m).synchronize()
        before[m[:, 1]] = cpu[m[:, 0]].cuda()
        assert torch.equal(gpu.view(torch.uint8), before.view(torch.uint8))


def test_zero_copy_views():
    sw = cs.BlockSwapper(max_blocks=8)
    cpu = torch.zeros((10, 4, 2, 64), dtype=torch.float16).pin_memory()
    gpu = [torch.ones((10, 64), dtype=torch.float16, device="cuda") for _ in range(8)]
    host_parts = [cpu[:, layer, kv] for layer in range(4) for kv in range(2)]
    plan = sw.plan(gpu, host_parts, [(1, 2)])
    assert [p.ptr for p in plan.dst] == [t.data_ptr() for t in host_parts]
    assert [p.ptr for p in plan.src] == [t.data_ptr() for t in gpu]
    sw.swap(gpu, host_parts, [(1, 2)]).synchronize()
    assert (cpu[2] == 1).all() and (cpu[3] == 0).all()


def test_unpinned_cpu_tensor_rejected():
    sw = cs.BlockSwapper(max_blocks=8)
    with pytest.raises(ValueError, match="page-locked"):
        sw.swap_out(torch.zeros((4, 64), device="cuda"), torch.zeros((4, 64)), [(0, 0)])


def test_example_script_runs():
    script = Path(__file__).resolve().parents[1] / "examples" / "vllm_swap_blocks.py"
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("ok")


def test_mapping_as_numpy_view_of_tensor():
    sw = cs.BlockSwapper(max_blocks=8)
    cpu = torch.arange(4 * 64, dtype=torch.float32).reshape(4, 64).pin_memory()
    gpu = torch.zeros((4, 64), device="cuda")
    sw.swap_in(cpu, gpu, torch.tensor([[3, 0], [1, 2]])).synchronize()
    assert torch.equal(gpu[0].cpu(), cpu[3]) and torch.equal(gpu[2].cpu(), cpu[1])
    assert np.array_equal(gpu[1].cpu().numpy(), np.zeros(64, np.float32))


def test_tensor_repointed_to_new_storage_is_noticed():
    sw = cs.BlockSwapper(max_blocks=8)
    cpu = torch.arange(8 * 64, dtype=torch.float32).reshape(8, 64).pin_memory()
    gpu = torch.zeros((8, 64), device="cuda")
    sw.swap_in(cpu, gpu, [(1, 0)]).synchronize()
    fresh = torch.zeros((8, 64), device="cuda")
    old = gpu.clone()
    gpu.set_(fresh)  # same tensor object, new storage
    sw.swap_in(cpu, gpu, [(2, 0)]).synchronize()
    assert torch.equal(fresh[0].cpu(), cpu[2])  # went to the new storage
    assert torch.equal(old[0].cpu(), cpu[1])


def test_wait_for_an_unrecorded_torch_event():
    """torch creates an event's CUDA event on its first record(); waiting on
    one never recorded is a no-op in torch, and so it is for a swap."""
    sw = cs.BlockSwapper(max_blocks=8)
    cpu = torch.arange(8 * 64, dtype=torch.float32).reshape(8, 64).pin_memory()
    gpu = torch.zeros((8, 64), device="cuda")
    fresh = torch.cuda.Event()
    assert fresh.cuda_event == 0  # what the swap must not hand to cudaStreamWaitEvent
    sw.swap_in(cpu, gpu, [(1, 0)], wait_for=fresh).synchronize()
    recorded = torch.cuda.Event()
    recorded.record()
    sw.swap_in(cpu, gpu, [(2, 1)], wait_for=[torch.cuda.Event(), recorded]).synchronize()
    assert torch.equal(gpu[0].cpu(), cpu[1]) and torch.equal(gpu[1].cpu(), cpu[2])
    assert bool((gpu[2:] == 0).all())
