"""The routing policy (cupy_swap/core/route.py), decided once per layout, on the CPU: host
parts are NumPy arrays described as parts, GPU parts are NumPy arrays that
claim to be GPU memory (the ``fake_gpu`` fixture); no driver is asked."""

import numpy as np
import pytest

from cupy_swap.core.layout import layout_from_parts
from cupy_swap.core.parts import as_parts
from cupy_swap.core.route import Policy, prepared_route
from cupy_swap.staged.plan import staged_plan

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


def _route(layout, mode="auto", policy=POLICY):
    return prepared_route(layout, mode, policy)


def _random(n, blocks=4096, seed=0):
    rng = np.random.default_rng(seed)
    return np.column_stack((rng.choice(blocks, n, replace=False), rng.choice(blocks, n, replace=False)))


@pytest.mark.parametrize("direction", ["in", "out"])
def test_auto_paths_depend_on_the_layout_only(direction, fake_gpu):
    kb = 1 << 10
    assert _route(_layout(fake_gpu, direction, 32 * kb)) == "kernel"
    assert _route(_layout(fake_gpu, direction, 256 * kb)) == "kernel"
    assert _route(_layout(fake_gpu, direction, 2048 * kb, 64)) == "dma"  # large copies


def test_explicit_modes_and_refusals(fake_gpu):
    layout = _layout(fake_gpu, "in", 4096)
    assert _route(layout, "kernel") == "kernel"
    assert _route(layout, "dma") == "dma"
    assert _route(layout, "staged") == "staged"
    with pytest.raises(ValueError, match="staging_bytes=0"):
        _route(layout, "staged", policy=Policy(staging_bytes=0))
    unmapped = _layout(fake_gpu, "in", 4096, kernel_ok=False)
    with pytest.raises(ValueError, match="mode: 'kernel' needs host memory mapped.*UVA is off"):
        _route(unmapped, "kernel")
    assert _route(unmapped) == "dma"


def test_gpu_to_gpu_never_staged(fake_gpu):
    gpu = _parts(fake_gpu, (64, 4096), True)
    layout = layout_from_parts(gpu, _parts(fake_gpu, (64, 4096), True))
    with pytest.raises(ValueError, match="GPU -> GPU"):
        _route(layout, "staged")


def test_thresholds_come_from_the_policy(fake_gpu):
    layout = _layout(fake_gpu, "in", 256 << 10, 256)
    assert _route(layout) == "kernel"
    assert _route(layout, policy=Policy(dma_min_copy_bytes=256 << 10)) == "dma"


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
def test_one_large_part_does_not_send_small_parts_to_the_copy_engines(direction, fake_gpu):
    """auto once routed by the largest block: one 2 MiB part beside 63 parts
    of 4 KiB sent 1250 random pairs to the copy engines, one copy per block
    (267.6 ms on an H200, against 57.6 ms for the kernel)."""
    assert _route(_mixed_layout(fake_gpu, direction, 2 << 20, 4096, 63)) == "kernel"
    # Every part large: the copy engines.
    assert _route(_mixed_layout(fake_gpu, direction, 2 << 20, 2 << 20, 3)) == "dma"


@pytest.mark.parametrize("direction", ["in", "out"])
def test_staged_plan_covers_every_row(direction, fake_gpu):
    layout = _layout(fake_gpu, direction, 32 << 10)
    m = np.column_stack((np.arange(1250), _random(1250)[:, 1]))
    plan = staged_plan(layout, m if direction == "in" else m[:, ::-1].copy(), Policy(staging_bytes=8 << 20))
    assert plan.num_chunks >= 2 and sum(plan.sizes) == 1250


def test_the_readme_says_what_auto_does():
    """Finding 12 of issue 32: the README's Modes bullet said auto stages
    long runs of 16 MiB and more, which it did not; since issue 34 a call
    looks at its rows' ends for one run (core/route.run_route), and the
    bullet says so with the thresholds it reads."""
    import pathlib
    import re

    readme = (pathlib.Path(__file__).resolve().parents[1] / "README.md").read_text()
    modes = re.search(r"- \*\*Modes\.\*\*(.*?)\n- \*\*", readme, re.DOTALL).group(1)
    modes = " ".join(modes.split())
    assert "two ends of its rows" in modes and "one run" in modes and "16 MiB" not in modes
    assert "dma_min_copy_bytes" in modes and "dma_max_copies" in modes  # the two thresholds auto reads


@pytest.mark.parametrize("direction", ["in", "out"])
@pytest.mark.parametrize("block", [4096, 32 << 10, 2 << 20, 16 << 20])
def test_auto_never_stages_a_layout(direction, block, fake_gpu):
    layout = _layout(fake_gpu, direction, block, blocks=8)
    assert _route(layout) in ("kernel", "dma")


def test_run_rows_reach_a_full_speed_copy(fake_gpu):
    from cupy_swap.core.route import run_rows

    kb = 1 << 10
    assert run_rows(_layout(fake_gpu, "in", 32 * kb, 8), POLICY) == 64  # 64 x 32 KiB = 2 MiB
    assert run_rows(_layout(fake_gpu, "out", 1536 * kb, 8), POLICY) == 2
    assert run_rows(_layout(fake_gpu, "in", 32 * kb, 8), Policy(dma_min_copy_bytes=1)) == 2
    gpu = _parts(fake_gpu, (8, 4096), True)
    assert run_rows(layout_from_parts(gpu, _parts(fake_gpu, (8, 4096), True)), POLICY) is None  # GPU -> GPU


@pytest.mark.parametrize("form", ["array", "list"])
def test_run_route_looks_at_the_ends_only(form):
    from cupy_swap.core.route import run_route

    def route(rows, direction="in", staged_ok=True):
        m = np.array(rows, np.int64)
        return run_route(m if form == "array" else m.ravel().tolist(), len(rows), direction, staged_ok)

    run, scattered = list(range(10, 18)), [5, 1, 7, 3, 0, 6, 2, 4]
    assert route(list(zip(run, run))) == "dma"  # one run each side: one copy per part
    assert route(list(zip(run, scattered))) == "staged"  # host column (source, swap-in) one run
    assert route(list(zip(scattered, run))) is None  # swap-in: the run is on the GPU side
    assert route(list(zip(scattered, run)), "out") == "staged"  # swap-out: the host is the destination
    assert route(list(zip(run, scattered)), staged_ok=False) is None
    assert route(list(zip(scattered, scattered))) is None
    lying = [10, 13, 12, 11, 14, 15, 16, 17]  # ends span 8 blocks, not one run: still routed, copied right
    assert route(list(zip(lying, lying))) == "dma"
