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
