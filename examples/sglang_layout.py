"""SGLang-style pools: per-layer GPU buffers, a host pool laid out layer-first or
page-first, and the indices of the pages to move in CUDA tensors.

GPU pool, per layer: K and V buffers [pages, page_size, heads, head_dim].
Host pool, layer-first: [2, layers, pages, page_size, heads, head_dim];
    part (layer, kv) is host[kv, layer].
Host pool, page-first: [pages, layers, 2, page_size, heads, head_dim], a page's
    bytes in one run; part (layer, kv) is host[:, layer, kv] (each block stays
    contiguous; the stride between blocks spans the whole page).
All 2 x layers parts move in one call per direction. The mapping is built on the
GPU from token indices and stays there: no host synchronization, checked on the GPU.

    python examples/sglang_layout.py [--layers 4] [--pages 32]
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

import cupy_swap

try:
    import torch
except ImportError:  # --help works without it; main() says what is missing
    torch = None

PAGE, HEADS, DIM, GPU_PAGES, HOST_PAGES = 16, 8, 128, 128, 256


def bits(t: torch.Tensor) -> np.ndarray:
    return t.view(torch.int16).cpu().numpy()  # bfloat16 as raw bits, for bit-exact checks


def token_indices(pages: torch.Tensor) -> torch.Tensor:
    """Per-token indices of whole pages, as SGLang's HiCache keeps them (int64, on the GPU)."""
    return (pages[:, None] * PAGE + torch.arange(PAGE, device=pages.device)).reshape(-1)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="Swap between SGLang-style GPU and host pools.")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--pages", type=int, default=32, help="pages moved each way")
    args = p.parse_args(argv)
    sw = cupy_swap.BlockSwapper(max_blocks=HOST_PAGES)  # without a GPU: CudaUnavailableError (below)
    if torch is None or not torch.cuda.is_available():
        print(f"{sys.argv[0]}: needs PyTorch with CUDA (pip install torch)", file=sys.stderr)
        return 3
    layers, n = range(args.layers), args.pages
    torch.manual_seed(0)
    k = [torch.randn(GPU_PAGES, PAGE, HEADS, DIM, dtype=torch.bfloat16, device="cuda") for _ in layers]
    v = [torch.randn_like(buf) for buf in k]
    gpu_parts = [buf for i in layers for buf in (k[i], v[i])]
    pools = {
        "layer-first": (
            lambda h: [h[kv, i] for i in layers for kv in range(2)],
            (2, args.layers, HOST_PAGES),
        ),
        "page-first": (
            lambda h: [h[:, i, kv] for i in layers for kv in range(2)],
            (HOST_PAGES, args.layers, 2),
        ),
    }
    for layout, (parts_of, lead) in pools.items():
        host = torch.zeros(*lead, PAGE, HEADS, DIM, dtype=torch.bfloat16).pin_memory()
        host_parts = parts_of(host)
        device_indices = token_indices(torch.randperm(GPU_PAGES, device="cuda")[:n])
        host_indices = token_indices(torch.randperm(HOST_PAGES, device="cuda")[:n])
        # Token indices -> page indices -> (N, 2) int64 rows, all on the GPU. (cupy_swap is
        # gaining the 1-D pair form (src_indices, dst_indices) that SGLang passes as well.)
        gpu_pages, host_pages = device_indices[::PAGE] // PAGE, host_indices[::PAGE] // PAGE
        out_map = torch.stack([gpu_pages, host_pages], dim=1)
        sw.swap_out(gpu_parts, host_parts, out_map, stream=torch.cuda.current_stream()).synchronize()
        g, h = gpu_pages.cpu().numpy(), host_pages.cpu().numpy()
        for src, dst in zip(gpu_parts, host_parts):
            expected = np.zeros_like(bits(dst))
            expected[h] = bits(src)[g]
            assert np.array_equal(bits(dst), expected)  # untouched host pages stay zero
        back = [torch.zeros_like(buf) for buf in gpu_parts]
        in_map = torch.stack([host_pages, gpu_pages], dim=1)
        sw.swap_in(host_parts, back, in_map, stream=torch.cuda.current_stream()).synchronize()
        for src, dst in zip(gpu_parts, back):
            expected = np.zeros_like(bits(dst))
            expected[g] = bits(src)[g]
            assert np.array_equal(bits(dst), expected)
        print(
            f"ok: {layout} host pool, {2 * args.layers} parts x {n} pages out and back in, "
            "GPU index tensors: bit-exact"
        )


if __name__ == "__main__":
    try:
        sys.exit(main())
    except cupy_swap.CudaUnavailableError as e:  # no GPU, driver or CuPy here: one line, exit 3
        print(f"{sys.argv[0]}: {e}", file=sys.stderr)
        sys.exit(3)
