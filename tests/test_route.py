"""The routing policy (cupy_swap/core/route.py) decided on the CPU: host
parts are NumPy arrays described as parts, GPU parts are NumPy arrays that
claim to be GPU memory (the ``fake_gpu`` fixture); no driver is asked."""

import numpy as np
import pytest

from cupy_swap.core.layout import layout_from_parts
from cupy_swap.core.mapping import check_mapping_for
from cupy_swap.core.parts import as_parts
from cupy_swap.core.route import Policy, route

POLICY = Policy()


def _parts(fake_gpu, shape, gpu: bool):
    a = fake_gpu.keep(np.zeros(shape, np.uint8))
    return fake_gpu.parts(a, "x") if gpu else as_parts(a, "x")


def _layout(fake_gpu, direction: str, block: int, blocks: int = 4096, kernel_ok: bool = True):
    host, gpu = _parts(fake_gpu, (blocks, block), False), _parts(fake_gpu, (blocks, block), True)
    src, dst = (host, gpu) if direction == "in" else (gpu, host)
    layout = layout_from_parts(src, dst)
    layout.kernel_ok = kernel_ok
    layout.unmapped_reason = "" if kernel_ok else "UVA is off"
    return layout


def _route(layout, m, mode="auto", capturing=False, policy=POLICY):
    mapping = check_mapping_for(layout, m)
    return route(layout, mapping, mode, policy, capturing)


def _random(n, blocks=4096, seed=0):
    rng = np.random.default_rng(seed)
    return np.column_stack((rng.choice(blocks, n, replace=False), rng.choice(blocks, n, replace=False)))


def _runs(n, start=0):
    return np.column_stack((np.arange(start, start + n), np.arange(n)))


@pytest.mark.parametrize("direction", ["in", "out"])
def test_auto_paths(direction, fake_gpu):
    kb = 1 << 10
    assert _route(_layout(fake_gpu, direction, 32 * kb), _random(1))[0] == "dma"  # one copy
    assert _route(_layout(fake_gpu, direction, 32 * kb), _random(16))[0] == "kernel"  # few scattered blocks
    assert _route(_layout(fake_gpu, direction, 32 * kb), _random(1250))[0] == "kernel"
    assert _route(_layout(fake_gpu, direction, 2048 * kb, 64), _random(16, 64))[0] == "dma"  # large copies
    # One run both sides: a few large copies beat the kernel.
    assert _route(_layout(fake_gpu, direction, 32 * kb), _runs(1250))[0] == "dma"
    # Host blocks in one run, GPU blocks scattered: staged once it is large.
    m = np.column_stack((np.arange(1250), _random(1250)[:, 1]))
    if direction == "out":
        m = m[:, ::-1].copy()
    path, plan = _route(_layout(fake_gpu, direction, 32 * kb), m)
    assert path == "staged" and plan.num_chunks >= 2
    # 3 MiB: below staged_min_bytes.
    assert _route(_layout(fake_gpu, direction, 32 * kb), m[:100])[0] == "kernel"


def test_short_lists_route_like_arrays(fake_gpu):
    layout = _layout(fake_gpu, "in", 32 << 10)
    for m in (_random(1), _random(16), _runs(16)):
        flat = m.reshape(-1).tolist()
        assert route(layout, flat, "auto", POLICY, False)[0] == _route(layout, m)[0]


def test_explicit_modes_and_refusals(fake_gpu):
    layout = _layout(fake_gpu, "in", 4096)
    assert _route(layout, _random(10), "kernel")[0] == "kernel"
    assert _route(layout, _random(10), "dma")[0] == "dma"
    assert _route(layout, _runs(10), "staged")[0] == "staged"
    with pytest.raises(ValueError, match="cannot be captured"):
        _route(layout, _runs(10), "staged", capturing=True)
    with pytest.raises(ValueError, match="staging_bytes=0"):
        _route(layout, _runs(10), "staged", policy=Policy(staging_bytes=0))
    unmapped = _layout(fake_gpu, "in", 4096, kernel_ok=False)
    with pytest.raises(ValueError, match="mode: 'kernel' needs host memory mapped.*UVA is off"):
        _route(unmapped, _random(10), "kernel")
    assert _route(unmapped, _random(10))[0] == "dma"


def test_gpu_to_gpu_never_staged(fake_gpu):
    gpu = _parts(fake_gpu, (64, 4096), True)
    layout = layout_from_parts(gpu, _parts(fake_gpu, (64, 4096), True))
    with pytest.raises(ValueError, match="GPU -> GPU"):
        _route(layout, _runs(10), "staged")


def test_thresholds_come_from_the_policy(fake_gpu):
    layout = _layout(fake_gpu, "in", 256 << 10, 256)
    m = _random(16, 256)
    assert _route(layout, m)[0] == "kernel"
    assert _route(layout, m, policy=Policy(dma_min_copy_bytes=256 << 10))[0] == "dma"
    assert _route(layout, _random(2, 256), policy=Policy(dma_max_copies=4))[0] == "dma"


def _mixed_layout(fake_gpu, direction: str, large: int, small: int, small_parts: int, blocks: int = 1300):
    """One part of ``large`` blocks beside ``small_parts`` parts of ``small``."""
    host = _parts(fake_gpu, (blocks, large), False) + [
        p for _ in range(small_parts) for p in _parts(fake_gpu, (blocks, small), False)
    ]
    gpu = _parts(fake_gpu, (blocks, large), True) + [
        p for _ in range(small_parts) for p in _parts(fake_gpu, (blocks, small), True)
    ]
    src, dst = (host, gpu) if direction == "in" else (gpu, host)
    layout = layout_from_parts(src, dst)
    layout.kernel_ok = True
    return layout


@pytest.mark.parametrize("direction", ["in", "out"])
@pytest.mark.parametrize("as_list", [False, True])
def test_one_large_part_does_not_send_small_parts_to_the_copy_engines(direction, as_list, fake_gpu):
    """auto once routed by the largest block: one 2 MiB part beside 63 parts
    of 4 KiB sent 1250 random pairs to the copy engines, one copy per block
    (267.6 ms on an H200, against 57.6 ms for the kernel)."""
    layout = _mixed_layout(fake_gpu, direction, 2 << 20, 4096, 63)
    m = _random(1250, blocks=1300)
    mapping = m.tolist() if as_list else m
    assert _route(layout, mapping)[0] == "kernel"
    # Every part large: still the copy engines.
    assert _route(_mixed_layout(fake_gpu, direction, 2 << 20, 2 << 20, 3), m)[0] == "dma"
    # Long runs of mixed blocks: copies large on average, so the copy engines.
    runs = np.column_stack((np.arange(1250), np.arange(1250)))
    assert _route(layout, runs)[0] == "dma"
