"""Shared fixtures.  GPU test modules (``*_gpu.py``) skip themselves at
collection when no CUDA device answers (``tests/gpu_helpers.py``); single
tests marked ``gpu`` in CPU modules are skipped here, so the CPU tests
still run (and must pass) in CI; tests marked ``multi_gpu`` also need a
second GPU."""

from __future__ import annotations

import numpy as np
import pytest

from .fakes import FakeCudaRuntime, FakeGpu, finish_held
from .gpu_helpers import skip_reason


def pytest_collection_modifyitems(config, items):
    no_gpu, one_gpu = skip_reason(1), skip_reason(2)
    for item in items:
        if "gpu" in item.keywords and no_gpu:
            item.add_marker(pytest.mark.skip(reason=no_gpu))
        elif "multi_gpu" in item.keywords and one_gpu:
            item.add_marker(pytest.mark.skip(reason=one_gpu))


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


@pytest.fixture
def swapper():
    from cupy_swap import BlockSwapper

    return BlockSwapper(max_blocks=4096)


@pytest.fixture
def fake_gpu():
    """A :class:`~tests.fakes.FakeGpu`: NumPy arrays as parts that claim to
    be GPU memory, the arrays kept alive until the test ends."""
    gpu = FakeGpu()
    yield gpu
    gpu.release()


@pytest.fixture
def fake_cuda(monkeypatch):
    """A :class:`~tests.fakes.FakeCudaRuntime` in place of CUDA for
    ``cupy_swap.cuda.memory``.  Memory dropped under the stand-in is
    released under it: the releaser thread is drained before and after."""
    from cupy_swap.cuda import memory, release

    assert release.drain(timeout=10)  # nothing of earlier tests released under the stand-in
    fake = FakeCudaRuntime()
    monkeypatch.setattr(memory, "_runtime", lambda: fake)
    monkeypatch.setattr(memory.driver, "devices_in_use", lambda: [])  # no GPU queued anything here
    yield fake
    assert release.drain(timeout=10)


@pytest.fixture(autouse=True)
def _earlier_drops_released(request):
    """Before a GPU test, what earlier tests dropped is released: a release
    waits for the whole GPU and meanwhile holds up other threads' event
    records (benchmarks/probes/release_lock_probe.py), so a release landing
    inside a test would make its "the call did not wait" checks depend on
    the tests before it."""
    if "gpu" in request.keywords:
        import gc

        from cupy_swap.cuda import release

        gc.collect()
        assert release.drain(timeout=60)
    yield
    finish_held()  # launches a CPU test held and never landed: their rings can be released
