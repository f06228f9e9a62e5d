"""Staged swaps on a real GPU: copy engines between host runs and a GPU
staging arena, a kernel between the arena and the GPU blocks.  Bit-exact
against NumPy, with poisoned destinations, odd geometries, swaps larger than
the arena, ordering against earlier and later work, and several streams
sharing the arena."""

import numpy as np
import pytest

import cupy_swap as cs
from cupy_swap.tools.bench import random_mapping

from .gpu_helpers import check_swap, poison, rand_fill, require_gpu

pytestmark = pytest.mark.gpu

cp = require_gpu()

TINY_STAGING = 8 * 24 * 1024  # 24 KiB buffers: many chunks rotate through them


def _host_parts(layout, blocks):
    if layout == "packed":
        return [cs.empty_pinned((blocks, 2048), np.float16)]
    if layout == "block_first":
        pool = cs.empty_pinned((blocks, 3, 1000), np.uint8)
        return [pool[:, 2], pool[:, 0], pool[:, 1]]
    return [
        cs.empty_pinned((blocks, 1024), np.uint16),
        cs.empty_pinned((blocks, 130), np.uint8),
        cs.empty_pinned((blocks, 3), np.uint8),
    ]


def _host_blocks(order, n, pool, rng):
    start = int(rng.integers(0, pool - 2 * n))
    if order == "gaps":
        return np.sort(rng.choice(np.arange(start, start + 2 * n), n, replace=False))
    blocks = np.arange(start, start + n)
    if order == "shuffled":
        rng.shuffle(blocks)
    return blocks


@pytest.mark.parametrize("staging_bytes", [TINY_STAGING, 64 << 20])
@pytest.mark.parametrize("order", ["ascending", "shuffled", "gaps"])
@pytest.mark.parametrize("layout", ["packed", "block_first", "separate"])
@pytest.mark.parametrize("direction", ["in", "out"])
def test_staged_swap_bit_exact(rng, direction, layout, order, staging_bytes):
    n, host_blocks, gpu_blocks = 300, 700, 400
    host = _host_parts(layout, host_blocks)
    gpu = [cp.empty((gpu_blocks, *h.shape[1:]), dtype=h.dtype) for h in host]
    src, dst = (host, gpu) if direction == "in" else (gpu, host)
    for a in src:
        rand_fill(a, rng)
    for a in dst:
        poison(a)
    sw = cs.BlockSwapper(max_blocks=512, staging_bytes=staging_bytes, ring_size=4)
    for _ in range(2):  # the second swap reuses staging rows and slots the first one used
        hosts = _host_blocks(order, n, host_blocks, rng)
        gpus = rng.choice(gpu_blocks, n, replace=False)
        mapping = np.column_stack((hosts, gpus) if direction == "in" else (gpus, hosts))
        ev = check_swap(sw, src, dst, mapping, mode="staged")
        assert sw.last_path == "staged" and ev.path == "staged"


def test_auto_stages_a_host_run_and_leaves_scattered_rows_to_the_kernel(rng):
    """auto looks at the ends of a call's rows (issue 34, item 6): a host
    column that is one long run is staged, scattered blocks of the same
    layout take the kernel; staging any mapping is asked for."""
    block, n = 32768, 1250
    host = cs.empty_pinned((2 * n, block), np.uint8)
    gpu = cp.empty((2 * n, block), dtype=cp.uint8)
    rand_fill(host, rng)
    poison(gpu)
    sw = cs.BlockSwapper(max_blocks=n)
    gpu_random = rng.choice(2 * n, n, replace=False)
    runs = np.column_stack((np.arange(100, 100 + n), gpu_random))
    check_swap(sw, host, gpu, runs)
    assert sw.last_path == "staged"
    check_swap(sw, host, gpu, random_mapping(n, 2 * n, 2 * n, rng))
    assert sw.last_path == "kernel"
    check_swap(sw, host, gpu, random_mapping(n, 2 * n, 2 * n, rng), mode="staged")
    assert sw.last_path == "staged"
    out = cs.empty_pinned((2 * n, block), np.uint8)
    check_swap(sw, gpu, out, np.column_stack((gpu_random, np.arange(n))), mode="staged")
    assert sw.last_path == "staged"  # swap-outs to a host run too


@pytest.mark.parametrize("staged", ["in", "out"])
def test_staged_is_ordered_with_the_stream(rng, staged):
    """A swap-out then a swap-in of the same host blocks, queued on one
    stream with no synchronization between them: a staged swap-in's copies
    (on the stager's own stream) must wait for the swap-out, and the work
    after a staged swap-out must wait for its last copy."""
    block, n = 32768, 600
    gpu_a = cp.empty((n, block), dtype=cp.uint8)
    gpu_b = cp.empty((n, block), dtype=cp.uint8)
    host = cs.zeros_pinned((n, block), np.uint8)
    stream = cp.cuda.Stream(non_blocking=True)
    sw = cs.BlockSwapper(max_blocks=n)
    for trial in range(3):
        rand_fill(gpu_a, rng)
        poison(gpu_b)
        cp.cuda.Device().synchronize()
        order = rng.permutation(n)
        modes = ("kernel", "staged") if staged == "in" else ("staged", "kernel")
        sw.swap_out(gpu_a, host, np.column_stack((order, np.arange(n))), stream=stream, mode=modes[0])
        ev = sw.swap_in(host, gpu_b, np.column_stack((np.arange(n), order)), stream=stream, mode=modes[1])
        ev.synchronize()
        assert cp.array_equal(gpu_a, gpu_b), trial


def test_staged_streams_share_the_arenas(rng):
    """Staged swap-ins on two streams and swap-outs (staged and kernel) on a
    third, interleaved, with tiny arenas: every row is refilled many times
    by both swap-in streams.  Checked against a NumPy replay."""
    block = 4096
    sw = cs.BlockSwapper(max_blocks=256, staging_bytes=8 * 64 * 1024, ring_size=8)
    gpu = cp.empty((900, block), dtype=cp.uint8)
    host = cs.empty_pinned((1800, block), np.uint8)
    rand_fill(gpu, rng)
    rand_fill(host, rng)
    ref_gpu, ref_host = cp.asnumpy(gpu), host.copy()
    streams = [cp.cuda.Stream(non_blocking=True) for _ in range(3)]
    # stream 0 / 1: host 1000..1399 / 1400..1799 -> GPU 300..599 / 600..899; stream 2: GPU 0..299 -> host 0..999
    ins = [(host[h0 : h0 + 400], gpu[g0 : g0 + 300], h0, g0) for h0, g0 in ((1000, 300), (1400, 600))]
    out_src, out_dst = gpu[:300], host[:1000]
    for i in range(120):
        k = i % 3
        n = int(rng.integers(1, 257))
        if k < 2:
            h_src, g_dst, h0, g0 = ins[k]
            start = int(rng.integers(0, 400 - n + 1))
            m = np.column_stack((np.arange(start, start + n), rng.choice(300, n, replace=False)))
            sw.swap_in(h_src, g_dst, m, stream=streams[k], mode="staged")
            ref_gpu[g0 + m[:, 1]] = ref_host[h0 + m[:, 0]]
        else:
            m = random_mapping(min(n, 300), 300, 1000, rng)
            sw.swap_out(out_src, out_dst, m, stream=streams[k], mode="staged" if i % 2 else "kernel")
            ref_host[m[:, 1]] = ref_gpu[m[:, 0]]
    for s in streams:
        s.synchronize()
    assert np.array_equal(host, ref_host)
    assert np.array_equal(cp.asnumpy(gpu), ref_gpu)


def test_staged_errors_name_the_reason_before_any_work(rng):
    host = cs.empty_pinned((64, 2, 4096), np.uint8)
    gpu = cp.zeros((64, 4096), dtype=cp.uint8)
    mapping = [(i, i) for i in range(8)]
    sw = cs.BlockSwapper(max_blocks=64)
    with pytest.raises(ValueError, match=r"mode: 'staged' moves between host and GPU memory, got GPU -> GPU"):
        sw.swap(gpu, cp.zeros_like(gpu), mapping, mode="staged")
    with pytest.raises(ValueError, match=r"rows hold bytes of arrays that are not in this swap"):
        sw.swap(host[:, 0], gpu, mapping, mode="staged")
    packed = cs.empty_pinned((64, 4096), np.uint8)
    rand_fill(packed, rng)
    with pytest.raises(ValueError, match=r"staging_bytes=0"):
        cs.BlockSwapper(max_blocks=64, staging_bytes=0).swap(packed, gpu, mapping, mode="staged")
    with pytest.raises(ValueError, match=r"raise staging_bytes"):
        cs.BlockSwapper(max_blocks=64, staging_bytes=8 * 1024).swap(
            host, cp.zeros((64, 2, 4096), cp.uint8), mapping, mode="staged"
        )
    with pytest.raises(ValueError, match=r"staging_bytes: expected an int >= 0, got -1"):
        cs.BlockSwapper(staging_bytes=-1)
    assert int(gpu.sum()) == 0  # nothing was launched
    stream = cp.cuda.Stream(non_blocking=True)
    stream.begin_capture()
    try:
        with pytest.raises(ValueError, match=r"cannot be captured into a CUDA graph"):
            sw.swap_in(packed, gpu, mapping, stream=stream, mode="staged")
        sw.swap_in(packed, gpu, mapping, stream=stream)  # auto: the kernel, capturable
        assert sw.last_path in ("kernel", "dma")
    finally:
        graph = stream.end_capture()
    graph.launch(stream)
    stream.synchronize()
    assert np.array_equal(cp.asnumpy(gpu[:8]), packed[:8])


def test_staged_layouts_alternate_on_one_arena(rng):
    """Two host layouts with different row sizes take turns in one staging
    arena, on two streams: each switch lays the arena out anew, after every
    scatter that read it under the other layout."""
    sw = cs.BlockSwapper(max_blocks=128, staging_bytes=256 * 1024)
    small_h = cs.empty_pinned((400, 1024), np.uint8)
    pool = cs.empty_pinned((400, 2, 3000), np.uint8)
    big_h = [pool[:, 0], pool[:, 1]]
    for a in (small_h, pool):
        rand_fill(a, rng)
    small_g = cp.zeros((300, 1024), cp.uint8)
    big_g = [cp.zeros((300, 3000), cp.uint8), cp.zeros((300, 3000), cp.uint8)]
    ref_small, ref_big = cp.asnumpy(small_g), [cp.asnumpy(g) for g in big_g]
    streams = [cp.cuda.Stream(non_blocking=True) for _ in range(2)]
    for i in range(40):
        n = int(rng.integers(1, 129))
        start = int(rng.integers(0, 400 - n + 1))
        m = np.column_stack((np.arange(start, start + n), rng.choice(300, n, replace=False)))
        if i % 2:
            sw.swap_in(small_h, small_g, m, stream=streams[0], mode="staged")
            ref_small[m[:, 1]] = small_h[m[:, 0]]
        else:
            sw.swap_in(big_h, big_g, m, stream=streams[1], mode="staged")
            for h, r in zip(big_h, ref_big):
                r[m[:, 1]] = h[m[:, 0]]
    for s in streams:
        s.synchronize()
    assert np.array_equal(cp.asnumpy(small_g), ref_small)
    for g, r in zip(big_g, ref_big):
        assert np.array_equal(cp.asnumpy(g), r)


def test_staged_swap_outs_on_several_streams_share_the_ring(rng):
    """Staged swap-outs take turns on two streams while the ring wraps: a
    gather on one stream must not overwrite rows whose copies (queued by a
    swap from the other stream's turn before) have not run yet."""
    block = 4096
    sw = cs.BlockSwapper(max_blocks=256, staging_bytes=96 * block)  # 96 rows: wraps every swap or two
    gpu = cp.empty((512, block), dtype=cp.uint8)
    rand_fill(gpu, rng)
    host = cs.zeros_pinned((2048, block), np.uint8)
    ref = host.copy()
    ref_gpu = cp.asnumpy(gpu)
    streams = [cp.cuda.Stream(non_blocking=True) for _ in range(2)]
    regions = [(host[:1024], 0), (host[1024:], 1024)]
    for i in range(60):
        k = i % 2
        n = int(rng.integers(20, 48))
        h_dst, h0 = regions[k]
        start = int(rng.integers(0, 1024 - n + 1))
        m = np.column_stack((rng.choice(512, n, replace=False), np.arange(start, start + n)))
        sw.swap_out(gpu, h_dst, m, stream=streams[k], mode="staged")
        ref[h0 + m[:, 1]] = ref_gpu[m[:, 0]]
    for s in streams:
        s.synchronize()
    assert np.array_equal(host, ref)


@pytest.mark.parametrize("direction", ["in", "out"])
def test_staged_few_huge_blocks(rng, direction):
    """Three 2 MiB blocks with gaps between them: one chunk, three copies."""
    host = cs.empty_pinned((8, 2 << 20), np.uint8)
    gpu = cp.empty((8, 2 << 20), dtype=cp.uint8)
    src, dst = (host, gpu) if direction == "in" else (gpu, host)
    rand_fill(src, rng)
    poison(dst)
    pairs = [(0, 5), (2, 1), (4, 7)] if direction == "in" else [(5, 0), (1, 2), (7, 4)]
    check_swap(cs.BlockSwapper(max_blocks=8), src, dst, pairs, mode="staged")
