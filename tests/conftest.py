"""Shared fixtures.  Tests marked ``gpu`` are skipped at collection when no
CUDA device answers, so the CPU tests still run (and must pass) in CI."""

from __future__ import annotations

import numpy as np
import pytest

from cupy_swap.bench import gpu_status

GPU_OK, GPU_WHY = gpu_status()


def pytest_collection_modifyitems(config, items):
    if GPU_OK:
        return
    skip = pytest.mark.skip(reason=f"needs a CUDA GPU: {GPU_WHY}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


@pytest.fixture
def swapper():
    from cupy_swap import BlockSwapper

    return BlockSwapper(max_blocks=4096)
