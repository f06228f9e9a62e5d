"""Many processes, one pinned host pool: ``cupy_swap.shared_pinned``.

Servers run one process per GPU. ``shared_pinned(name, shape, dtype)`` gives every
process the same pinned, GPU-mapped host pool (POSIX shared memory), so a block one
process swaps out, another can swap in: one host copy of a prefix cache for all ranks.
Here the parent creates the pool and swaps blocks out from its GPU; each worker (on
GPU rank % GPUs) opens the pool by name, swaps those blocks in and checks them, then
swaps blocks of its own out to its own rows, which the parent checks.

    python examples/shared_pool.py [--workers 2] [--blocks 64]
"""

import argparse
import multiprocessing
import os
import sys

import numpy as np

import cupy_swap

BLOCK = (16, 8, 128)  # 32 KiB of fp16


def rows(start: int, n: int) -> np.ndarray:
    return np.stack([np.arange(n), np.arange(start, start + n)], 1)  # GPU block i <-> pool row start + i


def worker(name: str, shape: tuple, rank: int, n: int, results) -> None:
    try:
        import cupy  # here, not at the top: --help works without CuPy

        device = rank % cupy.cuda.runtime.getDeviceCount()
        with cupy.cuda.Device(device):
            pool = cupy_swap.shared_pinned(name, shape, np.float16)  # open: same name, shape, dtype
            sw = cupy_swap.BlockSwapper(max_blocks=n, device=device)
            gpu = cupy.empty((n, *BLOCK), cupy.float16)
            sw.swap_in(pool, gpu, rows(0, n)).synchronize()  # the parent's blocks, rows 0..n-1
            same = np.array_equal(cupy.asnumpy(gpu).view(np.uint16), pool[:n].view(np.uint16))
            mine = cupy.full((n, *BLOCK), rank + 1, cupy.float16)
            sw.swap_out(mine, pool, rows((rank + 1) * n, n)).synchronize()  # rows of its own
        results.put((rank, device, same))
    except BaseException as e:  # reported by the parent
        results.put((rank, None, repr(e)))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description="Share one pinned host pool between processes.")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--blocks", type=int, default=64, help="blocks each process moves")
    args = p.parse_args(argv)
    try:  # CuPy imported once the arguments are parsed: --help works without it
        import cupy
    except ImportError as e:  # CuPy comes with the cuda12 or cuda13 extra: one line, exit 3 (below)
        msg = f"needs CuPy ({e}); install cupy_swap with its cuda12 or cuda13 extra"
        raise cupy_swap.CudaUnavailableError(msg) from e
    n, name = args.blocks, f"cupy_swap_example_{os.getpid()}"
    shape = ((1 + args.workers) * n, *BLOCK)
    pool = cupy_swap.shared_pinned(name, shape, np.float16, create=True)  # zero-filled
    try:
        data = np.random.default_rng(0).integers(0, 1 << 16, (n, *BLOCK), dtype=np.uint16)
        gpu = cupy.asarray(data).view(cupy.float16)
        cupy_swap.BlockSwapper(max_blocks=n).swap_out(gpu, pool, rows(0, n)).synchronize()
        assert np.array_equal(pool[:n].view(np.uint16), data)
        ctx = multiprocessing.get_context("spawn")  # fresh processes, each starting CUDA itself
        results = ctx.Queue()
        procs = [ctx.Process(target=worker, args=(name, shape, r, n, results)) for r in range(args.workers)]
        for proc in procs:
            proc.start()
        reports = sorted(results.get(timeout=300) for _ in procs)
        for proc in procs:
            proc.join()
        for rank, device, same in reports:
            assert same is True, f"worker {rank}: {same}"
            assert np.array_equal(
                pool[rows((rank + 1) * n, n)[:, 1]], np.full((n, *BLOCK), rank + 1, np.float16)
            )
            print(
                f"ok: worker {rank} on GPU {device} swapped in the parent's {n} blocks and out {n} of its own: bit-exact"
            )
    finally:
        cupy_swap.unlink_shared(name)  # the name goes; the memory once every process has let go


if __name__ == "__main__":
    try:
        sys.exit(main())
    except cupy_swap.CudaUnavailableError as e:  # no GPU, driver or CuPy here: one line, exit 3
        print(f"{sys.argv[0]}: {e}", file=sys.stderr)
        sys.exit(3)
