"""A whole node: one swapper per GPU, each driven from its own thread over
one shared pinned pool, and `bench --gpus`'s harness (tools/node.py) on
small sizes, every result checked bit-exactly.  Runs on every GPU there is
(one on a single-GPU machine; the multi_gpu tests need two)."""

import numpy as np
import pytest

import cupy_swap as cs
from cupy_swap.tools.node import DIRECTIONS, run_node

from .gpu_helpers import require_gpu, run_threads, swap_worker

pytestmark = pytest.mark.gpu

cp = require_gpu()


def _per_gpu_thread(device, seed, host, results, index):
    """A thread that makes its GPU current, then swaps at random (test_threads_gpu's worker)."""
    try:
        with cp.cuda.Device(device):
            gpu = cp.asarray(np.random.default_rng(seed).integers(0, 256, (300, 4096), dtype=np.uint8))
            cp.cuda.Device(device).synchronize()
            sw = cs.BlockSwapper(max_blocks=256, device=device)
            swap_worker(sw, seed, gpu, host, results, index)
    except BaseException as e:
        results[index] = e


@pytest.mark.multi_gpu
def test_one_swapper_per_gpu_each_on_its_own_thread(rng):
    gpus = cp.cuda.runtime.getDeviceCount()
    pool = cs.empty_pinned((500 * 2 * gpus, 4096), np.uint8)
    pool[...] = rng.integers(0, 256, pool.shape, dtype=np.uint8)
    # Two threads per GPU, each on its own rows of the one pool.
    jobs = [(d % gpus, 100 + d, pool[d * 500 : (d + 1) * 500]) for d in range(2 * gpus)]
    results = [None] * len(jobs)
    run_threads([(*job, results, i) for i, job in enumerate(jobs)], _per_gpu_thread, results)
    assert all(r is True for r in results), results


@pytest.mark.parametrize("drivers", [("threads", "one-thread"), ("processes",)])
def test_node_bench_on_every_gpu_checks_its_copies(drivers):
    devices = list(range(cp.cuda.runtime.getDeviceCount()))
    r = run_node(devices, block_bytes=4096, n=64, reps=3, drivers=drivers, progress=lambda line: None)
    assert [(x["driver"], x["direction"]) for x in r["together"]] == [
        (d, k) for d in drivers for k in DIRECTIONS
    ]
    assert all(x["verified"] and x["gbps"] > 0 and x["memcpy_gbps"] > 0 for x in r["together"])
    assert len(r["alone"]) == len(devices) * len(DIRECTIONS)
