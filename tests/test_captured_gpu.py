"""A swap captured into the caller's own CUDA graph (issue 40), on the GPU:
each replay copies the rows written in that replay, bit for bit; a bad
replay writes nothing and is reported once; padding rows are skipped; the
completion word counts the finished replays.  (Written before any GPU run:
branch inside-graph.)"""

import numpy as np
import pytest

import cupy_swap as cs

from .gpu_helpers import poison, rand_fill, require_gpu, to_host

pytestmark = pytest.mark.gpu

cp = require_gpu()

BLOCKS, BLOCK, MAX_ROWS = 256, 512, 64


def _graph(cap, stream, staged_rows, staged_count):
    """Capture: the 'picker' copies this replay's rows and count into the
    swap's buffers (as an engine's kernel would write them), then the swap."""
    stream.begin_capture()
    with stream:
        cap.rows[...] = staged_rows
        cap.count[...] = staged_count
    cap.launch(stream=stream)
    return stream.end_capture()


@pytest.mark.parametrize("direction", ["in", "out"])
def test_every_replay_copies_the_rows_written_in_it(rng, direction):
    host = cs.empty_pinned((BLOCKS, BLOCK), np.uint8)
    gpu = cp.empty((BLOCKS, BLOCK), cp.uint8)
    src, dst = (host, gpu) if direction == "in" else (gpu, host)
    rand_fill(src, rng)
    sw = cs.BlockSwapper(max_blocks=MAX_ROWS)
    cap = sw.prepare(src, dst).captured(MAX_ROWS, ring=8)
    stream = cp.cuda.Stream(non_blocking=True)
    staged_rows = cp.zeros((MAX_ROWS, 2), cp.int64)
    staged_count = cp.zeros((), cp.int64)
    graph = _graph(cap, stream, staged_rows, staged_count)
    cp.cuda.Device().synchronize()  # the fills above, on the legacy stream, done before `stream` reads
    for replay in range(1, 201):
        n = int(rng.integers(0, MAX_ROWS + 1))
        m = np.full((MAX_ROWS, 2), -1, np.int64)
        m[:n, 0] = rng.choice(BLOCKS, n, replace=False)
        m[:n, 1] = rng.choice(BLOCKS, n, replace=False)
        if replay % 5 == 0 and n:
            m[n // 2] = -1  # padding inside the rows: skipped
        poison(dst)
        before = to_host(dst).copy()
        with stream:
            staged_rows.set(m)
            staged_count.fill(n)
        graph.launch(stream)
        stream.synchronize()
        want = before.copy()
        rows = m[:n][(m[:n] >= 0).all(axis=1)]
        want[rows[:, 1]] = to_host(src)[rows[:, 0]]
        assert np.array_equal(to_host(dst), want), replay
    assert cap.failures() == []
    assert (
        int(
            cp.asnumpy(
                cp.ndarray(
                    (), cp.int64, cp.cuda.MemoryPointer(cp.cuda.UnownedMemory(cap.done_ptr, 8, cap), 0)
                )
            )
        )
        == 200
    )


def test_a_bad_replay_writes_nothing_and_is_reported_once(rng):
    host = cs.empty_pinned((BLOCKS, BLOCK), np.uint8)
    gpu = cp.empty((BLOCKS, BLOCK), cp.uint8)
    rand_fill(host, rng)
    sw = cs.BlockSwapper(max_blocks=MAX_ROWS)
    cap = sw.prepare(host, gpu).captured(MAX_ROWS, ring=4)
    stream = cp.cuda.Stream(non_blocking=True)
    staged_rows = cp.zeros((MAX_ROWS, 2), cp.int64)
    staged_count = cp.zeros((), cp.int64)
    graph = _graph(cap, stream, staged_rows, staged_count)
    cp.cuda.Device().synchronize()  # the fills above, on the legacy stream, done before `stream` reads
    good = np.stack([np.arange(8), np.arange(8) + 100], 1)
    bad = good.copy()
    bad[5, 1] = bad[2, 1]
    for replay, m in enumerate((good, bad, good), start=1):
        poison(gpu)
        with stream:
            staged_rows[:8].set(m)
            staged_count.fill(8)
        graph.launch(stream)
        stream.synchronize()
        if replay == 2:
            assert (to_host(gpu) == to_host(gpu).flat[0]).all()  # nothing written
    (err,) = cap.failures()
    assert isinstance(err, ValueError) and err.replay == 2 and "again in row 5" in str(err)
    assert cap.failures() == []
