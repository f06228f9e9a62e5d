"""Kernel swaps whose pairs travel in the launch parameters: every tier and
its edges, the descriptor fallback beyond them, capture without descriptor
slots, and the recycled swap events."""

import gc

import numpy as np
import pytest

import cupy_swap as cs
from cupy_swap.cuda import abi
from cupy_swap.tools.bench import random_mapping

from .gpu_helpers import DIRECTIONS, check_swap, make, poison, rand_fill, require_gpu

pytestmark = pytest.mark.gpu

cp = require_gpu()

# Pair counts at each tier's edge and one past the last (descriptor ring).
EDGES = sorted({n for t in abi.TIERS for n in (t.pairs, t.pairs + 1)} | {1})


@pytest.mark.parametrize("direction", list(DIRECTIONS))
@pytest.mark.parametrize("n", EDGES)
def test_pair_counts_at_every_tier_edge(rng, direction, n):
    sw = cs.BlockSwapper(max_blocks=2048)
    src_kind, dst_kind = DIRECTIONS[direction]
    src, dst = make(src_kind, (2100, 96), np.uint8), make(dst_kind, (2100, 96), np.uint8)
    rand_fill(src, rng)
    poison(dst)
    check_swap(sw, src, dst, random_mapping(n, 2100, 2100, rng), mode="kernel")


PART_EDGES = sorted({p for t in abi.TIERS for p in (t.parts, t.parts + 1)} - {abi.MAX_PARTS + 1})


@pytest.mark.parametrize("inline", [None, 0], ids=["inline", "descriptor"])
@pytest.mark.parametrize("parts", PART_EDGES)
@pytest.mark.parametrize("n", [3, 100])
def test_part_counts_at_every_tier_edge(rng, parts, n, inline):
    """Every tier's part edge, inline and through the descriptor ring; block
    sizes differ per part so a part table read wrong moves the wrong bytes."""
    sw = cs.BlockSwapper(max_blocks=256, max_inline_pairs=inline)
    host = [cs.empty_pinned((120, 16 * (i % 7 + 1)), np.uint8) for i in range(parts)]
    gpu = [cp.empty((110, 16 * (i % 7 + 1)), cp.uint8) for i in range(parts)]
    for h in host:
        rand_fill(h, rng)
    for g in gpu:
        poison(g)
    check_swap(sw, host, gpu, random_mapping(n, 120, 110, rng), mode="kernel")


def test_inline_and_descriptor_forms_agree(rng):
    host = cs.empty_pinned((3000, 4096), np.uint8)
    rand_fill(host, rng)
    m = random_mapping(1500, 3000, 2000, rng)
    outs = []
    for limit in (None, 0):
        sw = cs.BlockSwapper(max_blocks=2048, max_inline_pairs=limit)
        gpu = cp.empty((2000, 4096), cp.uint8)
        poison(gpu)
        check_swap(sw, host, gpu, m, mode="kernel")
        outs.append(cp.asnumpy(gpu))
    assert np.array_equal(outs[0], outs[1])


def test_max_inline_pairs_checked():
    with pytest.raises(ValueError, match="max_inline_pairs: expected an int >= 0, got -1"):
        cs.BlockSwapper(max_blocks=4, max_inline_pairs=-1)


def test_captured_inline_swaps_keep_their_pairs_without_slots(rng):
    """A captured inline launch carries its pairs in the graph node: no
    capture slot is taken (there are none here), and each replay moves the
    pairs given at capture."""
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
    assert first_id in {id(e) for e in again}  # a dropped event came back
    for e in again:
        e.synchronize()
        assert e.path == "kernel" and e.nbytes == 256 and e.start is None
    timed = sw.swap_in(host, gpu, [(3, 4)], timing=True)
    assert timed.device_time() >= 0  # timed swaps get fresh events with a start


def test_kernel_nodes_per_stream_keep_each_calls_pairs(rng):
    """Eager inline swaps launch a kernel node per (kernel, stream); calls
    alternating between two streams, each with its own mapping, all land,
    and the second stream got a node of its own (one shared node would
    serialize the streams)."""
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
    assert {key[-1] for key in sw._launcher._nodes} == {s.ptr for s in streams}


def test_a_capture_adds_no_kernel_node(rng):
    """While a stream captures, the inline kernel is launched plainly (a
    graph launch cannot be captured): the capture makes no node."""
    sw = cs.BlockSwapper(max_blocks=16)
    host = cs.empty_pinned((16, 512), np.uint8)
    gpu = cp.empty((16, 512), cp.uint8)
    rand_fill(host, rng)
    stream = cp.cuda.Stream(non_blocking=True)
    sw.swap_in(host, gpu, [(0, 0)], stream=cp.cuda.Stream.null, mode="kernel").synchronize()
    before = dict(sw._launcher._nodes)
    stream.begin_capture()
    try:
        sw.swap_in(host, gpu, [(1, 2), (3, 4)], stream=stream, mode="kernel")
    finally:
        graph = stream.end_capture()
    assert sw._launcher._nodes == before
    poison(gpu)
    cp.cuda.Device().synchronize()
    graph.launch(stream)
    stream.synchronize()
    got = cp.asnumpy(gpu)
    assert np.array_equal(got[[2, 4]], host[[1, 3]])
