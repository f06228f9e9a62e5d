"""Edges that once went wrong on a real GPU: lifetimes (cached layouts,
unregistered memory), in-place changes between calls, failures half-way,
empty arrays, short mappings under ``auto``, and messages."""

import gc
import threading
import warnings
import weakref

import numpy as np
import pytest

import cupy_swap as cs
from cupy_swap.cuda import memory
from cupy_swap.tools.bench import random_mapping

from .gpu_helpers import POISON, Gate, check_swap, poison, rand_fill, require_gpu

pytestmark = pytest.mark.gpu

cp = require_gpu()


# ---------------------------------------------------------------- auto routing
@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("block", [1 << 20, 1536 << 10])
@pytest.mark.parametrize("as_type", ["numpy_scalars", "in_place_gpu", "torch_tensor"])
def test_auto_with_two_or_three_pairs(rng, monkeypatch, n, block, as_type):
    """Blocks between 2 MiB / n and 2 MiB (the copy engines' threshold)
    with a mapping that misses the
    short-list fast path (NumPy scalars, vLLM's int64 CPU tensor, an
    in-place GPU -> GPU swap): the run sampling once read past the last row
    (auto no longer samples rows; the swaps must still be exact)."""
    sw = cs.BlockSwapper(max_blocks=16)
    blocks = rng.permutation(8)
    m = np.column_stack((blocks[:n], blocks[n : 2 * n]))  # sources and destinations disjoint
    if as_type == "in_place_gpu":
        src = dst = cp.empty((8, block), cp.uint8)
        rand_fill(src, rng)
        expected = cp.asnumpy(src)
        expected[m[:, 1]] = expected[m[:, 0]]
        sw.swap(src, dst, m).synchronize()
        assert np.array_equal(cp.asnumpy(dst), expected)
    else:
        src = cs.empty_pinned((8, block), np.uint8)
        dst = cp.empty((8, block), cp.uint8)
        rand_fill(src, rng)
        poison(dst)
        if as_type == "torch_tensor":
            torch = pytest.importorskip(
                "torch", reason="needs PyTorch (pip install torch, or the `torch` extra)"
            )
            mapping = torch.from_numpy(m.astype(np.int64))
        else:
            mapping = [(np.int64(s), np.int64(d)) for s, d in m]
        check_swap(sw, src, dst, mapping)


def test_a_slot_whose_launch_failed_is_given_back(rng, monkeypatch):
    """A swap whose kernel launch raised took a slot and launched nothing:
    the slot is free at once (a one-slot ring keeps working)."""
    sw = cs.BlockSwapper(max_blocks=16, ring_size=1)
    host = cs.empty_pinned((4, 64), np.uint8)
    gpu = cp.empty((4, 64), cp.uint8)
    real = sw._launcher._launch

    def broken(*args):
        raise RuntimeError("kernel launch failed")

    sw._launcher._launch = broken
    with pytest.raises(RuntimeError, match="kernel launch failed"):
        sw.swap_in(host, gpu, [(0, 1), (2, 3)], mode="kernel")
    assert sw._launcher.slots.busy() == 0
    sw._launcher._launch = real
    rand_fill(host, rng)
    poison(gpu)
    check_swap(sw, host, gpu, [(0, 1), (2, 3)], mode="kernel")


def test_parts_with_zero_byte_blocks_beside_others(rng):
    sw = cs.BlockSwapper(max_blocks=64)
    empty_host = np.lib.stride_tricks.as_strided(np.zeros(1, np.uint8), (40, 0), (3, 1))  # odd stride
    for mode in ("kernel", "dma", "auto"):
        host = [cs.empty_pinned((40, 4096), np.uint8), empty_host, cs.empty_pinned((40, 48), np.uint8)]
        gpu = [cp.empty((30, 4096), cp.uint8), cp.empty((30, 0), cp.uint8), cp.empty((30, 48), cp.uint8)]
        for a in host:
            rand_fill(a, rng)
        for a in gpu:
            poison(a)
        ev = check_swap(sw, host, gpu, random_mapping(17, 40, 30, rng), mode=mode)
        assert ev.nbytes == 17 * (4096 + 48)


# ----------------------------------------------------------------- empty arrays
def test_empty_parts_and_empty_mappings_move_nothing():
    sw = cs.BlockSwapper(max_blocks=16)
    empty_host = np.lib.stride_tricks.as_strided(
        np.zeros(4, np.uint8), (0, 16), (3, 7)
    )  # pageable, any strides
    ev = sw.swap_in(empty_host, cp.empty((0, 16), cp.uint8), [])
    ev.synchronize()
    assert ev.path == "none" and ev.nbytes == 0
    # Zero-byte blocks: indices are checked, no byte moves.
    ev = sw.swap_out(cp.empty((4, 0), cp.float16), cs.empty_pinned((4, 0), np.float16), [(0, 3), (1, 2)])
    ev.synchronize()
    assert ev.path == "none" and ev.nbytes == 0
    with pytest.raises(IndexError, match="out of range"):
        sw.swap_in(empty_host, cp.empty((0, 16), cp.uint8), [(0, 0)])


# ---------------------------------------------------------- lifetimes, caching
def test_layout_cache_does_not_keep_arrays_alive(rng):
    sw = cs.BlockSwapper(max_blocks=16)
    pool = cs.empty_pinned((64, 4096), np.uint8)
    gpu = cp.empty((32, 4096), cp.uint8)
    rand_fill(gpu, rng)
    sw.swap_out(gpu, pool, [(0, 1), (3, 2)]).synchronize()
    start, buffer, gpu_ref = pool.ctypes.data, weakref.ref(pool.base), weakref.ref(gpu)
    del pool, gpu
    gc.collect()
    assert buffer() is None and gpu_ref() is None  # the swapper's cache let both go
    # The finalizer only queues the release; the releaser thread frees it
    # and forgets the range, with no further call of ours.
    assert memory.release_dropped(timeout=30)
    assert memory._registry.holding(start, start + 1) is None


def test_destination_made_read_only_after_a_swap_is_refused(rng):
    sw = cs.BlockSwapper(max_blocks=16)
    host = cs.empty_pinned((8, 256), np.uint8)
    gpu = cp.empty((8, 256), cp.uint8)
    rand_fill(gpu, rng)
    sw.swap_out(gpu, host, [(0, 0)]).synchronize()
    host.flags.writeable = False
    before = host.copy()
    with pytest.raises(ValueError, match="read-only"):
        sw.swap_out(gpu, host, [(1, 1)])
    assert np.array_equal(host, before)


def test_numpy_array_reshaped_in_place_is_checked_again(rng):
    sw = cs.BlockSwapper(max_blocks=16)
    host = cs.empty_pinned((8, 256), np.uint8)
    rand_fill(host, rng)
    gpu = cp.empty((8, 256), cp.uint8)
    poison(gpu)
    check_swap(sw, host, gpu, [(3, 0)])
    with warnings.catch_warnings():  # NumPy 2.5 deprecates it; older ones allow it silently
        warnings.simplefilter("ignore", DeprecationWarning)
        host.shape = (16, 128)  # same object, new geometry: the cached layout no longer holds
    with pytest.raises(ValueError, match="block shape"):
        sw.swap_in(host, gpu, [(0, 0)])


def test_torch_tensor_restrided_in_place_is_checked_again(rng):
    torch = pytest.importorskip("torch", reason="needs PyTorch (pip install torch, or the `torch` extra)")
    if not torch.cuda.is_available():
        pytest.skip("needs PyTorch built with CUDA")
    sw = cs.BlockSwapper(max_blocks=16)
    host = cs.empty_pinned((8, 64), np.uint8)
    rand_fill(host, rng)
    base = torch.zeros(8 * 128, dtype=torch.uint8, device="cuda")
    t = base.as_strided((8, 64), (128, 1))
    sw.swap_in(host, t, [(0, 0)]).synchronize()
    t.as_strided_((8, 64), (64, 1))  # same object, address and shape; new block stride
    base.fill_(POISON)
    sw.swap_in(host, t, [(2, 5), (7, 1)]).synchronize()
    got = t.cpu().numpy()
    assert np.array_equal(got[5], host[2]) and np.array_equal(got[1], host[7])
    assert (got[[0, 2, 3, 4, 6, 7]] == POISON).all()


def test_unregister_waits_for_queued_swaps(rng):
    sw = cs.BlockSwapper(max_blocks=64)
    pool = np.empty((128, 64 << 10), np.uint8)
    cs.register_host(pool)
    gpu = cp.empty((64, 64 << 10), cp.uint8)
    rand_fill(gpu, rng)
    m = random_mapping(64, 64, 128, rng)
    stream = cp.cuda.Stream(non_blocking=True)
    sw.swap_out(gpu, pool, m, stream=stream).synchronize()  # compiles and loads the kernels first
    gate = Gate(stream)  # the swap-out below is still queued when unregister_host is called
    ev = sw.swap_out(gpu, pool, m, stream=stream)
    assert gate.closed and not ev.done  # still queued behind the gate
    threading.Timer(0.0, gate.open).start()  # opened while unregister_host waits (or before)
    cs.unregister_host(pool)
    assert ev.done  # it waited for the swap before unpinning
    assert np.array_equal(pool[m[:, 1]], cp.asnumpy(gpu)[m[:, 0]])


# ------------------------------------------------------- failure half-way
def test_failed_staged_swap_keeps_its_slot_gated(rng, monkeypatch):
    """A staged swap that fails after launching its first scatter: the
    scatter is still queued, so the next swap must not rewrite the ring
    slot holding its rows (ring of one slot) until it has run."""
    from cupy_swap.staged.stager import Stager

    block, n = 32 << 10, 1200
    sw = cs.BlockSwapper(max_blocks=2048, ring_size=1)
    host = cs.empty_pinned((2 * n, block), np.uint8)
    gpu = cp.empty((2 * n, block), cp.uint8)
    rand_fill(host, rng)
    poison(gpu)
    m = np.column_stack((np.arange(n) + 7, rng.choice(2 * n, n, replace=False)))
    other_src = cs.empty_pinned((300, 4096), np.uint8)
    other_dst = cp.empty((300, 4096), cp.uint8)
    rand_fill(other_src, rng)
    other_mapping = random_mapping(200, 300, 300, rng)
    # Compile and load every kernel first, so the host work below takes
    # microseconds and everything queued behind the spin is still queued.
    check_swap(sw, host, gpu, m, mode="staged")
    check_swap(sw, other_src, other_dst, other_mapping, mode="kernel")
    poison(gpu)
    poison(other_dst)
    cp.cuda.Device().synchronize()
    calls = []
    real = Stager._launch_chunk

    def fails_on_second_chunk(*args):
        calls.append(args)
        if len(calls) == 2:
            raise RuntimeError("injected failure")
        return real(*args)

    monkeypatch.setattr(Stager, "_launch_chunk", staticmethod(fails_on_second_chunk))
    stream = cp.cuda.Stream(non_blocking=True)
    gate = Gate(stream)
    with pytest.raises(RuntimeError, match="injected failure"):
        sw.swap_in(host, gpu, m, stream=stream, mode="staged")
    assert gate.closed and not stream.done  # the first chunk's scatter is still queued behind the gate
    monkeypatch.undo()
    threading.Timer(0.0, gate.open).start()  # the swap below waits for the slot until the scatter ran
    # Another swap on another stream takes the only slot with rows of its own.
    other = cp.cuda.Stream(non_blocking=True)
    check_swap(sw, other_src, other_dst, other_mapping[::-1].copy(), mode="kernel", stream=other)
    stream.synchronize()
    got = cp.asnumpy(gpu)
    landed = np.array([np.array_equal(got[d], host[s]) for s, d in m])
    untouched = np.array([(got[d] == POISON).all() for _, d in m])
    assert landed.any()  # the first chunk's scatter ran ...
    assert (landed | untouched).all()  # ... with its own rows, never another's
    # The staging ring is sound after the failure: a full staged swap lands.
    poison(gpu)
    check_swap(sw, host, gpu, m, mode="staged")


def test_refused_route_enqueues_no_wait_on_a_capturing_stream(rng):
    """``wait_for=`` a capturing stream would pull the swap's stream into the
    capture; a swap refused for capture (staged) must refuse before that, so
    the capture still ends cleanly."""
    sw = cs.BlockSwapper(max_blocks=64)
    host = cs.empty_pinned((64, 4096), np.uint8)
    gpu = cp.empty((64, 4096), cp.uint8)
    capturing = cp.cuda.Stream(non_blocking=True)
    other = cp.cuda.Stream(non_blocking=True)
    capturing.begin_capture()
    try:
        with pytest.raises(ValueError, match="cannot be captured"):
            sw.swap_in(
                host, gpu, [(i, i) for i in range(32)], mode="staged", stream=other, wait_for=capturing
            )
    finally:
        graph = capturing.end_capture()  # fails if `other` joined the capture and never rejoined
    assert graph is not None and not other.is_capturing()


# ------------------------------------------------------------------- messages
def test_staged_on_reversed_host_view_names_the_stride(rng):
    sw = cs.BlockSwapper(max_blocks=64)
    host = cs.empty_pinned((64, 4096), np.uint8)
    gpu = cp.empty((64, 4096), cp.uint8)
    with pytest.raises(ValueError, match="negative block stride"):
        sw.swap_in(host[::-1], gpu, [(0, 0), (1, 1)], mode="staged")
