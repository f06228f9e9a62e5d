"""cupy_swap's vLLM offloading worker, driven as vLLM's offloading connector drives it (no vLLM needed).

vLLM loads ``CupySwapOffloadingSpec`` from ``engines.vllm`` (``spec_name`` and
``spec_module_path`` in ``kv_connector_extra_config``; the exact line is in the README's "In
vLLM") and hands its ``get_worker`` the KV caches as int8 pages, one tensor per layer:
Llama-3-8B, 32 layers of 64 KiB pages (16 tokens x K/V x 8 heads x 128 dims, bf16), or
``--mla``: DeepSeek-V3, 61 layers of 72 KiB (64 tokens x 576). Here the same worker (``make_worker``, what ``get_worker`` calls) stores 40 GPU blocks
into CPU chunks of ``--blocks-per-chunk`` blocks, starting mid-chunk as a request's blocks
may, then loads them back into other GPU blocks: one prepared-op call per transfer over every
layer, results polled with ``get_finished()`` as the connector does, every byte checked.

    python examples/vllm_offload.py [--mla] [--blocks 40] [--blocks-per-chunk 4]
"""

from __future__ import annotations

import argparse
import sys
from types import SimpleNamespace as Obj

import numpy as np

import cupy_swap
from cupy_swap import engines

try:
    import torch
except ImportError:  # --help works without it; main() says what is missing
    torch = None

LLAMA = dict(name="Llama-3-8B", layers=32, block=(2, 16, 8, 128))  # num_blocks leading, K/V inside
MLA = dict(name="MLA, DeepSeek-V3", layers=61, block=(64, 576))  # one latent cache per layer


def kv_caches(geometry, num_blocks):
    """What vLLM passes to get_worker (its CanonicalKVCaches): int8 page tensors, one KV cache group."""
    tensors = [
        torch.randn(num_blocks, *geometry["block"], device="cuda").bfloat16()
        for _ in range(geometry["layers"])
    ]
    page = tensors[0][0].numel() * 2
    return Obj(
        tensors=[
            Obj(tensor=t.view(torch.int8).view(num_blocks, page), page_size_bytes=page) for t in tensors
        ],
        group_data_refs=[[Obj(tensor_idx=i, page_size_bytes=page) for i in range(len(tensors))]],
    )


def gpu_spec(block_ids, first_index):  # vLLM's GPULoadStoreSpec: one group of blocks of a request
    return Obj(
        block_ids=np.array(block_ids, np.int32), group_sizes=[len(block_ids)], block_indices=[first_index]
    )


def chunk_spec(chunk_ids):  # vLLM's CPULoadStoreSpec: CPU chunk ids
    return Obj(block_ids=np.array(chunk_ids, np.int32))


def finish(worker, job_id):
    while True:  # the connector polls once per engine step; nothing here waits on the GPU
        for result in worker.get_finished():
            assert result.job_id == job_id and result.success, result
            return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="cupy_swap's vLLM offloading worker: store and load, checked.")
    p.add_argument("--mla", action="store_true", help="DeepSeek-V3's MLA cache instead of Llama-3-8B's")
    p.add_argument("--blocks", type=int, default=40, help="GPU blocks each transfer moves")
    p.add_argument("--gpu-blocks", type=int, default=96, help="blocks of each GPU tensor")
    p.add_argument(
        "--blocks-per-chunk", type=int, default=4, help="GPU blocks per CPU chunk (vLLM's setting)"
    )
    args = p.parse_args(argv)
    sw = cupy_swap.BlockSwapper(max_blocks=1024)  # without a GPU: CudaUnavailableError (below)
    if torch is None or not torch.cuda.is_available():
        print(f"{sys.argv[0]}: needs PyTorch with CUDA (pip install torch)", file=sys.stderr)
        return 3
    geometry, n, bpc = MLA if args.mla else LLAMA, args.blocks, args.blocks_per_chunk
    kv = kv_caches(geometry, args.gpu_blocks)
    first = 1 % bpc  # the request's blocks start at its block 1: mid-chunk when chunks hold several
    chunks_needed = -(-(n + first) // bpc)
    worker = engines.vllm.make_worker(kv, bpc, 2 * chunks_needed, swapper=sw)
    pages = [t.tensor for t in kv.tensors]
    rng = np.random.default_rng(0)
    g = rng.permutation(args.gpu_blocks)[:n].tolist()
    c = rng.permutation(2 * chunks_needed)[:chunks_needed].tolist()
    worker.submit_store(1, gpu_spec(g, first), chunk_spec(c))
    stored = finish(worker, 1)
    rows = (np.array(c)[:, None] * bpc + np.arange(bpc)).reshape(-1)[
        first : first + n
    ]  # chunk rows of block i
    want = [t.cpu().numpy() for t in pages]
    for chunks, src in zip(worker.cpu_chunks, want):
        assert np.array_equal(chunks.reshape(-1, src.shape[1])[rows], src[g])
    for t in pages:
        t.zero_()  # evicted from the GPU; load them back into other blocks
    back = rng.permutation(args.gpu_blocks)[:n].tolist()
    worker.submit_load(2, chunk_spec(c), gpu_spec(back, first))
    loaded = finish(worker, 2)
    for t, src in zip(pages, want):
        got = t.cpu().numpy()
        assert np.array_equal(got[back], src[g])
        assert not np.delete(got, back, axis=0).any()  # nothing else was written
    worker.shutdown()
    mib = stored.transfer_size / 2**20
    print(
        f"ok: {geometry['name']}: {len(pages)} parts x {n} blocks ({mib:.1f} MiB) stored to CPU chunks of {bpc} "
        f"blocks and loaded back, one call each ({stored.transfer_time * 1e6:.0f} and "
        f"{loaded.transfer_time * 1e6:.0f} us on the GPU): bit-exact"
    )
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except cupy_swap.CudaUnavailableError as e:  # no GPU, driver or CuPy here: one line, exit 3
        print(f"{sys.argv[0]}: {e}", file=sys.stderr)
        sys.exit(3)
