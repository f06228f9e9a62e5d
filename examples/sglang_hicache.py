"""cupy_swap inside SGLang's HiCache, on pools shaped as SGLang keeps them (no SGLang needed).

HiCache's host pool (``MHATokenToKVPoolHost``) moves pages between the GPU pool (per layer K
and V buffers ``[tokens, heads, head_dim]``) and pinned host memory in two calls, both given
token indices as int64 CUDA tensors: ``backup_from_device_all_layer(device_pool,
host_indices, device_indices)`` on the controller's write stream, and
``load_to_device_per_layer(device_pool, host_indices, device_indices, layer_id)`` on its load
stream, layer by layer, each layer's attention waiting for that layer's event. Here both are
prepared cupy_swap ops (a block is one page; the indices stay on the GPU), for the host pool
laid out ``layer_first`` ``[2, layers, tokens, heads, dim]`` and ``page_first_direct``
``[2, pages, layers, page_size, heads, dim]``. Llama-3-8B: 32 layers, 16-token pages of 8 KV
heads x 128 dims in bf16 (32 KiB per page and part).

    python examples/sglang_hicache.py [--layers 32] [--pages 24]
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

PAGE, HEADS, DIM, GPU_PAGES, HOST_PAGES = 16, 8, 128, 64, 128


def pages_of(token_indices):
    return token_indices[::PAGE] // PAGE  # whole pages, as HiCache moves them; stays on the GPU


class HostPool:
    """MHATokenToKVPoolHost with cupy_swap behind its two transfer calls."""

    def __init__(self, k_buffers, v_buffers, layout: str, sw):
        layers = len(k_buffers)
        if layout == "layer_first":
            self.kv = torch.zeros(2, layers, HOST_PAGES * PAGE, HEADS, DIM, dtype=torch.bfloat16).pin_memory()
            host = lambda kv, i: self.kv[kv, i].view(HOST_PAGES, PAGE, HEADS, DIM)  # noqa: E731
        else:  # page_first_direct: a page's bytes of every layer in one run
            self.kv = torch.zeros(2, HOST_PAGES, layers, PAGE, HEADS, DIM, dtype=torch.bfloat16).pin_memory()
            host = lambda kv, i: self.kv[kv, :, i]  # noqa: E731
        dev = lambda kv, i: (k_buffers, v_buffers)[kv][i].view(-1, PAGE, HEADS, DIM)  # noqa: E731
        self.host_part = host
        parts = [(kv, i) for i in range(layers) for kv in range(2)]
        self.backup = sw.prepare([dev(*p) for p in parts], [host(*p) for p in parts])  # all layers
        self.load = [
            sw.prepare([host(kv, i) for kv in range(2)], [dev(kv, i) for kv in range(2)])
            for i in range(layers)
        ]
        self.write_stream, self.load_stream = torch.cuda.Stream(), torch.cuda.Stream()

    def backup_from_device_all_layer(self, host_indices, device_indices):
        pairs = (pages_of(device_indices), pages_of(host_indices))  # SGLang's 1-D index pair
        return self.backup(pairs, stream=self.write_stream, wait_for=torch.cuda.current_stream())

    def load_to_device_per_layer(self, host_indices, device_indices, layer_id: int):
        pairs = (pages_of(host_indices), pages_of(device_indices))  # after what the device pool ran
        return self.load[layer_id](pairs, stream=self.load_stream, wait_for=torch.cuda.current_stream())


def bits(t):
    return t.view(torch.int16).cpu().numpy()  # bf16 as raw bits, for bit-exact checks


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="SGLang HiCache transfers through cupy_swap.")
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--pages", type=int, default=24, help="pages each transfer moves")
    args = p.parse_args(argv)
    sw = cupy_swap.BlockSwapper(max_blocks=HOST_PAGES)  # without a GPU: CudaUnavailableError (below)
    if torch is None or not torch.cuda.is_available():
        print(f"{sys.argv[0]}: needs PyTorch with CUDA (pip install torch)", file=sys.stderr)
        return 3
    import cupy  # to make torch's stream wait for one layer's event

    torch.manual_seed(0)
    tokens = lambda pages: (pages[:, None] * PAGE + torch.arange(PAGE, device="cuda")).reshape(-1)  # noqa: E731
    for layout in ("layer_first", "page_first_direct"):
        k = [torch.randn(GPU_PAGES * PAGE, HEADS, DIM, device="cuda").bfloat16() for _ in range(args.layers)]
        v = [torch.randn_like(buf) for buf in k]
        pool = HostPool(k, v, layout, sw)
        dev_pages = torch.randperm(GPU_PAGES, device="cuda")[: args.pages]
        host_pages = torch.randperm(HOST_PAGES, device="cuda")[: args.pages]
        pool.backup_from_device_all_layer(tokens(host_pages), tokens(dev_pages)).synchronize()
        g, h = dev_pages.cpu().numpy(), host_pages.cpu().numpy()
        for i in range(args.layers):
            for kv, buf in enumerate((k[i], v[i])):
                want = bits(buf.view(-1, PAGE, HEADS, DIM))[g]
                assert np.array_equal(bits(pool.host_part(kv, i))[h], want)

        back = torch.randperm(GPU_PAGES, device="cuda")[: args.pages]  # load into other device pages
        for buf in k + v:
            buf.zero_()
        compute, seen = torch.cuda.current_stream(), []
        events = [
            pool.load_to_device_per_layer(tokens(host_pages), tokens(back), i) for i in range(args.layers)
        ]
        for i in range(args.layers):  # the forward pass: layer i waits for layer i's pages only
            cupy.cuda.ExternalStream(compute.cuda_stream).wait_event(events[i])
            seen.append(k[i].view(-1, PAGE, HEADS, DIM)[back].clone())  # attention reads the pages
        b = back.cpu().numpy()
        for i, v_pages in enumerate(bits(buf.view(-1, PAGE, HEADS, DIM)) for buf in v):
            assert np.array_equal(bits(seen[i]), bits(pool.host_part(0, i))[h])
            assert np.array_equal(v_pages[b], bits(pool.host_part(1, i))[h])  # V loaded, the rest untouched
            assert not np.delete(v_pages, b, axis=0).any()
        print(
            f"ok: {layout} host pool, {2 * args.layers} parts x {args.pages} pages backed up in one call "
            f"and loaded layer by layer, GPU index tensors: bit-exact"
        )
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except cupy_swap.CudaUnavailableError as e:  # no GPU, driver or CuPy here: one line, exit 3
        print(f"{sys.argv[0]}: {e}", file=sys.stderr)
        sys.exit(3)
