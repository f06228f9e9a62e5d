"""One pinned pool shared by processes (cupy_swap.shared_pinned): processes
on one or two GPUs swap in and out of the same bytes, bit-exactly, and a
process killed mid-swap leaves the pool usable by the others."""

import multiprocessing
import os
import signal
import time
import uuid

import numpy as np
import pytest

import cupy_swap as cs

from . import pool_workers
from .gpu_helpers import require_gpu

pytestmark = pytest.mark.gpu

cp = require_gpu()

SHAPE = (4096, 8192)  # 32 MiB of 8 KiB blocks


@pytest.fixture
def pool_name():
    name = f"test-{uuid.uuid4().hex[:12]}"
    yield name
    cs.unlink_shared(name, missing_ok=True)


_children: list = []


@pytest.fixture(autouse=True)
def _no_child_left_behind():
    """A failed assertion must not leave a spawned child running."""
    yield
    while _children:
        proc = _children.pop()
        if proc.exitcode is None:
            proc.terminate()
            proc.join(10)


def _spawn(target, *args):
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=target, args=(*args, queue))
    proc.start()
    _children.append(proc)
    return proc, queue


def _result(queue, timeout=120):
    status, detail = queue.get(timeout=timeout)
    assert status != "error", detail
    return status, detail


def _two_processes_swap(pool_name, rng, devices):
    pool = cs.shared_pinned(pool_name, SHAPE, np.uint8, create=True)
    pool[...] = rng.integers(0, 256, SHAPE, dtype=np.uint8)
    rows = rng.permutation(SHAPE[0])
    # Each process reads its own rows and writes others: no row is both read and written.
    jobs = [(rows[0:700], rows[700:1200], 11), (rows[1200:1900], rows[1900:2400], 22)]
    before = pool.copy()
    procs = [
        _spawn(pool_workers.swap_both_ways, pool_name, SHAPE, d, r_in, r_out, seed)
        for d, (r_in, r_out, seed) in zip(devices, jobs)
    ]
    for proc, queue in procs:
        assert _result(queue)[0] == "ok"
        proc.join(60)
        assert proc.exitcode == 0
    for _, r_out, seed in jobs:
        data = np.random.default_rng(seed).integers(0, 256, (len(r_out), SHAPE[1]), dtype=np.uint8)
        assert np.array_equal(pool[r_out], data)  # what each child swapped out, seen here
    untouched = rows[2400:]
    assert np.array_equal(pool[untouched], before[untouched])


def test_two_processes_one_gpu_share_a_pool(pool_name, rng):
    _two_processes_swap(pool_name, rng, (0, 0))


@pytest.mark.multi_gpu
def test_two_processes_two_gpus_share_a_pool(pool_name, rng):
    _two_processes_swap(pool_name, rng, (0, 1))


def test_a_process_killed_mid_swap_leaves_the_pool_usable(pool_name, rng):
    gpus = cp.cuda.runtime.getDeviceCount()
    pool = cs.shared_pinned(pool_name, SHAPE, np.uint8, create=True)
    pool[...] = rng.integers(0, 256, SHAPE, dtype=np.uint8)
    rows = rng.permutation(SHAPE[0])
    victim_rows, ours = rows[:1000], rows[1000:2000]
    proc, queue = _spawn(pool_workers.swap_until_killed, pool_name, SHAPE, gpus - 1, victim_rows)
    assert _result(queue)[0] == "started"
    time.sleep(0.3)  # let it get deep into its loop of swaps
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(30)
    assert proc.exitcode == -signal.SIGKILL
    # This process, and a new one, still swap in and out of the pool bit-exactly.
    sw = cs.BlockSwapper(max_blocks=1000)
    gpu = cp.full((1000, SHAPE[1]), 0xA5, dtype=cp.uint8)
    sw.swap_in(pool, gpu, np.column_stack((ours, np.arange(1000)))).synchronize()
    assert np.array_equal(cp.asnumpy(gpu), pool[ours])
    fresh = cp.asarray(rng.integers(0, 256, (1000, SHAPE[1]), dtype=np.uint8))
    sw.swap_out(fresh, pool, np.column_stack((np.arange(1000), ours))).synchronize()
    assert np.array_equal(pool[ours], cp.asnumpy(fresh))
    proc2, queue2 = _spawn(pool_workers.swap_both_ways, pool_name, SHAPE, 0, ours[:300], rows[2000:2300], 33)
    assert _result(queue2)[0] == "ok"
    proc2.join(60)
    data = np.random.default_rng(33).integers(0, 256, (300, SHAPE[1]), dtype=np.uint8)
    assert np.array_equal(pool[rows[2000:2300]], data)


def test_opening_checks_shape_and_the_pool_is_pinned_and_mapped(pool_name):
    pool = cs.shared_pinned(pool_name, (64, 4096), np.float16, create=True)
    assert cs.is_pinned(pool) and pool.shape == (64, 4096) and pool.dtype == np.float16
    again = cs.shared_pinned(pool_name, (64, 4096), np.float16)  # a second mapping in this process
    assert cs.is_pinned(again) and again.ctypes.data != pool.ctypes.data
    pool[3, :5] = 1.5
    assert np.array_equal(again[3, :5], np.full(5, 1.5, np.float16))
    with pytest.raises(ValueError, match="holds shape"):
        cs.shared_pinned(pool_name, (64, 2048), np.float16)
    with pytest.raises(FileExistsError, match="already exists"):
        cs.shared_pinned(pool_name, (64, 4096), np.float16, create=True)


def test_a_dropped_mapping_is_unregistered(pool_name):
    from cupy_swap.cuda import memory

    pool = cs.shared_pinned(pool_name, (16, 4096), np.uint8, create=True)
    start = pool.ctypes.data
    del pool
    assert memory.release_dropped(timeout=30)  # the releaser thread unregistered and unmapped it
    assert memory.host_alias(start, 1) == 0
