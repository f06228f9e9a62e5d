"""Bit-exact swaps on a real GPU: random data, poisoned destinations,
untouched blocks checked, against a NumPy reference ``dst[d] = src[s]``."""

import numpy as np
import pytest

import cupy_swap as cs
from cupy_swap.tools.bench import random_mapping

from .gpu_helpers import DIRECTIONS, POISON, check_swap, make, poison, rand_fill, require_gpu, to_host

pytestmark = pytest.mark.gpu

cp = require_gpu()

DTYPES = {
    "float16": np.float16,
    "bfloat16-as-uint16": np.uint16,
    "float32": np.float32,
    "int8": np.int8,
    "float8-as-uint8": np.uint8,
}


@pytest.mark.parametrize("direction", list(DIRECTIONS))
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("n", [1, 3, 17, 1250])
def test_dtypes_and_counts(swapper, rng, direction, dtype, n):
    skind, dkind = DIRECTIONS[direction]
    dt = DTYPES[dtype]
    shape = (16, 8, 128) if np.dtype(dt).itemsize == 2 else (4096 // np.dtype(dt).itemsize,)
    src = make(skind, (n + 40,) + shape, dt)
    dst = make(dkind, (n + 30,) + shape, dt)
    rand_fill(src, rng)
    poison(dst)
    check_swap(swapper, src, dst, random_mapping(n, n + 40, n + 30, rng))


@pytest.mark.parametrize("direction", list(DIRECTIONS))
@pytest.mark.parametrize("block_bytes", [16, 48, 4096, 32768, 2 << 20])
@pytest.mark.parametrize("n", [1, 3, 17, 1250])
def test_block_sizes(swapper, rng, direction, block_bytes, n):
    if block_bytes == 2 << 20 and n == 1250 and direction != "in":
        pytest.skip("2 MiB x 1250 runs once, for the 'in' direction (5 GB of buffers)")
    skind, dkind = DIRECTIONS[direction]
    src = make(skind, (n + 5, block_bytes), np.uint8)
    dst = make(dkind, (n + 7, block_bytes), np.uint8)
    rand_fill(src, rng)
    poison(dst)
    check_swap(swapper, src, dst, random_mapping(n, n + 5, n + 7, rng))


@pytest.mark.parametrize("direction", list(DIRECTIONS))
@pytest.mark.parametrize(
    "offset, block_bytes", [(0, 2), (0, 1), (0, 6), (2, 32), (1, 33), (4, 4096), (8, 48)]
)
def test_narrow_widths(swapper, rng, direction, offset, block_bytes):
    """Unaligned bases and odd block sizes take the 8/4/2/1-byte paths."""
    skind, dkind = DIRECTIONS[direction]
    n = 37
    raw_s = make(skind, ((n + 3) * block_bytes + 16,), np.uint8)
    raw_d = make(dkind, ((n + 4) * block_bytes + 16,), np.uint8)
    src = raw_s[offset : offset + (n + 3) * block_bytes].reshape(n + 3, block_bytes)
    dst = raw_d[offset : offset + (n + 4) * block_bytes].reshape(n + 4, block_bytes)
    rand_fill(raw_s, rng)
    poison(raw_d)
    mapping = random_mapping(n, n + 3, n + 4, rng)
    plan = swapper.plan(src, dst, mapping)
    assert plan.width == (offset | block_bytes | 16) & -(offset | block_bytes | 16)
    check_swap(swapper, src, dst, mapping)
    # Bytes before and after the views were not touched.
    assert (to_host(raw_d[:offset]) == POISON).all()
    assert (to_host(raw_d[offset + (n + 4) * block_bytes :]) == POISON).all()


@pytest.mark.parametrize("direction", ["in", "out"])
def test_32_layers_kv_in_one_call(swapper, rng, direction):
    layers, n = 32, 1250
    shape = (16, 8, 128)
    gpu = [cp.empty((1500,) + shape, dtype=cp.float16) for _ in range(2 * layers)]
    host = [cs.empty_pinned((1600,) + shape, np.float16) for _ in range(2 * layers)]
    src, dst = (host, gpu) if direction == "in" else (gpu, host)
    for a in src:
        rand_fill(a, rng)
    for a in dst:
        poison(a)
    src_blocks = 1600 if direction == "in" else 1500
    dst_blocks = 1500 if direction == "in" else 1600
    check_swap(swapper, src, dst, random_mapping(n, src_blocks, dst_blocks, rng))


def test_layout_conversion_both_ways(swapper, rng):
    """Per-layer GPU arrays <-> views of one block-first host array."""
    layers, shape = 4, (16, 2, 64)
    host = cs.empty_pinned((300, layers, 2) + shape, np.float16)
    gpu = [cp.empty((200,) + shape, dtype=cp.float16) for _ in range(2 * layers)]
    views = [host[:, layer, kv] for layer in range(layers) for kv in range(2)]
    for g in gpu:
        rand_fill(g, rng)
    poison(host)
    out_map = random_mapping(150, 200, 300, rng)
    check_swap(swapper, gpu, views, out_map)
    for g in gpu:
        poison(g)
    in_map = np.column_stack((out_map[:, 1], rng.permutation(200)[:150]))
    check_swap(swapper, views, gpu, in_map)


def test_registered_pool_and_foreign_pinned(swapper, rng):
    pool = np.empty((64, 4096), dtype=np.uint8)
    cs.register_host(pool)
    try:
        assert cs.is_pinned(pool)
        gpu = cp.empty((64, 4096), dtype=cp.uint8)
        rand_fill(gpu, rng)
        poison(pool)
        check_swap(swapper, gpu, pool, random_mapping(20, 64, 64, rng))
    finally:
        cs.unregister_host(pool)
    assert not cs.is_pinned(pool)
    import cupyx

    foreign = cupyx.empty_pinned((64, 4096), dtype=np.uint8)
    rand_fill(foreign, rng)
    check_swap(swapper, foreign, gpu, random_mapping(20, 64, 64, rng))


def test_pinned_allocation_is_exact():
    a = cs.empty_pinned((3, 5), np.float16)
    assert a.shape == (3, 5) and a.dtype == np.float16 and a.flags.c_contiguous and cs.is_pinned(a)
    z = cs.zeros_pinned(1000003, np.uint8)
    assert z.nbytes == 1000003 and not z.any()
    assert cs.empty_pinned(0, np.uint8).size == 0


def test_ring_wraps_without_corruption(rng):
    """More queued swaps than ring slots, each with its own mapping."""
    sw = cs.BlockSwapper(max_blocks=64, ring_size=2)
    host = cs.empty_pinned((256, 4096), np.uint8)
    rand_fill(host, rng)
    gpus = [cp.empty((64, 4096), dtype=cp.uint8) for _ in range(12)]
    maps = [random_mapping(64, 256, 64, rng) for _ in gpus]
    stream = cp.cuda.Stream(non_blocking=True)
    for g, m in zip(gpus, maps):
        sw.swap(host, g, m, stream=stream)
    stream.synchronize()
    for g, m in zip(gpus, maps):
        ref = np.empty((64, 4096), np.uint8)
        ref[m[:, 1]] = host[m[:, 0]]
        assert np.array_equal(cp.asnumpy(g), ref)


def test_streams_and_events(swapper, rng):
    host = cs.empty_pinned((40, 256), np.uint8)
    gpu = cp.empty((40, 256), dtype=cp.uint8)
    rand_fill(host, rng)
    poison(gpu)
    s = cp.cuda.Stream(non_blocking=True)
    ev = check_swap(swapper, host, gpu, [(1, 2), (3, 4)], stream=s)
    assert isinstance(ev, cp.cuda.Event) and ev.done
    with s:
        check_swap(swapper, host, gpu, [(5, 6)])
    check_swap(swapper, host, gpu, [(7, 8)], stream=s.ptr)


def test_empty_mapping_returns_event(swapper):
    host = cs.empty_pinned((4, 64), np.uint8)
    gpu = cp.empty((4, 64), dtype=cp.uint8)
    poison(gpu)
    ev = swapper.swap_in(host, gpu, [])
    ev.synchronize()
    assert isinstance(ev, cp.cuda.Event)
    assert (cp.asnumpy(gpu) == POISON).all()


# ----------------------------------------------------------- errors (GPU only)
def _untouched(dst_snapshot, dst):
    assert np.array_equal(to_host(dst), dst_snapshot)


def test_pageable_host_rejected_with_fix(swapper):
    gpu = cp.zeros((8, 64), dtype=cp.uint8)
    pageable = np.ones((8, 64), dtype=np.uint8)
    with pytest.raises(
        ValueError, match=r"src: expected page-locked \(pinned\).*empty_pinned.*register_host"
    ):
        swapper.swap_in(pageable, gpu, [(0, 0)])
    with pytest.raises(ValueError, match=r"dst\[1\]: expected page-locked"):
        swapper.swap_out([gpu, gpu], [cs.empty_pinned((8, 64), np.uint8), pageable], [(0, 0)])
    _untouched(np.zeros((8, 64), np.uint8), gpu)


def test_direction_checks(swapper):
    host = cs.empty_pinned((8, 64), np.uint8)
    gpu = cp.zeros((8, 64), dtype=cp.uint8)
    with pytest.raises(ValueError, match=r"swap_in: expected host -> GPU arrays, got GPU -> host"):
        swapper.swap_in(gpu, host, [(0, 0)])
    with pytest.raises(ValueError, match=r"swap_out: expected GPU -> host arrays, got host -> GPU"):
        swapper.swap_out(host, gpu, [(0, 0)])
    with pytest.raises(ValueError, match="got GPU -> GPU"):
        swapper.swap_out(gpu, gpu.copy(), [(0, 0)])
    with pytest.raises(ValueError, match="host memory on both sides"):
        swapper.swap(host, cs.empty_pinned((8, 64), np.uint8), [(0, 0)])


def test_gpu_to_gpu_same_buffer_overlap(swapper, rng):
    buf = cp.empty((16, 128), dtype=cp.uint8)
    rand_fill(buf, rng)
    snap = to_host(buf)
    with pytest.raises(ValueError, match="also read"):
        swapper.swap(buf, buf, [(0, 1), (1, 2)])
    _untouched(snap, buf)
    check_swap(swapper, buf, buf, [(0, 8), (1, 9), (2, 10)])


def test_errors_leave_everything_untouched(swapper, rng):
    host = cs.empty_pinned((8, 64), np.uint8)
    rand_fill(host, rng)
    gpu = cp.zeros((8, 64), dtype=cp.uint8)
    bad = [
        ([(0, 1), (2, 8)], IndexError, "destination block index 8 in row 1"),
        ([(0, 1), (-2, 3)], IndexError, "source block index (must be >= 0, got )?-2 in row 1"),
        ([(0, 1), (2, 1)], ValueError, "distinct destination"),
        ([(0.0, 1.0)], TypeError, "integer"),
        ([[0, 1, 2]], ValueError, r"\(N, 2\)"),
        (np.arange(4), ValueError, r"\(N, 2\)"),
        (cp.asarray([[0.0, 1.0]]), TypeError, "int64 block indices on the GPU"),
    ]
    for mapping, exc, msg in bad:
        for check in ("launch", "host"):  # index errors: from the event, or before the launch
            with pytest.raises(exc, match=msg):
                swapper.swap_in(host, gpu, mapping, check=check).synchronize()
    small = cs.BlockSwapper(max_blocks=2)
    with pytest.raises(ValueError, match="max_blocks=2"):
        small.swap_in(host, gpu, [(0, 0), (1, 1), (2, 2)])
    with pytest.raises(TypeError, match="dtype"):
        swapper.swap_in(host, cp.zeros((8, 32), dtype=cp.uint16), [(0, 0)])
    with pytest.raises(ValueError, match="block shape"):
        swapper.swap_in(host, cp.zeros((8, 32), dtype=cp.uint8), [(0, 0)])
    with pytest.raises(ValueError, match="C-contiguous"):
        swapper.swap_in(host, cp.zeros((8, 64, 2), dtype=cp.uint8)[:, :, 0], [(0, 0)])
    with pytest.raises(ValueError, match="as many parts"):
        swapper.swap_in([host, host], [gpu], [(0, 0)])
    ro = host.view()
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        swapper.swap_out(gpu, ro, [(0, 0)])
    cp.cuda.Device().synchronize()
    _untouched(np.zeros((8, 64), np.uint8), gpu)


def test_constructor_arguments():
    with pytest.raises(ValueError, match="max_blocks: expected a positive int, got 0"):
        cs.BlockSwapper(max_blocks=0)
    with pytest.raises(TypeError, match="max_ctas: expected a positive int, got float"):
        cs.BlockSwapper(max_ctas=1.5)
    with pytest.raises(ValueError, match="max_parts: expected at most 256"):
        cs.BlockSwapper(max_parts=1000)


def test_cli_demo_runs():
    import subprocess
    import sys

    r = subprocess.run(
        [sys.executable, "-m", "cupy_swap", "demo", "--reps", "3"], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    assert "bit-exact: yes" in r.stdout and "GB/s" in r.stdout


@pytest.mark.parametrize("mode", ["kernel", "dma", "auto"])
@pytest.mark.parametrize("direction", list(DIRECTIONS))
@pytest.mark.parametrize("contiguous", [False, True])
@pytest.mark.parametrize("block_bytes, n", [(48, 17), (4096, 1), (32768, 300), (1 << 20, 5)])
def test_modes(swapper, rng, mode, direction, contiguous, block_bytes, n):
    skind, dkind = DIRECTIONS[direction]
    src = make(skind, (n + 9, block_bytes), np.uint8)
    dst = make(dkind, (n + 11, block_bytes), np.uint8)
    rand_fill(src, rng)
    poison(dst)
    mapping = random_mapping(n, n + 9, n + 11, rng, contiguous=contiguous)
    stream = cp.cuda.Stream(non_blocking=True)
    ev = check_swap(swapper, src, dst, mapping, mode=mode, stream=stream)
    if mode == "auto":
        # The copy engines take 2 MiB blocks, a single copy, and host <-> GPU
        # rows that are one run of at least 2 MiB a part (both columns here:
        # dma); everything else is the kernel's.
        one_run = contiguous and direction != "gpu->gpu" and n * block_bytes >= 2 << 20
        expected = "dma" if block_bytes >= 2 << 20 or n == 1 or one_run else "kernel"
    else:
        expected = mode
    assert swapper.last_path == expected and ev.path == expected


@pytest.mark.parametrize("stream_kind", ["legacy", "non_blocking"])
def test_dma_strided_views_and_streams(swapper, rng, stream_kind):
    """Copy-engine path with block-first host views (one copy per block),
    on the legacy stream (per-copy loop) and a created stream (batch call)."""
    host = cs.empty_pinned((50, 3, 2, 512), np.uint16)
    gpu = [cp.empty((40, 512), dtype=cp.uint16) for _ in range(6)]
    rand_fill(host, rng)
    for g in gpu:
        poison(g)
    views = [host[:, layer, kv] for layer in range(3) for kv in range(2)]
    stream = cp.cuda.Stream.null if stream_kind == "legacy" else cp.cuda.Stream(non_blocking=True)
    check_swap(swapper, views, gpu, random_mapping(30, 50, 40, rng), mode="dma", stream=stream)
    assert swapper.last_path == "dma"


def test_mode_argument_checked(swapper):
    with pytest.raises(
        ValueError, match="mode: expected one of 'auto', 'kernel', 'dma', 'staged', got 'fast'"
    ):
        swapper.swap(cs.empty_pinned((2, 16), np.uint8), cp.empty((2, 16), cp.uint8), [(0, 0)], mode="fast")


def test_fallback_without_host_mapping(monkeypatch, rng):
    """CUPY_SWAP_DISABLE_UVA=1: host swaps take the copy engines, warn once,
    and stay bit-exact; GPU->GPU still runs the kernel."""
    import warnings

    from cupy_swap import swapper as swapper_mod

    monkeypatch.setenv("CUPY_SWAP_DISABLE_UVA", "1")
    monkeypatch.setattr(swapper_mod, "_warned", [])
    sw = cs.BlockSwapper(max_blocks=2048)
    for direction in ("in", "out"):
        skind, dkind = DIRECTIONS[direction]
        src = make(skind, (1300, 4096), np.uint8)
        dst = make(dkind, (1300, 4096), np.uint8)
        rand_fill(src, rng)
        poison(dst)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            check_swap(sw, src, dst, random_mapping(1250, 1300, 1300, rng))
            check_swap(sw, src, dst, [(0, 1)])
        assert sw.last_path == "dma"
        assert len([w for w in caught if "cannot be mapped" in str(w.message)]) == (
            1 if direction == "in" else 0
        )
        with pytest.raises(ValueError, match="mode: 'kernel' needs host memory mapped"):
            sw.swap(src, dst, [(0, 1)], mode="kernel")
    g1, g2 = cp.empty((20, 64), cp.uint8), cp.empty((20, 64), cp.uint8)
    rand_fill(g1, rng)
    check_swap(sw, g1, g2, [(1, 2), (3, 4)], mode="kernel")
    assert sw.last_path == "kernel"


def test_partly_registered_range_rejected(swapper):
    big = np.zeros((64, 4096), dtype=np.uint8)
    half = big[:32]
    cs.register_host(half)
    try:
        gpu = cp.zeros((64, 4096), dtype=cp.uint8)
        with pytest.raises(ValueError, match="expected page-locked"):
            swapper.swap_out(gpu, big, [(0, 40)])
        swapper.swap_out(gpu[:32], half, [(0, 1)]).synchronize()
    finally:
        cs.unregister_host(half)
