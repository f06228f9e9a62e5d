"""Why a prepared call of 61 parts of 72 KiB blocks (DeepSeek-V3's MLA cache)
cost 4-5x the host time of 64 parts of 32 KiB (Llama-3-8B) in the issue-34
run: the library's own Python for both shapes, with every CUDA call a no-op
(``host_path_cpu.py``'s stand-ins), crossed with each other's part count and
block size, so that a difference in the Python shows here and one that does
not is on the device's side (the launch, its shape, the driver).

    python benchmarks/probes/engine_shapes_host.py

On the GPU (``--gpu``), the same calls with CUDA, the stream synchronized
after each (outside the clock), for the same shapes:

    python benchmarks/probes/engine_shapes_host.py --gpu
"""

import argparse
import importlib.util
import statistics
import sys
import time
import timeit
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
KIB = 1024
# (parts, block bytes): the two engine shapes and their crossings.
SHAPES = [(64, 32 * KIB), (61, 72 * KIB), (64, 72 * KIB), (61, 32 * KIB), (61, 64 * KIB), (61, 80 * KIB)]
COUNTS = (1, 16, 256)


def cpu() -> None:
    spec = importlib.util.spec_from_file_location("host_path_cpu", HERE / "host_path_cpu.py")
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    probe.prepared.stream_is_capturing = lambda handle: False  # a CUDA call
    rng = np.random.default_rng(0)
    print("prepared call, CUDA stubbed (fastest of four timings), us:")
    for parts, block in SHAPES:
        cells = []
        for n in COUNTS:
            path, us = probe.time_case(parts, block, n, rng)
            cells.append(f"n={n}: {us:6.2f} ({path})")
        print(f"  {parts:>3} x {block // KIB:>3} KiB  " + "  ".join(cells), flush=True)
    # The copy-engine path (2 MiB blocks) against the V1 pattern's NumPy pointer lists and
    # the same batch call, both with CUDA stubbed: what the library's Python adds.
    sys.path.insert(0, str(HERE.parents[1]))
    from cupy_swap.cuda.copy_engine import DmaCopier
    from cupy_swap.tools.engines import pointer_lists

    copier = DmaCopier()
    copier._memcpy, copier._batch = (lambda *a: 0), ((lambda *a: 0), False)
    print("copy-engine path against the V1 pattern, 1 x 2 MiB, CUDA stubbed, us:")
    for n in (16, 256, 1250):
        path, us = probe.time_case(1, 2 << 20, n, rng)
        m = np.column_stack([rng.choice(2 * n, n, replace=False) for _ in range(2)]).astype(np.int64)

        def v1(m=m):
            copier.issue(*pointer_lists([1 << 40], [2 << 20], [2 << 41], [2 << 20], m, 2 << 20), 7, 1)

        v1_us = min(timeit.repeat(v1, number=2000, repeat=4)) / 2000 * 1e6
        print(f"  n={n:>5}: prepared ({path}) {us:6.2f}, V1 pattern {v1_us:6.2f}", flush=True)


def gpu(reps: int = 100) -> None:
    import cupy

    from cupy_swap import BlockSwapper, empty_pinned

    stream = cupy.cuda.Stream(non_blocking=True)
    sw = BlockSwapper(max_blocks=max(COUNTS))
    rng = np.random.default_rng(0)
    print("prepared call on the GPU, host us (fastest of five round medians; the slowest beside it):")
    for parts, block in SHAPES[:4]:  # the two engine shapes and their crossings
        blocks = 2 * max(COUNTS)
        host = [empty_pinned((blocks, block), np.uint8) for _ in range(parts)]
        dev = [cupy.zeros((blocks, block), cupy.uint8) for _ in range(parts)]
        op = sw.prepare(host, dev)
        cells = []
        for n in COUNTS:
            m = np.column_stack([rng.choice(blocks, n, replace=False) for _ in range(2)]).astype(np.int64)
            for _ in range(5):
                op(m, stream=stream)
            stream.synchronize()
            rounds = []
            for _ in range(5):
                samples = []
                for _ in range(reps // 5):
                    t0 = time.perf_counter()
                    op(m, stream=stream)
                    samples.append(time.perf_counter() - t0)
                    stream.synchronize()
                rounds.append(statistics.median(samples) * 1e6)
            cells.append(f"n={n}: {min(rounds):6.1f} (max round {max(rounds):6.1f}, {sw.last_path})")
        print(f"  {parts:>3} x {block // KIB:>3} KiB  " + "  ".join(cells), flush=True)
        del op, host, dev


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="Host time of a prepared call at the engine shapes.")
    p.add_argument("--gpu", action="store_true", help="time the calls with CUDA (needs a GPU)")
    args = p.parse_args(argv)
    sys.path.insert(0, str(HERE.parents[1]))
    gpu() if args.gpu else cpu()
    return 0


if __name__ == "__main__":
    sys.exit(main())
