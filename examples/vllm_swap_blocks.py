"""cupy_swap behind a torch KV cache, the way vLLM calls it: ``swap_blocks(src, dst,
block_mapping)`` per layer, and ``AllLayerSwap``: every layer's K and V in one launch,
between per-layer GPU caches ``[2, gpu_blocks, block_size, heads, head_dim]`` and one
block-first pinned host cache ``[cpu_blocks, layers, 2, block_size, heads, head_dim]``.

    python examples/vllm_swap_blocks.py [--layers 8] [--blocks 300]
"""

from __future__ import annotations

import argparse
import functools
import sys

import numpy as np

import cupy_swap

try:
    import torch
except ImportError:  # --help works without it; main() says what is missing
    torch = None

BLOCK, HEADS, DIM, GPU_BLOCKS, CPU_BLOCKS = 16, 8, 128, 512, 1024


@functools.cache
def swapper() -> cupy_swap.BlockSwapper:
    return cupy_swap.BlockSwapper(max_blocks=4096)  # one per GPU, made on first use


def swap_blocks(src: torch.Tensor, dst: torch.Tensor, block_mapping: torch.Tensor) -> None:
    """vLLM's ``swap_blocks``: ``dst[d] = src[s]`` for each row ``(s, d)``, on torch's current stream."""
    swapper().swap(src, dst, block_mapping, stream=torch.cuda.current_stream())


class AllLayerSwap:
    """Every layer's K and V between ``gpu_caches`` (one tensor per layer) and ``host_cache``."""

    def __init__(self, gpu_caches: list, host_cache: torch.Tensor):  # parts built and checked once
        layers = len(gpu_caches)  # from the arguments: any model, any layer count
        if host_cache.shape[1] != layers:
            raise ValueError(f"host_cache holds {host_cache.shape[1]} layers, gpu_caches {layers}")
        gpu_parts = [cache[kv] for cache in gpu_caches for kv in range(2)]
        host_parts = [host_cache[:, layer, kv] for layer in range(layers) for kv in range(2)]
        self._out = swapper().prepare(gpu_parts, host_parts)
        self._in = swapper().prepare(host_parts, gpu_parts)

    def swap_out(self, block_mapping):
        return self._out(block_mapping, stream=torch.cuda.current_stream())

    def swap_in(self, block_mapping):
        return self._in(block_mapping, stream=torch.cuda.current_stream())


def bits(t: torch.Tensor) -> np.ndarray:
    return t.view(torch.int16).cpu().numpy()  # bfloat16 as raw bits, for bit-exact checks


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="vLLM-style swaps: per layer, and all layers in one launch.")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--blocks", type=int, default=300, help="blocks each all-layer swap moves")
    args = p.parse_args(argv)
    swapper()  # without a GPU: CudaUnavailableError (below)
    if torch is None or not torch.cuda.is_available():
        print(f"{sys.argv[0]}: needs PyTorch with CUDA (pip install torch)", file=sys.stderr)
        return 3
    torch.manual_seed(0)
    shape = (BLOCK, HEADS, DIM)
    gpu = [torch.randn(2, GPU_BLOCKS, *shape, device="cuda").bfloat16() for _ in range(args.layers)]
    host = torch.zeros(CPU_BLOCKS, args.layers, 2, *shape, dtype=torch.bfloat16).pin_memory()
    host_layer = torch.zeros(CPU_BLOCKS, *shape, dtype=torch.bfloat16).pin_memory()

    mapping = torch.stack([torch.arange(100), torch.arange(500, 600)], dim=1)  # GPU 0..99 -> CPU 500..599
    swap_blocks(gpu[0][0], host_layer, mapping)
    torch.cuda.synchronize()
    assert (
        np.array_equal(bits(host_layer)[500:600], bits(gpu[0][0])[:100]) and not bits(host_layer)[:500].any()
    )
    print("ok: swap_blocks, one layer's K, 100 blocks out: bit-exact")

    g, c = torch.randperm(GPU_BLOCKS)[: args.blocks], torch.randperm(CPU_BLOCKS)[: args.blocks]
    AllLayerSwap(gpu, host).swap_out(torch.stack([g, c], dim=1)).synchronize()
    expected = np.zeros_like(bits(host))
    expected[c.numpy()] = np.moveaxis(np.stack([bits(layer)[:, g.numpy()] for layer in gpu]), 2, 0)
    assert np.array_equal(bits(host), expected)
    fresh = [torch.zeros_like(layer) for layer in gpu]
    AllLayerSwap(fresh, host).swap_in(torch.stack([c, g], dim=1)).synchronize()
    for new, old in zip(fresh, gpu):
        expected = np.zeros_like(bits(old))
        expected[:, g.numpy()] = bits(old)[:, g.numpy()]
        assert np.array_equal(bits(new), expected)
    print(
        f"ok: {args.layers} layers x K/V x {args.blocks} blocks out and back in, one launch each: bit-exact"
    )


if __name__ == "__main__":
    try:
        sys.exit(main())
    except cupy_swap.CudaUnavailableError as e:  # no GPU, driver or CuPy here: one line, exit 3
        print(f"{sys.argv[0]}: {e}", file=sys.stderr)
        sys.exit(3)
