"""Shared fixtures.  Tests marked ``gpu`` are skipped at collection when no
CUDA device answers, so the CPU tests still run (and must pass) in CI; tests
marked ``multi_gpu`` also need a second GPU."""

from __future__ import annotations

import numpy as np
import pytest

from cupy_swap.tools.bench import gpu_status
from cupy_swap.tools.cli import no_gpu_message

GPU_OK, GPU_WHY = gpu_status()


def _gpu_count() -> int:
    if not GPU_OK:
        return 0
    import cupy

    return cupy.cuda.runtime.getDeviceCount()


def pytest_collection_modifyitems(config, items):
    gpus = _gpu_count()
    no_gpu = pytest.mark.skip(reason=f"needs a CUDA GPU: {no_gpu_message(GPU_WHY)}") if not gpus else None
    one_gpu = pytest.mark.skip(reason=f"needs two CUDA GPUs, found {gpus}")
    for item in items:
        if "gpu" in item.keywords and not gpus:
            item.add_marker(no_gpu)
        elif "multi_gpu" in item.keywords and gpus < 2:
            item.add_marker(one_gpu)


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


@pytest.fixture
def swapper():
    from cupy_swap import BlockSwapper

    return BlockSwapper(max_blocks=4096)
