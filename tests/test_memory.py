"""The pinned-memory helpers on the CPU: argument checks that fail before
any CUDA call, and allocation, registration and release over a stand-in
CUDA runtime (the ``fake_cuda`` fixture)."""

import mmap

import numpy as np
import pytest

import cupy_swap as cs
from cupy_swap.cuda import memory, release


def test_shape_checks():
    with pytest.raises(ValueError, match=r"shape: expected non-negative sizes, got \(2, -1\)"):
        cs.empty_pinned((2, -1), np.float16)
    with pytest.raises(TypeError, match="shape: expected an int or a sequence of ints"):
        cs.empty_pinned(None, np.float16)


def test_register_checks():
    with pytest.raises(TypeError, match="array: expected a numpy.ndarray, got list"):
        cs.register_host([1, 2, 3])
    with pytest.raises(ValueError, match="array: expected a contiguous array"):
        cs.register_host(np.zeros((8, 8))[:, ::2])
    with pytest.raises(ValueError, match="array: expected at least one byte"):
        cs.register_host(np.zeros(0))
    with pytest.raises(ValueError, match="array: expected an array passed to cupy_swap.register_host"):
        cs.unregister_host(np.zeros(16))


def test_registry_lookup():
    """The one span set behind both registries (cuda/spans.py): a range
    holding a span, spans that overlap one, removal by start and record."""
    from cupy_swap.cuda.spans import Spans

    reg = Spans()
    reg.add(1000, 2000, memory._Range(1000, 2000, 0, False))
    reg.add(5000, 6000, memory._Range(5000, 6000, 4096, True))
    assert reg.holding(1000, 2000).start == 1000
    assert reg.holding(1999, 2000).start == 1000
    assert reg.holding(1999, 2001) is None
    assert reg.holding(999, 1000) is None
    assert reg.holding(5500, 5510).alias_offset == 4096
    assert reg.overlapping(1999, 5001).start == 5000 and reg.overlapping(0, 1001).start == 1000
    assert reg.overlapping(2000, 5000) is None and len(reg) == 2
    assert reg.remove(5000, object()) is None  # another record at that start: left alone
    assert reg.remove(5000).owned and reg.holding(5500, 5501) is None
    assert reg.remove(5000) is None and len(reg) == 1


def test_disable_uva_env(monkeypatch):
    monkeypatch.setenv("CUPY_SWAP_DISABLE_UVA", "1")
    assert memory.uva_disabled_by_env()
    monkeypatch.setenv("CUPY_SWAP_DISABLE_UVA", "0")
    assert not memory.uva_disabled_by_env()


def test_a_dropped_buffer_is_freed_by_the_releaser_never_under_the_registry_lock(fake_cuda):
    """A pinned buffer is freed through a finalizer, which may run inside a
    garbage collection at any point, also while a thread holds the
    registry's lock (Python 3.12+ collects right after C calls such as
    ``bisect``).  The finalizer only enqueues; the releaser thread then
    unpublishes and frees it, soon after the drop and with no further
    call of the program's (it once waited for the next registry user)."""
    import gc
    import threading

    buf = memory._PinnedBuffer((4096,), np.dtype(np.uint8))
    ptr = buf.__array_interface__["data"][0]
    assert memory._registry.holding(ptr, ptr + 1) is not None
    buf.cycle = buf  # freed by the cyclic collector, as a swapper once was
    del buf
    done = threading.Event()
    with memory._registry._lock:  # a collection landing inside find() or add()

        def collect():
            gc.collect()
            done.set()

        t = threading.Thread(target=collect)  # the same finalizer, run while the lock is held
        t.start()
        t.join(timeout=10)
        assert done.is_set(), "the finalizer blocked on the registry lock"
        assert ptr not in fake_cuda.freed  # the releaser waits for the lock: still pinned, still listed
    assert release.drain(timeout=10)  # waits for the releaser; touches no registry itself
    assert ptr in fake_cuda.freed and memory._registry.holding(ptr, ptr + 1) is None


def test_a_failed_release_is_reported_not_swallowed(fake_cuda):
    def refuse(ptr):
        raise RuntimeError("cudaErrorInvalidValue")

    fake_cuda.freeHost = refuse
    buf = memory._PinnedBuffer((64,), np.dtype(np.uint8))
    ptr = buf.__array_interface__["data"][0]
    before = len(release.failures)
    with pytest.warns(RuntimeWarning, match=f"could not release pinned buffer {ptr:#x}"):
        del buf
        assert release.drain(timeout=10)
    what, error = release.failures[-1]
    assert len(release.failures) == before + 1 and "cudaErrorInvalidValue" in str(error)


def test_unregister_unpublishes_then_unregisters_and_republishes_on_failure(fake_cuda):
    """unregister_host once waited before unpublishing (a cached op could
    enqueue on the range in between) and forgot the range before CUDA
    unregistered it (a failure left it pinned and unknown).  Now the range
    is unpublished first, unpinned by cudaHostUnregister (which waits for
    queued work itself), and published again if CUDA refuses."""
    steps = []
    array = np.zeros(1 << 16, np.uint8)
    ptr = array.ctypes.data

    def register(p, nbytes, flags):
        steps.append("register")

    def unregister(p):
        steps.append(
            ("unregister", "unpublished" if memory._registry.holding(ptr, ptr + 1) is None else "listed")
        )
        if fake_cuda.refuse:
            raise RuntimeError("cudaErrorHostMemoryNotRegistered")

    fake_cuda.hostRegister, fake_cuda.hostUnregister, fake_cuda.refuse = register, unregister, True
    cs.register_host(array)
    generation = memory.generation()
    with pytest.raises(RuntimeError, match="could not unpin the range .* it stays registered"):
        cs.unregister_host(array)
    assert steps == ["register", ("unregister", "unpublished")]
    assert memory._registry.holding(ptr, ptr + 1) is not None  # published again: the call can be retried
    assert memory.generation() > generation  # cached layouts resolve again
    fake_cuda.refuse = False
    cs.unregister_host(array)
    assert memory._registry.holding(ptr, ptr + 1) is None


def test_is_pinned_spans_negative_and_gapped_strides(fake_cuda):
    pool = np.asarray(memory._PinnedBuffer((16, 8), np.dtype(np.float32)))
    assert cs.is_pinned(pool) and cs.is_pinned(pool[::-1]) and cs.is_pinned(pool[::-2, ::3])
    assert memory.byte_span(pool[::-1]) == (pool.ctypes.data, pool.ctypes.data + pool.nbytes)
    outside = np.lib.stride_tricks.as_strided(pool[8:], (9, 8), pool.strides)  # one row past the end
    assert not cs.is_pinned(outside)


def test_two_threads_unregistering_one_range_unpin_it_once(fake_cuda, monkeypatch):
    """Both calls once found the range; the second failed to unpin and
    published again a range that was no longer pinned."""
    unpinned = []
    fake_cuda.hostRegister = lambda p, n, f: None
    fake_cuda.hostUnregister = unpinned.append
    array = np.zeros(1 << 12, np.uint8)
    cs.register_host(array)
    r = memory._registry.holding(array.ctypes.data, array.ctypes.data + 1)
    memory._registry.remove(array.ctypes.data)  # the other thread's unpublish, just done
    monkeypatch.setattr(memory._registry, "holding", lambda lo, hi: r)  # ... after this call's lookup
    with pytest.raises(ValueError, match="another call just unregistered"):
        cs.unregister_host(array)
    monkeypatch.undo()
    assert unpinned == [] and memory._registry.holding(array.ctypes.data, array.ctypes.data + 1) is None


@pytest.fixture
def two_gpus(fake_cuda, monkeypatch):
    """The stand-in runtime with two GPUs in use, GPU 1 current, recording
    in order which GPU is made current and what is freed or (un)registered."""
    steps, current = [], [1]
    monkeypatch.setattr(memory.driver, "devices_in_use", lambda: [0, 1])

    def set_device(d):
        current[0] = d

    fake_cuda.setDevice, fake_cuda.getDevice = set_device, lambda: current[0]
    fake_cuda.hostRegister = lambda p, n, f: steps.append(("register", current[0], n))
    fake_cuda.hostUnregister = lambda p: steps.append(("unregister", current[0], p))
    fake_cuda.freeHost = lambda p: steps.append(("free", current[0], p))
    return steps, current


def test_a_release_waits_for_every_gpu_in_use_before_it_frees(two_gpus):
    """On two H200s cudaFreeHost waited only for the GPU the memory was
    allocated on, cudaHostUnregister only for the current one: a swap queued
    on the other GPU then wrote freed memory.  A release now unregisters a
    private page with each GPU in use current (each waits for its GPU), then
    frees with the allocating GPU current."""
    steps, current = two_gpus
    current[0] = 0
    buf = memory._PinnedBuffer((64,), np.dtype(np.uint8))  # allocated with GPU 0 current
    ptr = buf.__array_interface__["data"][0]
    del buf
    assert release.drain(timeout=10)
    page = [s[2] for s in steps if s[0] == "unregister"]
    assert len(set(page)) == 1 and page[0] != ptr  # one private page, not the buffer
    assert steps == [
        ("register", 0, mmap.PAGESIZE),
        ("unregister", 0, page[0]),
        ("register", 1, mmap.PAGESIZE),
        ("unregister", 1, page[0]),
        ("free", 0, ptr),  # with the allocating GPU current again
    ]


def test_memory_only_one_gpu_uses_is_freed_without_waiting_for_the_others(two_gpus):
    """The library's own descriptor and status words: allocated with their
    GPU current, freed by cudaFreeHost alone (it waits for that GPU), so a
    closed swapper does not hold up the other GPU's swap calls."""
    steps, current = two_gpus
    words = memory.zeros_pinned_for_gpu((4, 8), np.int64, 0)
    assert current[0] == 1 and words.shape == (4, 8) and not words.any()  # the caller's GPU kept
    ptr = words.ctypes.data
    del words
    assert release.drain(timeout=10)
    assert steps == [("free", 0, ptr)]


def test_a_release_whose_wait_fails_keeps_the_memory_and_reports(two_gpus, fake_cuda):
    steps, current = two_gpus

    def refuse(p):
        raise RuntimeError("cudaErrorIllegalAddress")

    fake_cuda.hostUnregister = refuse
    buf = memory._PinnedBuffer((64,), np.dtype(np.uint8))
    ptr = buf.__array_interface__["data"][0]
    before, kept = len(release.failures), len(release._kept)
    with pytest.warns(RuntimeWarning, match=f"could not release pinned buffer {ptr:#x}.*IllegalAddress"):
        del buf
        assert release.drain(timeout=10)
    assert len(release.failures) == before + 1
    assert not any(s[0] == "free" for s in steps)  # never freed under a GPU that may still use it
    assert len(release._kept) == kept + 2  # the page (maybe still registered) and the buffer
    assert memory._wait_page == []  # the next wait starts with a fresh page


def test_unregister_host_waits_for_every_gpu_then_restores_the_callers_gpu(two_gpus):
    steps, current = two_gpus
    array = np.zeros(1 << 12, np.uint8)
    cs.register_host(array)
    steps.clear()
    current[0] = 0  # the caller's GPU; the waits end with GPU 1 current
    cs.unregister_host(array)
    waits = [("register", 0), ("unregister", 0), ("register", 1), ("unregister", 1)]
    assert [s[:2] for s in steps] == waits + [("unregister", 0)]  # then the range, on the caller's GPU
    assert steps[-1][2] == array.ctypes.data and current[0] == 0


def test_unregister_host_whose_wait_fails_publishes_the_range_again(two_gpus, fake_cuda):
    steps, current = two_gpus
    array = np.zeros(1 << 12, np.uint8)
    cs.register_host(array)
    fake_cuda.hostRegister = lambda p, n, f: (_ for _ in ()).throw(RuntimeError("cudaErrorUnknown"))
    current[0] = 0
    with pytest.raises(
        RuntimeError, match="could not unpin the range .*cudaErrorUnknown.* it stays registered"
    ):
        cs.unregister_host(array)
    assert current[0] == 0 and memory._registry.holding(array.ctypes.data, array.ctypes.data + 1) is not None


class _FakeLibcuda:
    """``cuDeviceGetCount``, ``cuDeviceGet`` and ``cuDevicePrimaryCtxGetState``
    over a list of active flags, answering ``status`` where it is not 0."""

    def __init__(self, active, count_status=0, state_status=0):
        self.active, self.count_status, self.state_status = active, count_status, state_status

    def cuDeviceGetCount(self, count):
        count._obj.value = len(self.active)
        return self.count_status

    def cuDeviceGet(self, device, ordinal):
        device._obj.value = ordinal
        return 0

    def cuDevicePrimaryCtxGetState(self, device, flags, active):
        active._obj.value = self.active[device.value]
        return self.state_status


@pytest.mark.parametrize(
    "lib, expected",
    [
        (None, []),  # no driver
        (_FakeLibcuda([1, 0, 1]), [0, 2]),
        (_FakeLibcuda([1], count_status=3), []),  # never initialized: nothing queued
        (_FakeLibcuda([1], count_status=999), RuntimeError),
        (_FakeLibcuda([1, 1], state_status=201), RuntimeError),
    ],
)
def test_devices_in_use_fails_closed(monkeypatch, lib, expected):
    """A release frees after waiting for these GPUs: an error must not read
    as "no GPU in use"."""
    from cupy_swap.cuda import driver

    monkeypatch.setattr(driver, "libcuda", lambda: lib)
    if expected is RuntimeError:
        with pytest.raises(RuntimeError, match="expected the driver to list the GPUs in use, got CUDA error"):
            driver.devices_in_use()
    else:
        assert driver.devices_in_use() == expected
