"""One swapper shared by many threads: every swap of every thread lands
bit-exactly, whatever the ring size (a small ring makes threads come round
to each other's descriptor slots all the time), and with inline parameters
(threads sharing one prepared op write one parameter buffer)."""

import numpy as np
import pytest

import cupy_swap as cs

from .gpu_helpers import SWAPS_PER_THREAD, require_gpu, run_threads, swap_worker

pytestmark = pytest.mark.gpu

cp = require_gpu()

THREADS = 8


@pytest.mark.parametrize("ring_size", [1, 2, 16], ids=["ring1", "ring2", "ring16"])
def test_many_threads_share_one_swapper(ring_size):
    """Every kernel swap takes a slot of one ring."""
    sw = cs.BlockSwapper(max_blocks=256, ring_size=ring_size)
    rng = np.random.default_rng(ring_size)
    arrays = []
    for t in range(THREADS):
        # A different block size per thread: a descriptor read with another
        # thread's part table would move the wrong bytes.
        block = 256 * (t + 1) + 16 * t
        gpu = cp.asarray(rng.integers(0, 256, (300, block), dtype=np.uint8))
        host = cs.empty_pinned((400, block), np.uint8)
        host[:] = rng.integers(0, 256, host.shape, dtype=np.uint8)
        arrays.append((gpu, host))
    cp.cuda.Device().synchronize()
    results = [None] * THREADS
    run_threads(
        [(sw, 1000 * ring_size + t, gpu, host, results, t) for t, (gpu, host) in enumerate(arrays)],
        swap_worker,
        results,
    )


def test_many_threads_share_one_prepared_op():
    """One op, eight threads, disjoint destination blocks per thread: the
    op's inline parameter buffer is written under its lock, so no launch
    carries another thread's pairs."""
    sw = cs.BlockSwapper(max_blocks=256)
    rng = np.random.default_rng(7)
    host = cs.empty_pinned((4096, 512), np.uint8)
    host[:] = rng.integers(0, 256, host.shape, dtype=np.uint8)
    gpu = cp.zeros((THREADS * 200, 512), cp.uint8)
    op = sw.prepare(host, gpu)
    results = [None] * THREADS

    def worker(t):
        try:
            r = np.random.default_rng(t)
            stream = cp.cuda.Stream(non_blocking=True)
            expected = {}
            for _ in range(SWAPS_PER_THREAD):
                n = int(r.choice([1, 16, 17, 192, 200]))
                dst = t * 200 + r.choice(200, n, replace=False)
                src = r.choice(4096, n, replace=False)
                op(np.column_stack((src, dst)), stream=stream)
                expected.update(zip(dst.tolist(), src.tolist()))
            stream.synchronize()
            got = cp.asnumpy(gpu[t * 200 : (t + 1) * 200])
            results[t] = all(np.array_equal(got[d - t * 200], host[s]) for d, s in expected.items())
        except BaseException as e:
            results[t] = e

    run_threads([(t,) for t in range(THREADS)], worker, results)
