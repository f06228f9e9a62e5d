"""What the library allocates it owns until the GPU is done with it: each
test queues work behind a spin kernel, so it is certainly still queued when
the host drops, closes, allocates or captures, then checks every byte.

Each one reproduces a defect found on an H200: a graph replay that copied
nothing (its descriptor was zeroed on another stream after the mapping was
staged), ring and staging memory handed back to CuPy's pool under a queued
swap, a dropped pool unpinned inside the next unrelated call, capture slots
that ran out, and ``auto`` sending a mixed layout to the copy engines."""

import gc
import threading
import weakref

import numpy as np
import pytest

import cupy_swap as cs
from cupy_swap.cuda import release
from cupy_swap.tools.bench import random_mapping

from .gpu_helpers import POISON, UNDER_SANITIZER, Gate, poison, rand_fill, require_gpu, spin

pytestmark = pytest.mark.gpu

cp = require_gpu()

SPIN_MS = 300


def _overlaps(a: tuple, b: tuple) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def _allocate_and_scribble(nbytes: int, count: int, stream) -> list:
    """What the next user of the GPU does: allocate, and write garbage."""
    arrays = [cp.empty(nbytes, cp.uint8) for _ in range(count)]
    with stream:
        for a in arrays:
            a.fill(0x5A)
    return arrays


def _expected_in(host, gpu_before, mapping):
    expected = gpu_before.copy()
    expected[mapping[:, 1]] = host[mapping[:, 0]]
    return expected


def _filled(shape, rng):
    """Pinned host and GPU arrays of random bytes, and the GPU one's bytes."""
    host, gpu = cs.empty_pinned(shape, np.uint8), cp.empty(shape, cp.uint8)
    rand_fill(host, rng)
    rand_fill(gpu, rng)
    cp.cuda.Device().synchronize()  # the fills ran on the legacy stream
    return host, gpu, cp.asnumpy(gpu)


def _scribble_then_check(ev, gate, owned: tuple, nbytes: int, count: int, host, gpu, before, mapping):
    """After the owner of device range ``owned`` was dropped with the swap of
    ``ev`` queued behind ``gate``: allocate ``count`` arrays of ``nbytes``
    and scribble on them; none may land on ``owned`` while the swap is
    queued, and the swap's bytes must come out exact."""
    other = cp.cuda.Stream(non_blocking=True)
    junk = _allocate_and_scribble(nbytes, count, other)
    assert gate.closed and not ev.done  # still queued behind the gate
    for a in junk:
        assert not _overlaps(owned, (a.data.ptr, a.data.ptr + a.nbytes))
    gate.open()
    ev.synchronize()
    other.synchronize()
    assert np.array_equal(cp.asnumpy(gpu), _expected_in(host, before, mapping))
    assert release.drain(timeout=30)


# ------------------------------------------------------------- graph replays
@pytest.mark.parametrize("captured", [False, True])
def test_graph_swap_made_behind_a_busy_stream_copies_its_mapping(rng, captured):
    """graph_swap once zeroed its descriptor with cupy.zeros on the current
    stream; set_mapping uploads on a non-blocking stream, so the zeros landed
    after the mapping and the replay copied 0 of 16 blocks, silently."""
    sw = cs.BlockSwapper(max_blocks=64)
    host = cs.empty_pinned((64, 4096), np.uint8)
    gpu = cp.empty((64, 4096), cp.uint8)
    rand_fill(host, rng)
    poison(gpu)
    cp.cuda.Device().synchronize()
    s = cp.cuda.Stream(non_blocking=True)
    spin(cp.cuda.Stream.null, SPIN_MS)  # the creation stream is busy
    gs = sw.graph_swap(host, gpu)
    m = random_mapping(16, 64, 64, rng)
    gs.set_mapping(m, stream=s)
    spin(s, 10)
    if captured:
        s.begin_capture()
        gs.launch(stream=s)
        graph = s.end_capture()
        graph.launch(s)
    else:
        gs.launch(stream=s)
    s.synchronize()
    cp.cuda.Device().synchronize()
    expected = np.full((64, 4096), POISON, np.uint8)
    expected[m[:, 1]] = host[m[:, 0]]
    assert np.array_equal(cp.asnumpy(gpu), expected)


def test_a_swapper_made_behind_a_busy_stream_copies_through_its_ring(rng):
    """The descriptor ring was once zeroed with cupy.zeros on the current
    stream, the pattern that made graph replays copy nothing: a ring swap on
    a non-blocking stream could read a descriptor the late zeros wiped."""
    host = cs.empty_pinned((64, 4096), np.uint8)
    gpu = cp.empty((64, 4096), cp.uint8)
    rand_fill(host, rng)
    poison(gpu)
    # Load the kernels first, with a swapper kept alive: a dropped one is
    # freed by the releaser, whose cudaFree waits for the spin below and
    # meanwhile holds up the event record of the swap under test.
    warm = cs.BlockSwapper(max_blocks=4)
    warm.swap_in(host, gpu, [(0, 0)], mode="kernel")
    gpu.fill(POISON)
    cp.cuda.Device().synchronize()
    s = cp.cuda.Stream(non_blocking=True)
    m = random_mapping(16, 64, 64, rng)
    gate = Gate(cp.cuda.Stream.null)  # the creation stream is busy
    sw = cs.BlockSwapper(max_blocks=64)
    sw.swap_in(host, gpu, m, stream=s).synchronize()
    assert gate.closed  # the swap finished while the creation stream was held
    gate.open()
    del warm
    cp.cuda.Device().synchronize()
    expected = np.full((64, 4096), POISON, np.uint8)
    expected[m[:, 1]] = host[m[:, 0]]
    assert np.array_equal(cp.asnumpy(gpu), expected)


# ------------------------------------------------- dropping with work queued
def _ring_range(sw) -> tuple:
    """Device memory the slot ring's launches touch (their CTA counts)."""
    arrivals = sw._launcher.slots.arrivals
    return arrivals[0], arrivals[-1] + 4


@pytest.mark.parametrize("how", ["del", "close", "with", "op"])
def test_a_dropped_swapper_keeps_its_ring_until_the_swap_ran(rng, how):
    """A swapper once went back to CuPy's pool with a ring swap still queued:
    the next cupy.empty got the ring's address.  It also sat in a reference
    cycle (cache -> op -> swapper), so the garbage collector chose when."""
    host, gpu, before = _filled((4096, 4096), rng)
    m = random_mapping(1000, 4096, 4096, rng)  # uploaded into the ring's device buffer
    s = cp.cuda.Stream(non_blocking=True)
    sw = cs.BlockSwapper(max_blocks=4096)
    ring = _ring_range(sw)
    gate = Gate(s)
    if how == "with":
        with sw:
            ev = sw.swap_in(host, gpu, m, stream=s)
    elif how == "op":
        op = sw.prepare(host, gpu)
        ev = op(m, stream=s)
        del op
    else:
        ev = sw.swap_in(host, gpu, m, stream=s)
        if how == "close":
            sw.close()
            with pytest.raises(RuntimeError, match="closed"):
                sw.swap_in(host, gpu, m, stream=s)
    ref = weakref.ref(sw)
    del sw
    assert UNDER_SANITIZER or ref() is None  # freed by reference counting: no cycle
    gc.collect()
    _scribble_then_check(ev, gate, ring, ring[1] - ring[0], 8, host, gpu, before, m)


def test_a_dropped_staged_swapper_keeps_its_arena_until_the_swap_ran(rng):
    host, gpu, before = _filled((2048, 32768), rng)
    m = np.column_stack((np.arange(1024), rng.permutation(2048)[:1024]))  # long host runs
    s = cp.cuda.Stream(non_blocking=True)
    sw = cs.BlockSwapper(max_blocks=4096, staging_bytes=16 << 20)
    gate = Gate(s)
    ev = sw.swap_in(host, gpu, m, stream=s, mode="staged")
    arena = sw._stagers["in"].base, sw._stagers["in"].base + sw._stagers["in"].staging_bytes
    del sw
    gc.collect()
    _scribble_then_check(ev, gate, arena, 16 << 20, 8, host, gpu, before, m)


def test_a_dropped_graph_swap_keeps_its_rows_until_the_launch_ran(rng):
    sw = cs.BlockSwapper(max_blocks=4096)
    host, gpu, before = _filled((4096, 1024), rng)
    m = random_mapping(2000, 4096, 4096, rng)
    s = cp.cuda.Stream(non_blocking=True)
    gs = sw.graph_swap(host, gpu)
    desc = gs._rows_at, gs._rows_at + 8 * (2 + 2 * 4096)  # count, pad and rows
    gate = Gate(s)
    gs.set_mapping(m, stream=s)
    gs.launch(stream=s)
    ev = s.record()
    del gs
    gc.collect()
    _scribble_then_check(ev, gate, desc, 64 << 10, 16, host, gpu, before, m)


def test_a_closed_graph_swap_refuses_and_a_captured_one_keeps_its_buffer(rng):
    sw = cs.BlockSwapper(max_blocks=64)
    host = cs.empty_pinned((64, 1024), np.uint8)
    gpu = cp.empty((64, 1024), cp.uint8)
    rand_fill(host, rng)
    s = cp.cuda.Stream(non_blocking=True)
    with sw.graph_swap(host, gpu) as gs:
        gs.set_mapping([(1, 2)], stream=s)
        s.begin_capture()
        gs.launch(stream=s)
        graph = s.end_capture()
    with pytest.raises(RuntimeError, match="set_mapping: this GraphSwap is closed"):
        gs.set_mapping([(1, 2)], stream=s)
    del gs
    gc.collect()
    assert release.drain(timeout=30)
    poison(gpu)
    cp.cuda.Device().synchronize()
    graph.launch(s)  # the graph still reads live rows: pairs (1, 2)
    s.synchronize()
    assert np.array_equal(cp.asnumpy(gpu[2]), host[1])


# ------------------------------------------------------------ pinned memory
@pytest.mark.parametrize("kind", ["empty_pinned", "shared_pinned", "register_host"])
def test_a_released_pool_waits_for_its_queued_swap_off_the_hot_path(rng, kind):
    """Dropping a pool with a swap queued once made the next empty_pinned(1)
    block for the whole queue (0.50 s): the free ran inside that call.  Now
    the drop only hands the pool to the releaser thread, which frees it
    (cudaFreeHost, cudaHostUnregister) once the queued swap has completed:
    the library leans on that wait instead of a device synchronize, which
    would invalidate captures on other threads.  The swap stays queued
    behind a gate until the test opens it (issue 32, finding 11: the test
    once depended on a 1 s window, and on whether another thread's pinned
    allocation waited with the releaser, which the driver may do; the
    README says so)."""
    sw = cs.BlockSwapper(max_blocks=64)
    gpu = cp.empty((64, 4096), cp.uint8)
    rand_fill(gpu, rng)
    if kind == "empty_pinned":
        pool = cs.empty_pinned((64, 4096), np.uint8)
    elif kind == "shared_pinned":
        name = f"lifetimes-pool-{threading.get_ident()}"
        cs.unlink_shared(name, missing_ok=True)
        pool = cs.shared_pinned(name, (64, 4096), np.uint8, create=True)
        cs.unlink_shared(name)
    else:
        backing = np.zeros((64, 4096), np.uint8)
        cs.register_host(backing)
        pool = backing
    cp.cuda.Device().synchronize()
    s = cp.cuda.Stream(non_blocking=True)
    gate = Gate(s)
    ev = sw.swap_out(gpu, pool, random_mapping(16, 64, 64, rng), stream=s)
    if kind == "register_host":
        threading.Timer(0.0, gate.open).start()  # unregister_host waits for the queued swap
        cs.unregister_host(pool)  # the user's call: returns once the queued swap is done
        assert ev.done
        return
    drop = pool.base._finalizer  # what the drop runs: it only enqueues the release
    del pool
    if UNDER_SANITIZER:
        # There a finished call's frames still hold the pool (NOTES 75), so the drop queued
        # nothing and the drain below returned at once (the memcheck failure of NOTES 83 and
        # 85): queue the release as the drop does.  So under the sanitizer this checks the
        # release's wait, not that the drop queues it; nothing reads the pool after.
        drop()
    assert not drop.alive and gate.closed and not ev.done  # queued; the drop did not wait for the swap
    gate.open()
    assert release.drain(timeout=30)
    assert ev.done  # the release waited for the swap that wrote the pool
    assert cs.empty_pinned(1, np.uint8).size == 1


def test_releasing_a_pool_does_not_break_a_capture_on_this_thread(rng):
    """A shared pool's release once ran cudaDeviceSynchronize in whichever
    call came next, which invalidates a graph being captured.  The releaser
    thread runs it in relaxed capture mode."""
    name = f"lifetimes-{threading.get_ident()}"
    cs.unlink_shared(name, missing_ok=True)
    pool = cs.shared_pinned(name, (64, 1024), np.uint8, create=True)
    cs.unlink_shared(name)
    sw = cs.BlockSwapper(max_blocks=64)
    host = cs.empty_pinned((64, 1024), np.uint8)
    gpu = cp.empty((64, 1024), cp.uint8)
    rand_fill(host, rng)
    cp.cuda.Device().synchronize()
    s = cp.cuda.Stream(non_blocking=True)
    m = random_mapping(8, 64, 64, rng)
    sw.swap_in(host, gpu, m, stream=s).synchronize()  # compiled and cached before the capture
    failures = len(release.failures)
    s.begin_capture()
    try:
        sw.swap_in(host, gpu, m, stream=s)
        del pool
        gc.collect()
        assert release.drain(timeout=30)  # released while this thread captures
    finally:
        graph = s.end_capture()
    assert len(release.failures) == failures, list(release.failures)[-1:]
    poison(gpu)
    cp.cuda.Device().synchronize()
    graph.launch(s)
    s.synchronize()
    expected = np.full((64, 1024), POISON, np.uint8)
    expected[m[:, 1]] = host[m[:, 0]]
    assert np.array_equal(cp.asnumpy(gpu), expected)


# ------------------------------------------------------- captured swaps
def test_captured_swaps_never_run_out(rng):
    """Captured swaps once took descriptor slots from a reserve of four and
    never gave them back: the fifth capture raised."""
    sw = cs.BlockSwapper(max_blocks=256)
    host = cs.empty_pinned((256, 512), np.uint8)
    gpu = cp.empty((256, 512), cp.uint8)
    rand_fill(host, rng)
    s = cp.cuda.Stream(non_blocking=True)
    sw.swap_in(host, gpu, [(0, 0)], stream=s, mode="kernel").synchronize()
    graphs = []
    for n in (3, 70, 200, 5, 128, 9):  # read from pinned memory and uploaded forms
        m = random_mapping(n, 256, 256, rng)
        s.begin_capture()
        try:
            sw.swap_in(host, gpu, m, stream=s, mode="kernel")
        finally:
            graphs.append((s.end_capture(), m))
    for graph, m in graphs[::-1]:
        poison(gpu)
        cp.cuda.Device().synchronize()
        graph.launch(s)
        s.synchronize()
        expected = np.full((256, 512), POISON, np.uint8)
        expected[m[:, 1]] = host[m[:, 0]]
        assert np.array_equal(cp.asnumpy(gpu), expected)


# ------------------------------------------------------------ mixed layouts
def test_auto_sends_a_mixed_layout_to_the_kernel(rng):
    """One part of 2 MiB blocks beside 63 of 4 KiB once went to the copy
    engines one block at a time (267.6 ms against 57.6 ms)."""
    sw = cs.BlockSwapper(max_blocks=256)
    host = [cs.empty_pinned((64, 2 << 20), np.uint8)] + [
        cs.empty_pinned((64, 4096), np.uint8) for _ in range(63)
    ]
    gpu = [cp.empty((64, 2 << 20), cp.uint8)] + [cp.empty((64, 4096), cp.uint8) for _ in range(63)]
    for h in host:
        rand_fill(h, rng)
    for g in gpu:
        poison(g)
    m = random_mapping(40, 64, 64, rng)
    ev = sw.swap_in(host, gpu, m)
    ev.synchronize()
    assert ev.path == "kernel"
    for h, g in zip(host, gpu):
        expected = np.full(h.shape, POISON, np.uint8)
        expected[m[:, 1]] = h[m[:, 0]]
        assert np.array_equal(cp.asnumpy(g), expected)


# ------------------------------------------------------------ out of memory
def test_a_staging_arena_that_does_not_fit_falls_back_or_is_refused(rng):
    """The arena once came from cudaMalloc with no translation: auto raised
    cudaErrorMemoryAllocation instead of falling back to the kernel, and
    mode='staged' raised it instead of its ValueError."""
    free, _ = cp.cuda.runtime.memGetInfo()
    host = cs.empty_pinned((256, 32768), np.uint8)
    gpu = cp.empty((256, 32768), cp.uint8)
    rand_fill(host, rng)
    m = np.column_stack((np.arange(200), rng.permutation(256)[:200]))  # host runs
    sw = cs.BlockSwapper(max_blocks=256, staging_bytes=4 * free)
    with pytest.raises(ValueError, match="'staged' could not allocate its staging arena"):
        sw.swap_in(host, gpu, m, mode="staged")
    poison(gpu)
    ev = sw.swap_in(host, gpu, m)
    ev.synchronize()
    assert ev.path == "kernel"
    assert np.array_equal(cp.asnumpy(gpu)[m[:, 1]], host[m[:, 0]])
