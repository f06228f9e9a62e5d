"""cupy_swap from a torch KV cache, the way vLLM uses swap_blocks.

1. ``swap_blocks(src, dst, block_mapping)``: vLLM's per-layer signature
   (``block_mapping`` an ``(N, 2)`` int64 CPU tensor), one call per layer.
2. ``AllLayerSwap``: every layer's K and V in one launch, between
   per-layer GPU tensors and one block-first pinned host tensor
   ``[num_blocks, layers, 2, block_size, heads, head_dim]``; its parts are
   built once and prepared, so a call checks only the mapping.

Run on a CUDA machine: ``python examples/vllm_swap_blocks.py``.
"""

import torch

import cupy_swap

LAYERS, BLOCK, HEADS, DIM = 8, 16, 8, 128
GPU_BLOCKS, CPU_BLOCKS = 512, 1024

_swapper = None


def swapper() -> cupy_swap.BlockSwapper:
    global _swapper
    if _swapper is None:
        _swapper = cupy_swap.BlockSwapper(max_blocks=4096)
    return _swapper


def swap_blocks(src: torch.Tensor, dst: torch.Tensor, block_mapping: torch.Tensor) -> None:
    """vLLM's ``swap_blocks``: copy ``src[s]`` to ``dst[d]`` for each row
    ``(s, d)``; one side on the GPU, the other pinned on the CPU.  Ordered on
    torch's current stream, like vLLM's CUDA op."""
    swapper().swap(src, dst, block_mapping, stream=torch.cuda.current_stream())


class AllLayerSwap:
    """Every layer's K and V in one launch, between per-layer GPU tensors
    ``gpu_caches[l]`` of shape ``[2, GPU_BLOCKS, BLOCK, HEADS, DIM]`` and one
    block-first pinned host tensor ``[CPU_BLOCKS, LAYERS, 2, BLOCK, HEADS, DIM]``.

    The parts (one view per layer and K/V) are built and checked once, here,
    as a server builds them when it allocates its caches, and prepared: a
    call then checks only the mapping.  (``swap()`` with fresh views built
    per call also finds the checked layout, but pays about a microsecond per
    view to recognise the memory.)"""

    def __init__(self, gpu_caches, host_cache):
        gpu_parts = [gpu_caches[layer][kv] for layer in range(LAYERS) for kv in range(2)]
        host_parts = [host_cache[:, layer, kv] for layer in range(LAYERS) for kv in range(2)]
        self._out = swapper().prepare(gpu_parts, host_parts)
        self._in = swapper().prepare(host_parts, gpu_parts)

    def swap_out(self, block_mapping):
        return self._out(block_mapping, stream=torch.cuda.current_stream())

    def swap_in(self, block_mapping):
        return self._in(block_mapping, stream=torch.cuda.current_stream())


def main() -> None:
    torch.manual_seed(0)
    gpu = [
        torch.randn(2, GPU_BLOCKS, BLOCK, HEADS, DIM, device="cuda", dtype=torch.bfloat16)
        for _ in range(LAYERS)
    ]
    host = torch.zeros(CPU_BLOCKS, LAYERS, 2, BLOCK, HEADS, DIM, dtype=torch.bfloat16).pin_memory()
    host_layer = torch.zeros(CPU_BLOCKS, BLOCK, HEADS, DIM, dtype=torch.bfloat16).pin_memory()

    # Per layer, as vLLM's swap_blocks: GPU blocks 0..99 -> CPU blocks 500..599.
    mapping = torch.stack([torch.arange(100), torch.arange(500, 600)], dim=1)
    swap_blocks(gpu[0][0], host_layer, mapping)
    torch.cuda.synchronize()
    assert torch.equal(host_layer[500:600], gpu[0][0][:100].cpu())

    # Every layer at once, out and back in, at random blocks.
    out_map = torch.stack([torch.randperm(GPU_BLOCKS)[:300], torch.randperm(CPU_BLOCKS)[:300]], dim=1)
    ev = AllLayerSwap(gpu, host).swap_out(out_map)
    ev.synchronize()
    for layer in range(LAYERS):
        for kv in range(2):
            assert torch.equal(host[out_map[:, 1], layer, kv], gpu[layer][kv][out_map[:, 0]].cpu())
    fresh = [torch.zeros_like(g) for g in gpu]
    in_map = torch.stack([out_map[:, 1], out_map[:, 0]], dim=1)
    AllLayerSwap(fresh, host).swap_in(in_map).synchronize()
    for layer in range(LAYERS):
        assert torch.equal(fresh[layer][:, out_map[:, 0]], gpu[layer][:, out_map[:, 0]])
    moved = 2 * 300 * LAYERS * 2 * BLOCK * HEADS * DIM * 2
    print(f"ok: per-layer swap and all-layer swaps ({moved / 1e6:.0f} MB) match bit for bit")


if __name__ == "__main__":
    main()
