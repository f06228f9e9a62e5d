"""Argument checks of the pinned-memory helpers that fail before any CUDA call."""

import numpy as np
import pytest

import cupy_swap as cs
from cupy_swap.cuda import memory


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
    reg = memory._Registry()
    reg.add(memory._Range(1000, 2000, 0, False))
    reg.add(memory._Range(5000, 6000, 4096, True))
    assert reg.find(1000, 1000).start == 1000
    assert reg.find(1999, 1).start == 1000
    assert reg.find(1999, 2) is None
    assert reg.find(999, 1) is None
    assert reg.find(5500, 10).alias_offset == 4096
    assert reg.remove(5000).owned and reg.find(5500, 1) is None
    assert reg.remove(5000) is None


def test_disable_uva_env(monkeypatch):
    monkeypatch.setenv("CUPY_SWAP_DISABLE_UVA", "1")
    assert memory.uva_disabled_by_env()
    monkeypatch.setenv("CUPY_SWAP_DISABLE_UVA", "0")
    assert not memory.uva_disabled_by_env()


class _FakeRuntime:
    """Stands in for CUDA: page-aligned fake allocations, aliases = address."""

    def __init__(self):
        self.next, self.freed = 1 << 30, []

    def hostAlloc(self, nbytes, flags):
        self.next += 1 << 16
        return self.next

    def freeHost(self, ptr):
        self.freed.append(ptr)

    def pointerGetAttributes(self, ptr):
        import types

        return types.SimpleNamespace(type=memory._MEMORY_TYPE_HOST, devicePointer=ptr)


def test_freeing_never_takes_the_registry_lock(monkeypatch):
    """A pinned buffer is freed by a finalizer, which may run inside a garbage
    collection at any point, also while this thread holds the registry's
    lock (Python 3.12+ collects right after C calls such as ``bisect``):
    the finalizer only queues the address, and the next registry user frees
    it outside the lock.  Taking the lock there hung the GPU test suite."""
    import gc
    import threading

    fake = _FakeRuntime()
    monkeypatch.setattr(memory, "_runtime", lambda: fake)
    buf = memory._PinnedBuffer((4096,), np.dtype(np.uint8))
    ptr = buf.__array_interface__["data"][0]
    assert memory._registry.find(ptr, 1) is not None
    buf.cycle = buf  # freed by the cyclic collector, as a swapper's ring is
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
    assert ptr not in fake.freed and memory._registry.find(ptr, 1) is not None  # queued, still pinned
    memory.host_alias(123, 1)  # any registry user frees the queue, outside the lock
    assert ptr in fake.freed and memory._registry.find(ptr, 1) is None
