"""cupy_swap's sgl-kernel transfer functions, called as SGLang's HiCache host pool calls them (no SGLang needed).

SGLang's ``MHATokenToKVPoolHost`` moves tokens between the GPU pool (per layer K and V buffers
``[tokens, heads, head_dim]``) and pinned host memory with sgl-kernel's ``kvcacheio``
functions, given token indices as int64 CUDA tensors: ``backup_from_device_all_layer`` on the
controller's write stream, ``load_to_device_per_layer`` layer by layer on its load stream.
``engines.sglang`` has those functions under the same names and arguments (and
``patch_host_pools()`` routes a running SGLang's host pools to them). Here: the
``layer_first`` pool (``io_backend="kernel"``: ``transfer_kv_all_layer`` with SGLang's
tables of layer addresses, then ``transfer_kv_per_layer``) and the ``page_first_direct``
pool (``io_backend="direct"``), for Llama-3-8B: 32 layers, 16-token pages, 8 KV heads x 128
dims in bf16; each load's layer waited for by the forward stream, every byte checked.

    python examples/sglang_hicache.py [--layers 32] [--pages 24]
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

import cupy_swap
from cupy_swap import engines

try:
    import torch
except ImportError:  # --help works without it; main() says what is missing
    torch = None

PAGE, HEADS, DIM, GPU_PAGES, HOST_PAGES = 16, 8, 128, 64, 128
ITEM = HEADS * DIM * 2  # bytes of one token of one layer (SGLang's token_stride_size)


def table(buffers):  # SGLang's k_data_ptrs / v_data_ptrs: layer addresses in a uint64 CUDA tensor
    t = torch.tensor([b.data_ptr() for b in buffers], dtype=torch.uint64, device="cuda")
    engines.sglang.register_layers(t, buffers)  # once, where the pool is made (adopt() does it in SGLang)
    return t


def pages(rng, n, total):  # whole pages' token indices, as HiCache moves them
    p = rng.permutation(total)[:n]
    return torch.from_numpy((p[:, None] * PAGE + np.arange(PAGE)).reshape(-1)).cuda()


def bits(t):
    return t.view(torch.int16).cpu().numpy()


def run(layout: str, layers: int, n: int) -> str:
    sg, rng = engines.sglang, np.random.default_rng(0)
    dev_k, dev_v = (
        [torch.randn(GPU_PAGES * PAGE, HEADS, DIM, device="cuda").bfloat16() for _ in range(layers)]
        for _ in "kv"
    )
    dev_idx, host_idx = pages(rng, n, GPU_PAGES), pages(rng, n, HOST_PAGES)
    write, load = torch.cuda.Stream(), torch.cuda.Stream()
    write.wait_stream(torch.cuda.current_stream())  # the forward pass that wrote the pages
    with torch.cuda.stream(write):  # backup_from_device_all_layer
        if layout == "layer_first":
            host = torch.zeros(2, layers, HOST_PAGES * PAGE, HEADS, DIM, dtype=torch.bfloat16).pin_memory()
            k_tables, v_tables = (table(list(host[kv])) for kv in range(2))
            sg.transfer_kv_all_layer(
                table(dev_k), k_tables, table(dev_v), v_tables, dev_idx, host_idx, ITEM, layers
            )
        else:  # page_first_direct: a page's bytes of every layer together
            host = torch.zeros(2, HOST_PAGES, layers, PAGE, HEADS, DIM, dtype=torch.bfloat16).pin_memory()
            sg.transfer_kv_all_layer_direct_lf_pf(dev_k + dev_v, [host[0], host[1]], dev_idx, host_idx, PAGE)
    write.synchronize()
    want = [(bits(k)[dev_idx.cpu().numpy()], bits(v)[dev_idx.cpu().numpy()]) for k, v in zip(dev_k, dev_v)]
    for t in dev_k + dev_v:
        t.zero_()  # evicted; load the pages back into other GPU slots
    back = pages(rng, n, GPU_PAGES)
    forward = torch.cuda.current_stream()
    load.wait_stream(forward)
    for i in range(layers):  # load_to_device_per_layer, one event per layer for the forward pass
        with torch.cuda.stream(load):
            if layout == "layer_first":
                sg.transfer_kv_per_layer(host[0, i], dev_k[i], host[1, i], dev_v[i], host_idx, back, ITEM)
            else:
                sg.transfer_kv_per_layer_direct_pf_lf(
                    [host[0], host[1]], [dev_k[i], dev_v[i]], host_idx, back, i, PAGE
                )
            done = torch.cuda.Event()
            done.record(load)
        forward.wait_event(done)  # layer i's attention runs after its load, later layers still loading
    forward.synchronize()
    b = back.cpu().numpy()
    for (k, v), (wk, wv) in zip(zip(dev_k, dev_v), want):
        got_k, got_v = bits(k), bits(v)
        assert np.array_equal(got_k[b], wk) and np.array_equal(got_v[b], wv)
        assert not np.delete(got_k, b, axis=0).any()  # nothing else was written
    how = "transfer_kv_all_layer, transfer_kv_per_layer" if layout == "layer_first" else "the direct variants"
    return f"ok: {layout} host pool: {2 * layers} parts x {n} pages backed up in one call, loaded per layer ({how}): bit-exact"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description="sgl-kernel's kvcacheio transfers on cupy_swap, as HiCache calls them."
    )
    p.add_argument("--layers", type=int, default=32, help="layers (a K and a V buffer each)")
    p.add_argument("--pages", type=int, default=24, help="16-token pages each transfer moves")
    args = p.parse_args(argv)
    engines.sglang.use_swapper(cupy_swap.BlockSwapper(max_blocks=8192))  # without a GPU: CudaUnavailableError
    if torch is None or not torch.cuda.is_available():
        print(f"{sys.argv[0]}: needs PyTorch with CUDA (pip install torch)", file=sys.stderr)
        return 3
    for layout in ("layer_first", "page_first_direct"):
        print(run(layout, args.layers, args.pages))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except cupy_swap.CudaUnavailableError as e:  # no GPU, driver or CuPy here: one line, exit 3
        print(f"{sys.argv[0]}: {e}", file=sys.stderr)
        sys.exit(3)
