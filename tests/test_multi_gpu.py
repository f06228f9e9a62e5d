"""A swapper on the second GPU, driven while the first is current: its
arrays, streams and waits are handled on its own device.  Each test
prepares its GPU-1 data on GPU 1 and waits for it there, so no swap races
the preparation."""

import numpy as np
import pytest

import cupy_swap as cs
from cupy_swap.cuda import release
from cupy_swap.tools.bench import random_mapping

from .gpu_helpers import check_swap, poison, rand_fill, require_gpu, spin

pytestmark = [pytest.mark.gpu, pytest.mark.multi_gpu]

cp = require_gpu(2)


def _gpu1_array(shape, rng=None):
    with cp.cuda.Device(1):
        a = cp.empty(shape, cp.uint8)
        rand_fill(a, rng) if rng is not None else poison(a)
        cp.cuda.Device(1).synchronize()
    return a


@pytest.mark.parametrize("mode", ["kernel", "dma", "staged", "auto"])
def test_second_gpu_swapper_while_first_is_current(rng, mode):
    sw1 = cs.BlockSwapper(max_blocks=2048, device=1)
    host = cs.empty_pinned((1500, 4096), np.uint8)
    rand_fill(host, rng)
    gpu1 = _gpu1_array((1200, 4096))
    host_run = np.column_stack((np.arange(1000) + 11, rng.choice(1200, 1000, replace=False)))
    mapping = host_run if mode == "staged" else random_mapping(1000, 1500, 1200, rng)
    with cp.cuda.Device(0):
        ev = check_swap(sw1, host, gpu1, mapping, mode=mode)
        assert cp.cuda.runtime.getDevice() == 0  # the caller's device is restored
    assert ev.path == mode or mode == "auto" and ev.path in ("kernel", "dma", "staged")


def test_second_gpu_torch_tensors_while_first_is_current(rng):
    torch = pytest.importorskip("torch", reason="needs PyTorch (pip install torch, or the `torch` extra)")
    sw1 = cs.BlockSwapper(max_blocks=64, device=1)
    host = torch.empty((64, 1024), dtype=torch.uint8).pin_memory()
    host.copy_(torch.from_numpy(rng.integers(0, 256, (64, 1024), dtype=np.uint8)))
    gpu1 = torch.full((32, 1024), 0xA5, dtype=torch.uint8, device="cuda:1")
    torch.cuda.synchronize(1)
    m = random_mapping(20, 64, 32, rng)
    with cp.cuda.Device(0):
        sw1.swap_in(host, gpu1, m).synchronize()
    got = gpu1.cpu().numpy()
    assert np.array_equal(got[m[:, 1]], host.numpy()[m[:, 0]])


def test_second_gpu_waits_for_a_first_gpu_stream(rng):
    """``wait_for=`` a stream of GPU 0 orders a GPU-1 swap after it (a
    cross-device event wait), and a GPU-0 ``stream=`` is refused clearly."""
    sw1 = cs.BlockSwapper(max_blocks=64, device=1)
    host = cs.zeros_pinned((64, 1 << 16), np.uint8)
    gpu1 = _gpu1_array((64, 1 << 16), rng)
    sw1.swap_out(gpu1, host, [(0, 0), (1, 1)]).synchronize()  # kernels compiled and loaded first
    with cp.cuda.Device(0):
        producer = cp.cuda.Stream(non_blocking=True)
        spin(producer, 1)  # compiled and loaded first
        producer.synchronize()
        spin(producer, 200)
        producer_done = producer.record()
        ev = sw1.swap_out(gpu1, host, [(i, i) for i in range(64)], wait_for=producer)
        ev.synchronize()
        assert producer_done.done  # the swap (microseconds) ran only after the 200 ms producer
        assert np.array_equal(host, cp.asnumpy(gpu1))
        with pytest.raises(ValueError, match="stream: expected a stream of GPU 1"):
            sw1.swap_out(gpu1, host, [(0, 0)], stream=producer)


def test_wait_for_the_callers_default_stream(rng):
    """``wait_for=`` CuPy's null stream (``device_id`` -1, what
    ``get_current_stream()`` gives by default) is the caller's device's."""
    sw1 = cs.BlockSwapper(max_blocks=64, device=1)
    host = cs.zeros_pinned((64, 1 << 16), np.uint8)
    gpu1 = _gpu1_array((64, 1 << 16), rng)
    sw1.swap_out(gpu1, host, [(0, 0)]).synchronize()  # kernels compiled and loaded first
    with cp.cuda.Device(0):
        null = cp.cuda.Stream.null
        spin(null, 1)
        null.synchronize()
        spin(null, 200)  # the caller's work on GPU 0's default stream
        producer_done = null.record()
        ev = sw1.swap_out(gpu1, host, [(i, i) for i in range(64)], wait_for=cp.cuda.get_current_stream())
        ev.synchronize()
        assert producer_done.done
    assert np.array_equal(host, cp.asnumpy(gpu1))


def test_wait_for_a_raw_handle_of_the_swappers_gpu(rng):
    """A raw (int) stream handle in ``wait_for`` is taken as the swapper's
    GPU's, as for ``stream=``, whatever device the caller has current."""
    sw1 = cs.BlockSwapper(max_blocks=8, device=1)
    host = cs.zeros_pinned((8, 4096), np.uint8)
    gpu1 = _gpu1_array((8, 4096), rng)
    with cp.cuda.Device(1):
        producer = cp.cuda.Stream(non_blocking=True)
    with cp.cuda.Device(0):
        sw1.swap_out(gpu1, host, [(i, i) for i in range(8)], wait_for=producer.ptr).synchronize()
    assert np.array_equal(host, cp.asnumpy(gpu1))


def test_swapper_refuses_arrays_of_the_other_gpu(rng):
    sw0 = cs.BlockSwapper(max_blocks=8, device=0)
    host = cs.empty_pinned((8, 64), np.uint8)
    gpu1 = _gpu1_array((8, 64))
    with pytest.raises(ValueError, match=r"dst: expected an array on GPU 0 .*got one on GPU 1"):
        sw0.swap_in(host, gpu1, [(0, 0)])
    assert np.all(cp.asnumpy(gpu1) == 0xA5)


def _pool(kind: str, name: str):
    if kind == "empty_pinned":
        return cs.empty_pinned((128, 4096), np.uint8)
    if kind == "shared_pinned":
        cs.unlink_shared(name, missing_ok=True)
        pool = cs.shared_pinned(name, (128, 4096), np.uint8, create=True)
        cs.unlink_shared(name)
        return pool
    pool = np.zeros((128, 4096), np.uint8)
    cs.register_host(pool)
    return pool


@pytest.mark.parametrize("kind", ["empty_pinned", "shared_pinned", "register_host"])
@pytest.mark.parametrize("allocated_on", [0, 1])
def test_a_pool_released_with_swaps_queued_on_both_gpus_waits_for_both(rng, kind, allocated_on):
    """One pool, a swap-out queued into it on each GPU behind a long spin,
    then the pool is dropped (or ``unregister_host`` is called): the release
    returns only once the swaps of *both* GPUs have run, whichever GPU was
    current when the pool was made.  On two H200s the free once waited for
    one GPU only, and the other GPU's swap wrote freed memory (an illegal
    address)."""
    with cp.cuda.Device(allocated_on):
        pool = _pool(kind, f"multi-gpu-pool-{allocated_on}")
    swaps = []
    for device in (0, 1):  # everything compiled, loaded and allocated before the spins
        sw = cs.BlockSwapper(max_blocks=64, device=device)
        with cp.cuda.Device(device):
            gpu = cp.empty((64, 4096), cp.uint8)
            rand_fill(gpu, rng)
            cp.cuda.Device(device).synchronize()
            s = cp.cuda.Stream(non_blocking=True)
            spin(s, 1)
            sw.swap_out(gpu, pool, [(0, 64 * device)], stream=s).synchronize()
        swaps.append((device, sw, gpu, s, np.column_stack((np.arange(64), 64 * device + np.arange(64)))))
    events = []
    for device, sw, gpu, s, rows in swaps:
        with cp.cuda.Device(device):
            spin(s, 1000)
        events.append(sw.swap_out(gpu, pool, rows, stream=s))
    if kind == "register_host":
        with cp.cuda.Device(allocated_on):
            cs.unregister_host(pool)
            assert cp.cuda.runtime.getDevice() == allocated_on  # the caller's GPU is current again
        assert [ev.done for ev in events] == [True, True]
        return
    del pool  # released on the releaser thread
    assert release.drain(timeout=30)
    assert [ev.done for ev in events] == [True, True]  # the release waited for both
