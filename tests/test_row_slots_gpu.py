"""Host rows through ring slots (GPU): every kernel swap's rows are written
into a pinned ring slot, which the slot kernel reads through its device
alias, checks, and copies by.  Exact against
NumPy, with poisoned destinations; a bad row writes nothing; a slot is
never rewritten while a queued swap still reads it (busy stream, ring
wrapped many times, two threads)."""

import threading

import numpy as np
import pytest

import cupy_swap as cs
from cupy_swap.tools.bench import random_mapping

from .gpu_helpers import (
    DIRECTIONS,
    POISON,
    another_thread_capturing,
    make,
    poison,
    rand_fill,
    require_gpu,
    spin,
    to_host,
)

pytestmark = pytest.mark.gpu

cp = require_gpu()


@pytest.mark.parametrize("direction", ["in", "out"])
@pytest.mark.parametrize("parts", [1, 3, 64])
@pytest.mark.parametrize("n", [1, 2, 16, 17, 300, 1250, 1793, 4096])
def test_rows_through_a_slot_land_exactly(rng, direction, parts, n):
    blocks = 4200 if n > 1250 else 1300
    block = {1: 80, 3: 52, 64: 48}[parts]  # 52: 4-byte units
    skind, dkind = DIRECTIONS[direction]
    src = [make(skind, (blocks, block), np.uint8) for _ in range(parts)]
    dst = [make(dkind, (blocks, block), np.uint8) for _ in range(parts)]
    for a in src:
        rand_fill(a, rng)
    for a in dst:
        poison(a)
    sw = cs.BlockSwapper(max_blocks=4096)
    op = sw.prepare(src, dst)
    m = random_mapping(n, blocks, blocks, rng)
    ev = op(m, mode="kernel")  # one row of one part: auto would take the copy engine
    ev.synchronize()
    assert ev.path == "kernel"
    served = op._variants[("kernel", None)]  # (a call's own mode: the op prepared with it)
    assert any(a is not None for a in served._decided.kernel._slot_calls), "a ring slot served it"
    untouched = np.setdiff1d(np.arange(blocks), m[:, 1])
    for s, d in zip(src, dst):
        s, d = to_host(s), to_host(d)
        assert np.array_equal(d[m[:, 1]], s[m[:, 0]])
        assert (d[untouched] == POISON).all()


@pytest.mark.parametrize("fault", ["source", "destination", "duplicate"])
def test_a_bad_row_in_a_slot_writes_nothing_and_is_reported(rng, fault):
    sw = cs.BlockSwapper(max_blocks=2048)
    host = cs.empty_pinned((2000, 64), np.uint8)
    gpu = cp.empty((2000, 64), cp.uint8)
    rand_fill(host, rng)
    poison(gpu)
    m = random_mapping(1000, 2000, 2000, rng)
    if fault == "source":
        m[613, 0], message = 2000, "source block index 2000 in row 613"
    elif fault == "destination":
        m[613, 1], message = -1, "destination block index -1 in row 613"
    else:
        m[613, 1], message = m[12, 1], f"block {m[12, 1]} again in row 613"
    ev = sw.swap_in(host, gpu, m)  # no host check: the launch checks
    with pytest.raises((IndexError, ValueError), match=message):
        ev.synchronize()
    assert (cp.asnumpy(gpu) == POISON).all()
    with pytest.raises((IndexError, ValueError), match="613"):
        sw.swap_in(host, gpu, m, check="host")  # the debugging check: before any launch
    good = np.delete(m, 613, axis=0)
    sw.swap_in(host, gpu, good).synchronize()
    assert np.array_equal(cp.asnumpy(gpu)[good[:, 1]], host[good[:, 0]])


def test_slots_are_not_rewritten_while_queued_swaps_read_them(rng):
    """Four times round a 4-slot ring behind a 200 ms spin: each swap's rows
    must be the ones it was called with when its kernel finally runs."""
    ring, rounds, n = 4, 4, 100
    sw = cs.BlockSwapper(max_blocks=n, ring_size=ring)
    host = cs.empty_pinned((n * ring * rounds, 32), np.uint8)
    rand_fill(host, rng)
    gpu = cp.empty_like(cp.asarray(host))
    poison(gpu)
    stream = cp.cuda.Stream(non_blocking=True)
    op = sw.prepare(host, gpu)
    spin(stream, 200)
    maps = []
    for i in range(ring * rounds):  # each swap fills its own region of gpu
        m = np.column_stack([rng.permutation(n * ring * rounds)[:n], i * n + rng.permutation(n)])
        maps.append(m)
        op(m, stream=stream)
    stream.synchronize()
    out = cp.asnumpy(gpu)
    for m in maps:
        assert np.array_equal(out[m[:, 1]], host[m[:, 0]])
    assert sw.ring_waits >= 1  # the ring wrapped while swaps were queued: a swap waited for a slot


def test_two_threads_on_two_streams_share_the_ring(rng):
    n, reps = 200, 30
    sw = cs.BlockSwapper(max_blocks=n, ring_size=3)
    host = cs.empty_pinned((2 * n, 128), np.uint8)
    rand_fill(host, rng)
    gpus = [cp.empty((2 * n, 128), cp.uint8) for _ in range(2)]
    errors = []

    def worker(k):
        try:
            stream = cp.cuda.Stream(non_blocking=True)
            with stream:
                local = np.random.default_rng(k)
                for _ in range(reps):
                    poison(gpus[k])
                    m = random_mapping(n, 2 * n, 2 * n, local)
                    sw.swap_in(host, gpus[k], m, stream=stream).synchronize()
                    got = cp.asnumpy(gpus[k])
                    assert np.array_equal(got[m[:, 1]], host[m[:, 0]])
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors


def test_a_captured_swap_of_many_rows_is_checked_on_the_host(rng):
    """While a stream captures, rows cannot go through a slot (a replay
    would read whatever the slot holds then): they are checked on the host
    and travel in the captured launch."""
    sw = cs.BlockSwapper(max_blocks=512)
    host = cs.empty_pinned((600, 64), np.uint8)
    rand_fill(host, rng)
    gpu = cp.empty((600, 64), cp.uint8)
    poison(gpu)
    m = random_mapping(500, 600, 600, rng)
    op = sw.prepare(host, gpu)
    op(m).synchronize()  # compiled, nodes built
    poison(gpu)
    stream = cp.cuda.Stream(non_blocking=True)
    bad = m.copy()
    bad[400, 1] = bad[3, 1]
    with stream:
        stream.begin_capture()
        try:
            with pytest.raises(ValueError, match="twice"):
                op(bad, stream=stream)
            op(m, stream=stream)
        finally:
            graph = stream.end_capture()
    graph.launch(stream)
    stream.synchronize()
    assert np.array_equal(cp.asnumpy(gpu)[m[:, 1]], host[m[:, 0]])


def test_slot_swaps_while_another_thread_captures_in_global_mode(rng):
    """Review finding: taking a slot queried (or waited for) its last event
    in the thread's own capture mode, which a global-mode capture on another
    thread forbids; the swap raised and the capture was invalidated.  The
    query runs in relaxed mode."""
    sw = cs.BlockSwapper(max_blocks=64, ring_size=2)
    host = cs.empty_pinned((128, 256), np.uint8)
    rand_fill(host, rng)
    gpu = cp.empty((128, 256), cp.uint8)
    stream = cp.cuda.Stream(non_blocking=True)
    for _ in range(3):  # round the ring: every slot now has an event to query
        sw.swap_in(host, gpu, random_mapping(32, 128, 128, rng), stream=stream).synchronize()
    maps = [np.column_stack((rng.permutation(128)[:32], 32 * i + rng.permutation(32))) for i in range(4)]
    with another_thread_capturing(sw.device):
        for m in maps:  # through both slots twice: each waits for the event of the swap before
            sw.swap_in(host, gpu, m, stream=stream)  # no synchronize(): not legal during the capture
    stream.synchronize()
    out = cp.asnumpy(gpu)
    for m in maps:
        assert np.array_equal(out[m[:, 1]], host[m[:, 0]])
