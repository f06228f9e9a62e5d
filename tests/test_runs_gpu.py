"""Issue 34, item 6: ``auto`` sends a call whose host rows are one long run
to the copy engines (``dma`` when the GPU rows are one run too, else
``staged``), told from the two ends of the rows; every such swap is
bit-exact, also when the ends lie (they span the row count but the rows
are not one run), and a captured one takes the kernel (GPU)."""

import numpy as np
import pytest

import cupy_swap as cs

from .gpu_helpers import poison, rand_fill, require_gpu, to_host

cp = require_gpu()

PARTS, BLOCKS, BLOCK = 3, 160, 32 << 10  # run_rows: 2 MiB / 32 KiB = 64 rows


def _arrays(rng, direction):
    host = [cs.empty_pinned((BLOCKS, BLOCK), np.uint8) for _ in range(PARTS)]
    gpu = [cp.empty((BLOCKS, BLOCK), cp.uint8) for _ in range(PARTS)]
    src, dst = (host, gpu) if direction == "in" else (gpu, host)
    for a in src:
        rand_fill(a, rng)
    for a in dst:
        poison(a)
    return src, dst


def _rows(kind, n, rng):
    run = np.arange(40, 40 + n)
    scattered = rng.permutation(BLOCKS)[:n]
    lying = run.copy()
    lying[1:-1] = rng.permutation(lying[1:-1])  # ends span n blocks, the middle is shuffled
    # (host column, GPU column)
    return {
        "both": (run, run + 7),
        "host": (run, scattered),
        "gpu": (scattered, run),
        "lying": (lying, lying),
    }[kind]


def _expect(src, dst_before, m):
    out = []
    for s, d in zip(src, dst_before):
        ref = d.copy()
        ref[m[:, 1]] = to_host(s)[m[:, 0]]
        out.append(ref)
    return out


@pytest.mark.parametrize("direction", ["in", "out"])
@pytest.mark.parametrize(
    "kind, n, path",
    [
        ("both", 100, "dma"),
        ("host", 100, "staged"),
        ("gpu", 100, "kernel"),
        ("lying", 100, "kernel"),  # issue 38: not one run, so the kernel (no block-by-block copies)
        ("both", 63, "kernel"),
    ],
)
def test_one_run_takes_the_copy_engines_bit_exact(rng, direction, kind, n, path):
    src, dst = _arrays(rng, direction)
    host_col, gpu_col = _rows(kind, n, rng)
    m = np.column_stack((host_col, gpu_col) if direction == "in" else (gpu_col, host_col)).astype(np.int64)
    before = [to_host(d) for d in dst]
    sw = cs.BlockSwapper(max_blocks=BLOCKS)
    ev = sw.swap(src, dst, m)
    ev.synchronize()
    assert ev.path == path
    for got, ref in zip(dst, _expect(src, before, m)):
        assert np.array_equal(to_host(got), ref)


def test_an_explicit_mode_and_bad_rows_of_a_run(rng):
    src, dst = _arrays(rng, "in")
    sw = cs.BlockSwapper(max_blocks=BLOCKS)
    run = np.arange(0, 100)
    m = np.column_stack((run, run)).astype(np.int64)
    assert sw.swap(src, dst, m, mode="kernel").path == "kernel"
    bad = m.copy()
    bad[50, 1] = bad[49, 1]  # the ends still span 100 blocks, but no single run: the kernel checks it
    poison(dst[0])
    ev = sw.swap(src, dst, bad)
    assert ev.path == "kernel"
    with pytest.raises(ValueError, match="distinct destination blocks"):
        ev.synchronize()
    with pytest.raises(ValueError, match="distinct destination blocks"):  # the copy engines' host check
        sw.swap(src, dst, bad, mode="dma")
    assert (to_host(dst[0]) == to_host(dst[0]).flat[0]).all()  # nothing was written


def test_a_captured_run_takes_the_kernel_and_replays(rng):
    src, dst = _arrays(rng, "in")
    sw = cs.BlockSwapper(max_blocks=BLOCKS)
    host_col, gpu_col = _rows("host", 100, rng)
    m = np.column_stack((host_col, gpu_col)).astype(np.int64)
    before = [to_host(d) for d in dst]
    stream = cp.cuda.Stream(non_blocking=True)
    sw.swap(src, dst, m[:2], stream=stream).synchronize()  # first call outside the capture (loads kernels)
    for d, b in zip(dst, before):
        d.set(b)
    stream.begin_capture()
    ev = sw.swap(src, dst, m, stream=stream)
    graph = stream.end_capture()
    assert ev.path == "kernel"  # staging cannot be captured: auto falls back, rows checked on the host
    graph.launch(stream)
    stream.synchronize()
    for got, ref in zip(dst, _expect(src, before, m)):
        assert np.array_equal(to_host(got), ref)
