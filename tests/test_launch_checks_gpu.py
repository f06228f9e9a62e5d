"""Checks inside the copy launch and the seams of issue 25 (GPU): a bad
mapping writes nothing in every launch form, its first bad row is
reported; captures joined through ``wait_for``; a first GPU mapping while
another thread captures; a first torch swap inside ``torch.cuda.graph``;
torch callers on torch's current stream; a dropped GraphSwap replayed."""

import gc
import weakref

import numpy as np
import pytest

import cupy_swap as cs
from cupy_swap.tools.bench import random_mapping

from .gpu_helpers import (
    CallTimes,
    Gate,
    another_thread_capturing,
    capture_graph_swap,
    poison,
    rand_fill,
    require_gpu,
    require_torch_cuda,
)

pytestmark = pytest.mark.gpu

cp = require_gpu()


def _pools(rng, blocks=4200, block=64, parts=1):
    host = [cs.empty_pinned((blocks, block), np.uint8) for _ in range(parts)]
    gpu = [cp.empty((blocks, block), cp.uint8) for _ in range(parts)]
    for h, g in zip(host, gpu):
        rand_fill(h, rng)
        poison(g)
    return (host[0], gpu[0]) if parts == 1 else (host, gpu)


@pytest.mark.parametrize("n", [2, 16, 17, 1250, 1792, 1793, 4096])
@pytest.mark.parametrize("fault", ["source", "destination", "duplicate"])
def test_a_bad_row_anywhere_writes_nothing(rng, n, fault):
    """Inline tiers (up to 1792 pairs) and the descriptor ring (more): every
    CTA checks every row first, so a fault in the last row stops them all."""
    sw = cs.BlockSwapper(max_blocks=4096)
    host, gpu = _pools(rng)
    m = random_mapping(n, 4200, 4200, rng)
    if fault == "source":
        m[-1, 0], message = 4200, rf"source block index 4200 in row {n - 1}"
    elif fault == "destination":
        m[-1, 1], message = -3, rf"destination block index -3 in row {n - 1}"
    else:
        m[-1, 1], message = m[0, 1], rf"block {m[0, 1]} again in row {n - 1}"
    ev = sw.swap_in(host, gpu, m, check="launch")
    with pytest.raises((IndexError, ValueError), match=message):
        ev.synchronize()
    assert ev.path == "kernel" and (cp.asnumpy(gpu) == 0xA5).all()
    good = m[:-1]
    sw.swap_in(host, gpu, good).synchronize()
    assert np.array_equal(cp.asnumpy(gpu)[good[:, 1]], host[good[:, 0]])


@pytest.mark.parametrize("parts", [17, 64, 65])
def test_many_parts_are_checked_in_the_launch(rng, parts):
    sw = cs.BlockSwapper(max_blocks=512)
    host, gpu = _pools(rng, blocks=300, block=32, parts=parts)
    m = random_mapping(200, 300, 300, rng)
    sw.swap_out(gpu, host, m).synchronize()
    m[7, 1] = m[150, 1]
    before = [h.copy() for h in host]
    with pytest.raises(ValueError, match="again in row 150"):
        sw.swap_in(host, gpu, m, check="launch").synchronize()
    with pytest.raises(ValueError, match="again in row 150"):
        sw.swap_out(gpu, host, m, check="launch").synchronize()
    with pytest.raises(ValueError, match="again in row 150"):
        sw.swap_out(gpu, host, m).synchronize()  # the default for many host rows: through a slot
    with pytest.raises(ValueError, match=r"got block \d+ twice \(rows 7 and 150\)"):
        sw.swap_out(gpu, host, m, check="host")  # checked before the launch
    assert all(np.array_equal(h, b) for h, b in zip(host, before))


@pytest.mark.parametrize("pairs", [40, 2000])
def test_a_capture_joined_through_wait_for(rng, pairs):
    """Defect 1: a swap whose stream joins a capture through wait_for was
    launched as an eager one: the inline form failed the capture, the
    descriptor form gated a ring slot by a captured event, and every second
    eager swap after it failed.  Now the capture query comes after the waits."""
    sw = cs.BlockSwapper(max_blocks=2048, ring_size=2)
    host, gpu = _pools(rng, blocks=4200, block=64)
    capture, side = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    m = random_mapping(pairs, 4200, 4200, rng)
    capture.begin_capture()
    joined = cp.cuda.Event(disable_timing=True)
    joined.record(capture)
    sw.swap_in(host, gpu, m, stream=side, wait_for=joined, check="launch")  # side joins the capture
    done = cp.cuda.Event(disable_timing=True)
    done.record(side)
    capture.wait_event(done)
    graph = capture.end_capture()
    graph.launch(capture)
    capture.synchronize()
    assert np.array_equal(cp.asnumpy(gpu)[m[:, 1]], host[m[:, 0]])
    for _ in range(6):  # eager swaps after it, through the ring as well
        poison(gpu)
        k = random_mapping(pairs, 4200, 4200, rng)
        sw.swap_in(host, gpu, k).synchronize()
        assert np.array_equal(cp.asnumpy(gpu)[k[:, 1]], host[k[:, 0]])


def test_a_first_gpu_mapping_while_another_thread_captures(rng):
    """Defect 2: an op's first mapping on the GPU allocated pinned status
    words outside relaxed mode, which failed the swap and invalidated a
    global-mode capture on another thread.  The status records now come
    with the swapper."""
    sw = cs.BlockSwapper(max_blocks=64)
    host, gpu = _pools(rng, blocks=128, block=256)
    m = cp.asarray(random_mapping(32, 128, 128, rng))  # written on the current stream
    made = cp.cuda.get_current_stream().record()  # recorded before the capture starts
    with another_thread_capturing(sw.device):
        # The swap's stream waits for the rows (the test once raced them: issue 38).
        ev = sw.swap_in(host, gpu, m, stream=cp.cuda.Stream(non_blocking=True), wait_for=made)
    ev.synchronize()
    mm = cp.asnumpy(m)
    assert np.array_equal(cp.asnumpy(gpu)[mm[:, 1]], host[mm[:, 0]])


def test_a_first_torch_swap_inside_torch_cuda_graph(rng):
    """Defect 3: the first swap() of torch tensors not seen before converted
    them through DLPack, which records on the capturing stream and broke
    torch.cuda.graph.  Tensors are now read by data_ptr(), stride(), shape."""
    torch = require_torch_cuda()
    sw = cs.BlockSwapper(max_blocks=64)
    host = torch.randint(0, 255, (64, 1024), dtype=torch.uint8).pin_memory()
    gpu = torch.zeros((64, 1024), dtype=torch.uint8, device="cuda")
    m = random_mapping(20, 64, 64, rng)
    rows = [tuple(map(int, r)) for r in m]
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        sw.swap_in(host, gpu, rows)  # first sight of these tensors, inside the capture
    gpu.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(gpu[m[:, 1]].cpu(), host[m[:, 0]])


def test_torch_callers_run_on_torch_current_stream(rng):
    """Torch tensors with no stream= are ordered on torch's current stream:
    a swap-out right after a torch write on a side stream sees the write."""
    torch = require_torch_cuda()
    sw = cs.BlockSwapper(max_blocks=64)
    gpu = torch.zeros((64, 1 << 16), dtype=torch.uint8, device="cuda")
    host = torch.zeros((64, 1 << 16), dtype=torch.uint8).pin_memory()
    m = random_mapping(32, 64, 64, rng)
    s = torch.cuda.Stream()
    sw.swap_out(gpu, host, m).synchronize()  # the op exists and its kernels are loaded
    with torch.cuda.stream(s):
        torch.cuda._sleep(50_000_000)  # keep s busy, so a swap on another stream would run first
        gpu.fill_(7)
        ev = sw.swap_out(gpu, host, m)
    ev.synchronize()
    assert bool((host[m[:, 1]] == 7).all())


def test_a_dropped_graph_swap_keeps_the_arrays_its_graph_writes(rng):
    """Defect 4: a captured GraphSwap kept its descriptor but let go of the
    caller's arrays; after a drop, a replay wrote into reused memory."""
    sw = cs.BlockSwapper(max_blocks=64)
    host = cs.empty_pinned((64, 4096), np.uint8)
    rand_fill(host, rng)
    gpu = cp.zeros((64, 4096), cp.uint8)
    gs = sw.graph_swap(host, gpu)
    stream = cp.cuda.Stream(non_blocking=True)
    graph = capture_graph_swap(gs, stream)
    m = random_mapping(16, 64, 64, rng)
    gs.set_mapping(m, stream=stream)
    dst = weakref.ref(gpu)
    gs.close()
    del gs, gpu
    gc.collect()
    assert dst() is not None  # kept for the graph
    victim = cp.full((64, 4096), 3, cp.uint8)
    graph.launch(stream)
    stream.synchronize()
    assert (cp.asnumpy(victim) == 3).all()
    assert np.array_equal(cp.asnumpy(dst())[m[:, 1]], host[m[:, 0]])


def test_host_rows_are_checked_by_the_launch_by_default(rng):
    """Issue 38: every kernel swap's rows are checked on the GPU at every
    row count; check="host" (debugging) raises before any launch."""
    sw = cs.BlockSwapper(max_blocks=64)
    host, gpu = _pools(rng, blocks=64, block=256)
    bad = [(0, 1), (2, 1)]
    ev = sw.swap_in(host, gpu, bad, mode="kernel")
    with pytest.raises(ValueError, match="got block 1 again in row 1"):
        ev.synchronize()
    with pytest.raises(ValueError, match=r"got block 1 twice \(rows 0 and 1\)"):
        sw.swap_in(host, gpu, bad, check="host")
    with pytest.raises(ValueError, match="twice"):
        sw.plan(host, gpu, bad)
    cp.cuda.Device().synchronize()
    assert (cp.asnumpy(gpu) == 0xA5).all()


def test_a_busy_stream_and_many_queued_checked_swaps(rng):
    """Checked swaps queued behind a gate on one stream: each reports its own
    verdict once it ran, the good ones land.  (A ring larger than the queue:
    a call that waited for a slot would meet an earlier failure, which the
    next call raises by contract.  A gate the test opens, not a spin: a
    spin that ended before the last call would let an earlier failure reach
    a later call, as it did under load in soak s45-4.)"""
    sw = cs.BlockSwapper(max_blocks=64, ring_size=64)
    host, gpu = _pools(rng, blocks=256, block=128)
    stream = cp.cuda.Stream(non_blocking=True)
    op = sw.prepare(host, gpu)
    op([(0, 0), (1, 1)], stream=stream).synchronize()
    gate = Gate(stream)
    events, calls = [], CallTimes()
    for i in range(40):
        m = random_mapping(8, 256, 256, rng)
        if i % 7 == 3:
            m[5, 1] = m[2, 1]
        events.append(calls(op, m, stream=stream, check="launch"))
    assert gate.closed, f"the gate opened at its limit: a call waited for it ({calls})"  # made before any ran
    gate.open()
    for i, ev in enumerate(events):
        if i % 7 == 3:
            with pytest.raises(ValueError, match="again in row 5"):
                ev.synchronize()
        else:
            ev.synchronize()
