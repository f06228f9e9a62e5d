"""Staged swap-in geometry, checked on the CPU by carrying out the planned
copies and the scatter with real byte moves (``ctypes.memmove``) between
NumPy buffers standing in for host memory, staging and the GPU cache."""

import ctypes
import zlib

import numpy as np
import pytest

from cupy_swap.core.parts import as_parts, copy_groups
from cupy_swap.staged.plan import (
    RowRing,
    chunk_copies,
    chunk_sizes,
    group_regions,
    host_runs,
    kernel_pairs,
    plan_chunks,
    staging_parts,
)

from .fakes import on_gpu


def _parts(arrays, name):
    out = []
    for i, a in enumerate(arrays):
        (p,) = as_parts(a, f"{name}[{i}]")
        out.append(p)
    return out


def test_packed_array_is_one_group():
    a = np.zeros((10, 4, 8), np.float16)
    (g,) = copy_groups(_parts([a], "src"))
    assert g.host_ptr == a.ctypes.data and g.row_bytes == 64 and g.parts == (0,) and g.offsets == (0,)


def test_views_of_block_first_pool_form_one_group_in_any_order():
    pool = np.zeros((10, 3, 16), np.uint8)
    views = [pool[:, 2], pool[:, 0], pool[:, 1]]
    (g,) = copy_groups(_parts(views, "src"))
    assert g.row_bytes == 48 and g.host_ptr == pool.ctypes.data
    assert dict(zip(g.parts, g.offsets)) == {1: 0, 2: 16, 0: 32}


def test_separate_arrays_are_separate_groups():
    arrays = [np.zeros((10, 8), np.uint8), np.zeros((12, 24), np.uint8)]
    groups = copy_groups(_parts(arrays, "src"))
    assert sorted(g.row_bytes for g in groups) == [8, 24]


@pytest.mark.parametrize(
    "views",
    [
        lambda pool: [pool[:, 0]],  # half the row belongs to another array
        lambda pool: [pool[:, 0, :8], pool[:, 1]],  # a gap inside the row
        lambda pool: [pool[::-1, 0], pool[::-1, 1]],  # descending blocks
        lambda pool: [pool[:, 0], pool[:, 0]],  # the same bytes twice
    ],
)
def test_rows_with_foreign_bytes_are_not_grouped(views):
    pool = np.zeros((10, 2, 16), np.uint8)
    assert copy_groups(_parts(views(pool), "src")) is None


def test_host_runs_sorts_only_when_needed():
    order, blocks, starts = host_runs(np.array([4, 5, 6, 9, 10], np.int64))
    assert order is None and blocks.tolist() == [4, 5, 6, 9, 10] and starts.tolist() == [0, 3]
    order, blocks, starts = host_runs(np.array([6, 4, 5], np.int64))
    assert order.tolist() == [1, 2, 0] and blocks.tolist() == [4, 5, 6] and starts.tolist() == [0]


def test_chunk_sizes():
    kib, mib = 1024, 1 << 20
    assert chunk_sizes(1250, 32 * kib, max_rows=2048) == [938, 312]  # 3:1, a short last scatter
    assert chunk_sizes(1250, 32 * kib, max_rows=1024) == [1024, 170, 56]
    assert chunk_sizes(100, 32 * kib, max_rows=2048) == [100]  # 3.2 MB: one chunk
    assert chunk_sizes(10, 32 * kib, max_rows=4) == [4, 4, 2]
    assert sum(chunk_sizes(10000, 4 * kib, max_rows=777)) == 10000
    # Few huge pairs: never an empty chunk.
    assert chunk_sizes(3, 5 * mib, max_rows=100) == [3]
    assert chunk_sizes(8, 5 * mib, max_rows=6) == [6, 2]
    assert chunk_sizes(4, 5 * mib, max_rows=100) == [3, 1]
    with pytest.raises(ValueError, match="positive chunk sizes summing to 3"):
        plan_chunks(np.array([[0, 1], [1, 2], [2, 0]]), [3, 0])


def test_row_ring_places_and_reports_overlaps():
    ring = RowRing(10)
    assert ring.place(4, 0) == (0, [], [])
    assert ring.place(4, 1) == (4, [], [])
    ring.settle(0, "ev0")
    ring.settle(1, "ev1")
    # A new swap: rows 8-9 are free; then 4 rows do not fit, so it wraps and meets chunk 0's rows.
    assert ring.place(2, 0) == (8, [], [])
    assert ring.place(4, 1) == (0, ["ev0"], [])
    # Rows 4-8: the last swap's chunk 1 and row 8 of this swap's chunk 0, whose row 9 stays busy.
    assert ring.place(5, 2) == (4, ["ev1"], [0])
    assert [9, 10, None, 0] in ring.busy
    with pytest.raises(ValueError, match="count: expected 1 to 10 rows, got 11"):
        ring.place(11, 3)
    with pytest.raises(ValueError, match="got 0"):
        ring.place(0, 3)


def test_row_ring_keeps_what_a_chunk_does_not_cover():
    """A partly overwritten region stays busy: the next writer of its other
    rows may be another stream (a swap-out's gather), so it must wait too."""
    ring = RowRing(10)
    ring.place(6, 0)
    ring.settle(0, "a")
    assert ring.place(5, 0) == (0, ["a"], [])  # wraps: rows 0-4 of a's 0-5
    ring.settle(0, "b")
    assert ring.place(3, 0) == (5, ["a"], [])  # row 5 is still a's
    assert ring.holds() == {id("b")}  # a's last row is now covered


def test_row_ring_barriers_guard_every_row():
    ring = RowRing(8, barriers=["old", "old2"])
    assert ring.place(3, 0) == (0, ["old", "old2"], [])
    assert ring.place(5, 1) == (3, ["old", "old2"], [])
    assert ring.events() == []  # every row reused: the barriers are gone


def _kernel_half(pairs, stage, gpu, first_row, size, gather):
    """What the scatter (or gather) kernel does for one chunk: move each
    block between its staging row and its GPU block, every part."""
    for a, b in pairs:
        blk, row = (a, b) if gather else (b, a)
        assert first_row <= row < first_row + size
        for sp, gp in zip(stage, gpu):
            at_stage, at_gpu = sp.ptr + row * sp.block_stride, gp.ptr + blk * gp.block_stride
            ctypes.memmove(*((at_stage, at_gpu) if gather else (at_gpu, at_stage)), sp.block_bytes)


def _simulate(host_arrays, gpu_arrays, mapping, max_rows, ring_rows, direction):
    """Carry out a staged swap on NumPy buffers, chunk by chunk in stream
    order (swap-in: copies into ring rows, then their scatter; swap-out: a
    gather into ring rows, then their copies); returns the copies issued."""
    host = _parts(host_arrays, "host")
    groups = copy_groups(host)
    assert groups is not None
    regions = group_regions(groups, ring_rows)
    bpp = sum(g.row_bytes for g in groups)
    arena = np.full(ring_rows * bpp, 0xEE, np.uint8)
    base = arena.ctypes.data
    gpu = on_gpu(_parts(gpu_arrays, "gpu"))
    m = np.asarray(mapping, np.int64)
    sizes = chunk_sizes(m.shape[0], bpp, max_rows)
    if direction == "out":
        sizes.reverse()
    plan = plan_chunks(m, sizes, host_column=0 if direction == "in" else 1)
    ring = RowRing(ring_rows)
    chunk_rows = [ring.place(size, c)[0] for c, size in enumerate(plan.sizes)]
    pairs = kernel_pairs(plan, chunk_rows, gpu_first=direction == "out")
    stage = staging_parts(host, groups, base, ring_rows, 0)
    copies = 0
    for c, (stage_addrs, host_addrs, nbytes) in enumerate(
        chunk_copies(plan, groups, regions, base, chunk_rows)
    ):
        first_row, size = chunk_rows[c], plan.sizes[c]
        chunk_pairs = pairs[plan.starts[c] : plan.starts[c + 1]].tolist()
        if direction == "out":  # gather first
            _kernel_half(chunk_pairs, stage, gpu, first_row, size, gather=True)
        for d, h, n in zip(stage_addrs, host_addrs, nbytes):
            # Every copy stays inside its chunk's rows, in one group's region.
            inside = [
                base + r + first_row * g.row_bytes <= d
                and d + n <= base + r + (first_row + size) * g.row_bytes
                for g, r in zip(groups, regions)
            ]
            assert any(inside)
            ctypes.memmove(d, h, n) if direction == "in" else ctypes.memmove(h, d, n)
            copies += 1
        if direction == "in":  # then scatter
            _kernel_half(chunk_pairs, stage, gpu, first_row, size, gather=False)
    return copies, plan.num_chunks


def _reference(src_arrays, dst_arrays, mapping):
    expected = [d.copy() for d in dst_arrays]
    for s, d in mapping:
        for a, e in zip(src_arrays, expected):
            e[d] = a[s]
    return expected


@pytest.mark.parametrize("direction", ["in", "out"])
@pytest.mark.parametrize("order", ["ascending", "shuffled", "gaps"])
@pytest.mark.parametrize("layout", ["packed", "block_first", "separate"])
@pytest.mark.parametrize("max_rows,ring_rows", [(7, 14), (5, 11), (64, 128)])
def test_staged_plan_moves_every_byte(direction, order, layout, max_rows, ring_rows):
    # crc32, not hash(): str hashes are salted per process, so a failure could not be replayed.
    rng = np.random.default_rng(zlib.crc32(f"{direction}/{order}/{layout}/{max_rows}".encode()))
    n, host_blocks, gpu_blocks = 37, 90, 60
    if layout == "packed":
        host = [rng.integers(0, 256, (host_blocks, 6, 5), dtype=np.uint8)]
    elif layout == "block_first":
        pool = rng.integers(0, 256, (host_blocks, 3, 10), dtype=np.uint8)
        host = [pool[:, 1], pool[:, 0], pool[:, 2]]
    else:
        host = [rng.integers(0, 256, (host_blocks, k), dtype=np.uint8) for k in (3, 16, 7)]
    gpu = [rng.integers(0, 256, (gpu_blocks, *h.shape[1:]), dtype=np.uint8) for h in host]
    start = int(rng.integers(0, host_blocks - 2 * n))
    if order == "gaps":
        hosts = np.sort(rng.choice(np.arange(start, start + 2 * n), n, replace=False))
    else:
        hosts = np.arange(start, start + n)
        if order == "shuffled":
            rng.shuffle(hosts)
    gpus = rng.choice(gpu_blocks, n, replace=False)
    if direction == "in":
        mapping = np.column_stack((hosts, gpus)).tolist()
        expected, dst = _reference(host, gpu, mapping), gpu
    else:
        mapping = np.column_stack((gpus, hosts)).tolist()
        expected, dst = _reference(gpu, host, mapping), host
    copies, chunks = _simulate(host, gpu, mapping, max_rows, ring_rows, direction)
    for got, want in zip(dst, expected):
        np.testing.assert_array_equal(got, want)  # mapped blocks copied, the rest untouched
    groups = 1 if layout != "separate" else 3
    if order != "gaps":
        assert copies == chunks * groups  # one copy per chunk per group: runs are whole
