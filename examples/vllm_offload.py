"""cupy_swap inside vLLM V1's CPU offload, on caches shaped as vLLM keeps them (no vLLM needed).

vLLM's offloading connector moves blocks in ``CpuGpuOffloadingHandler.transfer_async(job_id,
spec)``: per direction, one loop of ``ops.swap_blocks(src, dst, src_to_dst)`` per layer and
K/V, on the handler's own stream, then an event that ``get_finished()`` polls. Here the loop
is one prepared cupy_swap op per direction, built when the handler is made: every layer's K
and V in one launch. Caches: per layer ``[2, blocks, 16, 8, 128]`` bf16 (Llama-3-8B, 32
layers: 64 parts of 32 KiB blocks), or ``--mla``: ``[blocks, 64, 576]`` (DeepSeek-V3, 61
layers of 72 KiB blocks); the CPU tensors have the same shapes, pinned.

    python examples/vllm_offload.py [--mla] [--blocks 40]
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

LLAMA = dict(layers=32, shape=(2, None, 16, 8, 128))  # K/V first: kv_dim_before_num_blocks
MLA = dict(layers=61, shape=(None, 64, 576))  # one latent cache per layer


class OffloadHandler:
    """vLLM's CpuGpuOffloadingHandler for one direction, with cupy_swap in transfer_async."""

    def __init__(self, src_tensors, dst_tensors, sw):
        # The parts, in vLLM's loop order: each tensor, split along K/V where K/V come first.
        parts = lambda ts: [t[kv] for t in ts for kv in range(2)] if ts[0].dim() == 5 else list(ts)  # noqa: E731
        self.op = sw.prepare(parts(src_tensors), parts(dst_tensors))  # checked once, here
        self.stream, self.jobs = torch.cuda.Stream(), {}

    def transfer_async(self, job_id: int, src_to_dst: np.ndarray) -> bool:
        # Where vLLM loops over ops.swap_blocks: one call, on the handler's stream, after the
        # compute that wrote the blocks (the current stream); the event is what vLLM records.
        self.jobs[job_id] = self.op(src_to_dst, stream=self.stream, wait_for=torch.cuda.current_stream())
        return True

    def get_finished(self) -> list:
        done = [job for job, event in self.jobs.items() if event.done]  # polled, never waited on
        for job in done:
            del self.jobs[job]
        return [(job, True) for job in done]


def bits(t):
    return t.view(torch.int16).cpu().numpy()  # bf16 as raw bits, for bit-exact checks


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="vLLM V1 CPU offload with cupy_swap in transfer_async.")
    p.add_argument("--mla", action="store_true", help="DeepSeek-V3's MLA cache instead of Llama-3-8B's")
    p.add_argument("--blocks", type=int, default=40, help="blocks each transfer moves")
    p.add_argument("--gpu-blocks", type=int, default=96)
    args = p.parse_args(argv)
    sw = cupy_swap.BlockSwapper(max_blocks=4096)  # without a GPU: CudaUnavailableError (below)
    if torch is None or not torch.cuda.is_available():
        print(f"{sys.argv[0]}: needs PyTorch with CUDA (pip install torch)", file=sys.stderr)
        return 3
    geometry, n, gpu_blocks = MLA if args.mla else LLAMA, args.blocks, args.gpu_blocks
    shape = lambda blocks: [blocks if d is None else d for d in geometry["shape"]]  # noqa: E731
    gpu = [torch.randn(shape(gpu_blocks), device="cuda").bfloat16() for _ in range(geometry["layers"])]
    cpu = [torch.zeros(shape(2 * gpu_blocks), dtype=torch.bfloat16).pin_memory() for _ in gpu]
    store, load = OffloadHandler(gpu, cpu, sw), OffloadHandler(cpu, gpu, sw)

    g = np.random.default_rng(0).permutation(gpu_blocks)[:n]
    c = np.random.default_rng(1).permutation(2 * gpu_blocks)[:n]
    store.transfer_async(1, np.stack([g, c], 1))  # GPU blocks g -> CPU blocks c
    while not store.get_finished():  # the scheduler's next steps, in vLLM
        pass
    axis = 1 if len(geometry["shape"]) == 5 else 0  # the blocks axis
    for src, dst in zip(gpu, cpu):
        assert np.array_equal(np.take(bits(dst), c, axis), np.take(bits(src), g, axis))
    expected = [bits(t) for t in gpu]
    for t in gpu:
        t.zero_()  # the GPU blocks were evicted; load them back into other blocks
    back = np.random.default_rng(2).permutation(gpu_blocks)[:n]
    load.transfer_async(2, np.stack([c, back], 1))
    while not load.get_finished():
        pass
    for t, want in zip(gpu, expected):
        got = bits(t)
        assert np.array_equal(np.take(got, back, axis), np.take(want, g, axis))
        rest = np.setdiff1d(np.arange(gpu_blocks), back)
        assert not np.take(got, rest, axis).any()  # nothing else was written
    parts = 2 * len(gpu) if axis else len(gpu)
    what = "MLA, DeepSeek-V3" if args.mla else "Llama-3-8B"
    print(f"ok: {what}: {parts} parts x {n} blocks stored to CPU and loaded back, one launch each: bit-exact")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except cupy_swap.CudaUnavailableError as e:  # no GPU, driver or CuPy here: one line, exit 3
        print(f"{sys.argv[0]}: {e}", file=sys.stderr)
        sys.exit(3)
