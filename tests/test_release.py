"""The releaser thread (cupy_swap/cuda/release.py) and device allocation,
on the CPU with stand-ins for CUDA."""

import contextlib
import threading

import pytest

from cupy_swap.cuda import release, streams

cupy = pytest.importorskip("cupy")


class _NoMemory(cupy.cuda.runtime.CUDARuntimeError):
    def __init__(self):
        super().__init__(2)  # cudaErrorMemoryAllocation


@pytest.fixture
def fake_malloc(monkeypatch):
    """runtime.malloc failing ``fake.fails`` times with out-of-memory; the
    pool's free_all_blocks counted."""
    runtime = cupy.cuda.runtime
    state = {"fails": 0, "calls": 0, "freed_pool": 0}

    def malloc(size):
        state["calls"] += 1
        if state["calls"] <= state["fails"]:
            raise _NoMemory()
        return 0x1000

    class Pool:
        def free_all_blocks(self):
            state["freed_pool"] += 1

    monkeypatch.setattr(runtime, "malloc", malloc)
    monkeypatch.setattr(runtime, "memGetInfo", lambda: (0, 1 << 30))
    monkeypatch.setattr(cupy, "get_default_memory_pool", lambda: Pool())
    monkeypatch.setattr(streams, "on_device", lambda device: contextlib.nullcontext())
    return state


def test_device_malloc_frees_cupys_cached_blocks_once_then_says_out_of_memory(fake_malloc):
    """A staging arena from cudaMalloc once raised a CUDA error where CuPy's
    allocator raised OutOfMemoryError after emptying its pool, so auto no
    longer fell back to the kernel when GPU memory was short."""
    fake_malloc["fails"] = 1
    assert release.device_malloc(4096, 0) == 0x1000
    assert fake_malloc["freed_pool"] == 1 and fake_malloc["calls"] == 2
    fake_malloc.update(fails=10, calls=0, freed_pool=0)
    with pytest.raises(cupy.cuda.memory.OutOfMemoryError):
        release.device_malloc(4096, 0)
    assert fake_malloc["calls"] == 2  # one retry, not a loop


def test_a_failing_gate_is_reported_and_later_releases_still_run():
    released = []

    def broken_gate():
        raise RuntimeError("event query failed")

    before = len(release.failures)
    with pytest.warns(RuntimeWarning, match="could not release test memory"):
        release.defer(lambda: released.append("first"), broken_gate, "test memory")
        release.defer(lambda: released.append("second"), None, "other memory")
        assert release.drain(timeout=10)
    assert released == ["second"] and len(release.failures) == before + 1


def test_a_dead_releaser_is_started_again(monkeypatch):
    """start() once only looked whether a thread had been made: after a fork
    (the thread does not come along) drain() waited for good."""
    dead = threading.Thread(target=lambda: None)
    dead.start()
    dead.join()
    monkeypatch.setattr(release, "_thread", [dead])
    monkeypatch.setattr(release, "_queue", release.queue.SimpleQueue())  # the new thread's own
    done = []
    release.defer(lambda: done.append(1))
    assert release.drain(timeout=10) and done == [1]
    assert release._thread[0] is not dead and release._thread[0].is_alive()


def test_the_releaser_relaxes_its_capture_mode_once_the_driver_takes_it(monkeypatch):
    """Review finding: the releaser set its capture mode once, at thread
    start, ignoring a refusal (the driver refuses before CUDA is
    initialized); it then freed in global mode for good.  It now asks at
    each release until the driver takes it, and then no more."""
    answers, asked, done = [None, 0], [], []
    monkeypatch.setattr(release.capture, "exchange", lambda mode: asked.append(mode) or answers.pop(0))
    work, relaxed = release.queue.SimpleQueue(), [False]
    for i in range(3):
        work.put((lambda i=i: done.append(i), None, "test memory"))
        release._release_next(work, relaxed)
    assert done == [0, 1, 2] and len(asked) == 2 and relaxed == [True]
