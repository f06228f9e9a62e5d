"""One host copy per node: a pool pinned in chunks, shared by one process per GPU.

Tensor-parallel ranks (one process per GPU) each keep a slice of the KV cache in
CPU RAM. ``cupy_swap.pin_shared`` makes one pool for all of them: the parent
creates it (its pages interleaved over the GPUs' NUMA nodes, pinned in chunks in
the background, a progress bar on stderr), each rank opens it by name (pinning
its own mapping in chunks) and swaps its own rows out and back in, bit-exact.
On a one-GPU machine the ranks share that GPU.

    python examples/host_pool.py [--ranks 2] [--gib 1] [--chunk-gib 0.25]
"""

import argparse
import multiprocessing
import os
import sys

import numpy as np

import cupy_swap

BLOCK = (16, 8, 128)  # 32 KiB of fp16 per block


def rank_main(name, shape, chunk, rank, ranks, results):
    try:
        import cupy  # here, not at the top: --help works without CuPy

        device = rank % cupy.cuda.runtime.getDeviceCount()
        with cupy.cuda.Device(device):
            handle = cupy_swap.pin_shared(
                name, shape, np.float16, chunk_bytes=chunk
            )  # open: pins this mapping
            pool = handle.array
            rows = np.arange(rank, shape[0], ranks)[
                :256
            ]  # this rank's slice of the pool (every ranks-th row)
            n = len(rows)
            data = np.random.default_rng(rank).integers(0, 1 << 16, (n, *BLOCK), dtype=np.uint16)
            gpu = cupy.asarray(data).view(cupy.float16)
            sw = cupy_swap.BlockSwapper(max_blocks=n, device=device)
            sw.swap_out(
                gpu, pool, (np.arange(n), rows)
            ).synchronize()  # the pair form: (GPU blocks, pool rows)
            back = cupy.zeros_like(gpu)
            sw.swap_in(pool, back, np.stack([rows, np.arange(n)], 1)).synchronize()  # (N, 2) rows
            same = bool(cupy.array_equal(back.view(cupy.uint16), gpu.view(cupy.uint16)))
        results.put((rank, device, n, same))
    except BaseException as e:  # reported by the parent
        results.put((rank, None, 0, repr(e)))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="One pinned host pool per node, shared by one process per GPU.")
    p.add_argument("--ranks", type=int, default=2, help="processes, one per GPU (round robin)")
    p.add_argument("--gib", type=float, default=1.0, help="pool size in GiB")
    p.add_argument("--chunk-gib", type=float, default=0.25, help="registration chunk in GiB")
    args = p.parse_args(argv)
    if args.ranks < 1 or args.gib <= 0 or args.chunk_gib <= 0:
        p.error("--ranks, --gib and --chunk-gib must be positive")
    block_bytes = int(np.prod(BLOCK)) * 2
    shape = (max(args.ranks, int(args.gib * 2**30) // block_bytes), *BLOCK)
    chunk, name = int(args.chunk_gib * 2**30), f"cupy_swap_host_pool_{os.getpid()}"
    handle = cupy_swap.pin_shared(
        name,
        shape,
        np.float16,
        create=True,
        devices=None,
        chunk_bytes=chunk,
        background=True,
        progress=cupy_swap.hostpool.ProgressBar("pinning the shared pool"),
    )
    try:
        if not handle.wait(timeout=3600):
            raise RuntimeError(f"the pool was not pinned: {handle!r}")
        print(f"pool: {shape[0]} blocks, {len(handle.chunks)} chunks, NUMA: {handle.placement.describe()}")
        ctx = multiprocessing.get_context("spawn")  # fresh processes, each starting CUDA itself
        results = ctx.Queue()
        procs = [
            ctx.Process(target=rank_main, args=(name, shape, chunk, r, args.ranks, results))
            for r in range(args.ranks)
        ]
        for proc in procs:
            proc.start()
        reports = sorted(results.get(timeout=600) for _ in procs)
        for proc in procs:
            proc.join(timeout=60)
        bad = 0
        for rank, device, n, same in reports:
            mine = handle.array[np.arange(rank, shape[0], args.ranks)[:n]].view(np.uint16)
            expect = np.random.default_rng(rank).integers(0, 1 << 16, (n, *BLOCK), dtype=np.uint16)
            ok = same is True and np.array_equal(mine, expect)  # the parent sees each rank's rows too
            bad += not ok
            print(
                f"{'ok' if ok else 'MISMATCH'}: rank {rank} on GPU {device} swapped {n} blocks of its slice "
                f"out and in: {'bit-exact' if ok else same}"
            )
        return 1 if bad else 0
    finally:
        cupy_swap.unlink_shared(name, missing_ok=True)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except cupy_swap.CudaUnavailableError as e:  # no GPU, driver or CuPy here: one line, exit 3
        print(f"{sys.argv[0]}: {e}", file=sys.stderr)
        sys.exit(3)
