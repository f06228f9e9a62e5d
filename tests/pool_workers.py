"""Child-process bodies for test_shared_pool_gpu.py (spawned, so they import
CUDA afresh).  Each reports ``("ok", detail)`` or ``("error", text)`` on a
queue instead of raising, so the parent can say what went wrong."""

from __future__ import annotations

import traceback

import numpy as np


def swap_both_ways(name, shape, device, rows_in, rows_out, seed, queue):
    """Open pool ``name`` on GPU ``device``; swap in ``rows_in`` and check
    them against the pool; swap out fresh random blocks to ``rows_out``
    (made from ``seed``, so the parent can check them)."""
    try:
        import cupy

        import cupy_swap as cs

        with cupy.cuda.Device(device):
            pool = cs.shared_pinned(name, shape, np.uint8)
            sw = cs.BlockSwapper(max_blocks=len(rows_in) + len(rows_out), device=device)
            gpu = cupy.full((len(rows_in) + len(rows_out), shape[1]), 0xA5, dtype=cupy.uint8)
            m_in = np.column_stack((rows_in, np.arange(len(rows_in))))
            sw.swap_in(pool, gpu, m_in).synchronize()
            if not np.array_equal(cupy.asnumpy(gpu[: len(rows_in)]), pool[rows_in]):
                raise AssertionError(f"GPU {device}: swapped-in blocks differ from the pool")
            data = np.random.default_rng(seed).integers(0, 256, (len(rows_out), shape[1]), dtype=np.uint8)
            gpu[len(rows_in) :] = cupy.asarray(data)
            cupy.cuda.Device(device).synchronize()
            m_out = np.column_stack((np.arange(len(rows_in), len(gpu)), rows_out))
            sw.swap_out(gpu, pool, m_out).synchronize()
            if not np.array_equal(pool[rows_out], data):
                raise AssertionError(f"GPU {device}: swapped-out blocks differ in the pool")
        queue.put(("ok", device))
    except BaseException:
        queue.put(("error", traceback.format_exc()))


def swap_until_killed(name, shape, device, rows, queue):
    """Swap ``rows`` of the pool out and back in a loop until killed,
    saying "started" once the first swaps have run."""
    try:
        import cupy

        import cupy_swap as cs

        with cupy.cuda.Device(device):
            pool = cs.shared_pinned(name, shape, np.uint8)
            sw = cs.BlockSwapper(max_blocks=len(rows), device=device)
            gpu = cupy.zeros((len(rows), shape[1]), dtype=cupy.uint8)
            m_out = np.column_stack((np.arange(len(rows)), rows))
            m_in = m_out[:, ::-1].copy()
            sw.swap_out(gpu, pool, m_out).synchronize()
            queue.put(("started", device))
            while True:
                sw.swap_in(pool, gpu, m_in)
                sw.swap_out(gpu, pool, m_out)
    except BaseException:
        queue.put(("error", traceback.format_exc()))
