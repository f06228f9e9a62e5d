"""Kernel swaps through the one path (a ring slot, one launch, one
event): row and part counts at the edges of the forms it replaced, captures
with rows of their own, slots reused across streams, and the recycled swap
events."""

import gc

import numpy as np
import pytest

import cupy_swap as cs
from cupy_swap.tools.bench import random_mapping

from .gpu_helpers import DIRECTIONS, UNDER_SANITIZER, check_swap, make, poison, rand_fill, require_gpu

pytestmark = pytest.mark.gpu

cp = require_gpu()

# Row counts at the edges of the inline tiers the slot path replaced.
EDGES = [1, 2, 16, 17, 192, 193, 1024, 1025, 1792, 1793]


@pytest.mark.parametrize("direction", list(DIRECTIONS))
@pytest.mark.parametrize("n", EDGES)
def test_pair_counts_at_every_tier_edge(rng, direction, n):
    sw = cs.BlockSwapper(max_blocks=2048)
    src_kind, dst_kind = DIRECTIONS[direction]
    src, dst = make(src_kind, (2100, 96), np.uint8), make(dst_kind, (2100, 96), np.uint8)
    rand_fill(src, rng)
    poison(dst)
    check_swap(sw, src, dst, random_mapping(n, 2100, 2100, rng), mode="kernel")


PART_EDGES = [1, 4, 5, 16, 17, 64, 65, 256]  # the kernels' part tiers and past them


@pytest.mark.parametrize("parts", PART_EDGES)
@pytest.mark.parametrize("n", [3, 100])
def test_part_counts_at_every_tier_edge(rng, parts, n):
    """Every part tier's edge; block sizes differ per part so a part table
    read wrong moves the wrong bytes."""
    sw = cs.BlockSwapper(max_blocks=256)
    host = [cs.empty_pinned((120, 16 * (i % 7 + 1)), np.uint8) for i in range(parts)]
    gpu = [cp.empty((110, 16 * (i % 7 + 1)), cp.uint8) for i in range(parts)]
    for h in host:
        rand_fill(h, rng)
    for g in gpu:
        poison(g)
    check_swap(sw, host, gpu, random_mapping(n, 120, 110, rng), mode="kernel")


def test_captured_swaps_keep_their_pairs_in_rows_of_their_own(rng):
    """A captured launch reads rows of its own (checked on the host at
    capture): no ring slot is taken, and each replay moves the pairs given
    at capture."""
    sw = cs.BlockSwapper(max_blocks=64)
    host = cs.empty_pinned((64, 1024), np.uint8)
    gpu = cp.empty((64, 1024), cp.uint8)
    rand_fill(host, rng)
    maps = [random_mapping(n, 64, 64, rng) for n in (1, 10, 40)]
    stream = cp.cuda.Stream(non_blocking=True)
    sw.swap_in(host, gpu, maps[0], stream=stream, mode="kernel").synchronize()  # compile first
    poison(gpu)
    stream.synchronize()
    stream.begin_capture()
    try:
        for m in maps:
            sw.swap_in(host, gpu, m, stream=stream, mode="kernel")
    finally:
        graph = stream.end_capture()
    for _ in range(2):
        poison(gpu)
        cp.cuda.Device().synchronize()
        graph.launch(stream)
        stream.synchronize()
        expected = np.full((64, 1024), 0xA5, np.uint8)
        for m in maps:
            expected[m[:, 1]] = host[m[:, 0]]
        assert np.array_equal(cp.asnumpy(gpu), expected)


def test_swap_events_are_recycled_only_when_dropped(rng):
    sw = cs.BlockSwapper(max_blocks=16)
    host = cs.empty_pinned((16, 256), np.uint8)
    gpu = cp.empty((16, 256), cp.uint8)
    held = [sw.swap_in(host, gpu, [(i, i)], mode="kernel") for i in range(8)]
    assert len({id(e) for e in held}) == 8  # events the caller holds are never reused
    assert len({e.ptr for e in held}) == 8
    for e in held:
        e.synchronize()
        assert e.done and e.path == "kernel"
    first = held[0]
    first_id = id(first)
    del held, e, first
    gc.collect()
    again = [sw.swap_in(host, gpu, [(1, 2)], mode="kernel") for _ in range(3)]
    assert UNDER_SANITIZER or first_id in {id(e) for e in again}  # a dropped event came back
    for e in again:
        e.synchronize()
        assert e.path == "kernel" and e.nbytes == 256 and e.start is None
    timed = sw.swap_in(host, gpu, [(3, 4)], timing=True)
    assert timed.device_time() >= 0  # timed swaps get fresh events with a start


def test_slots_serve_two_streams_and_keep_each_calls_pairs(rng):
    """Calls alternating between two streams, each with its own mapping,
    take slots in turn: all land."""
    sw = cs.BlockSwapper(max_blocks=64)
    host = cs.empty_pinned((256, 2048), np.uint8)
    rand_fill(host, rng)
    gpus = [cp.empty((256, 2048), cp.uint8) for _ in range(2)]
    streams = [cp.cuda.Stream(non_blocking=True) for _ in range(2)]
    expected = [np.full((256, 2048), 0xA5, np.uint8) for _ in range(2)]
    for g in gpus:
        poison(g)
    cp.cuda.Device().synchronize()
    perm = rng.permutation(256)
    for i in range(16):
        k = i % 2
        m = np.column_stack((rng.permutation(256)[:16], perm[16 * i : 16 * i + 16]))
        sw.swap_in(host, gpus[k], m, stream=streams[k], mode="kernel")
        expected[k][m[:, 1]] = host[m[:, 0]]
    for k in range(2):
        streams[k].synchronize()
        assert np.array_equal(cp.asnumpy(gpus[k]), expected[k])
    assert sw._launcher.slots.busy() == 0  # every launch wrote its slot's done word


def test_a_capture_takes_no_ring_slot(rng):
    """While a stream captures, the kernel is launched plainly over rows of
    its own: the ring's slots stay free."""
    sw = cs.BlockSwapper(max_blocks=16)
    host = cs.empty_pinned((16, 512), np.uint8)
    gpu = cp.empty((16, 512), cp.uint8)
    rand_fill(host, rng)
    stream = cp.cuda.Stream(non_blocking=True)
    sw.swap_in(host, gpu, [(0, 0)], stream=cp.cuda.Stream.null, mode="kernel").synchronize()
    stream.begin_capture()
    try:
        sw.swap_in(host, gpu, [(1, 2), (3, 4)], stream=stream, mode="kernel")
    finally:
        graph = stream.end_capture()
    assert sw._launcher.slots.busy() == 0
    poison(gpu)
    cp.cuda.Device().synchronize()
    graph.launch(stream)
    stream.synchronize()
    got = cp.asnumpy(gpu)
    assert np.array_equal(got[[2, 4]], host[[1, 3]])
