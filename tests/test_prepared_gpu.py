"""Prepared swaps (``sw.prepare(src, dst)``): bit-exact in every direction
and mode, holding their arrays, and the measuring code of ``bench --peers``
and ``bench --host-time`` on small cases (correctness only: timings belong
to the benchmarks)."""

import gc
import weakref

import numpy as np
import pytest

import cupy_swap as cs
from cupy_swap.tools.bench import random_mapping

from .gpu_helpers import DIRECTIONS, check_swap, make, poison, rand_fill, require_gpu

pytestmark = pytest.mark.gpu

cp = require_gpu()


class _Op:
    """Adapts a prepared op to ``check_swap``'s ``sw.swap(src, dst, m)``."""

    def __init__(self, op):
        self.op = op

    def swap(self, src, dst, mapping, **kw):
        return self.op(mapping, **kw)


@pytest.mark.parametrize("direction", list(DIRECTIONS))
@pytest.mark.parametrize("mode", ["auto", "kernel", "dma"])
@pytest.mark.parametrize("n", [1, 17, 1250])
def test_prepared_swap_is_bit_exact(rng, direction, mode, n):
    skind, dkind = DIRECTIONS[direction]
    src = [make(skind, (n + 9, 4096), np.uint8) for _ in range(3)]
    dst = [make(dkind, (n + 11, 4096), np.uint8) for _ in range(3)]
    for a in src:
        rand_fill(a, rng)
    for a in dst:
        poison(a)
    sw = cs.BlockSwapper(max_blocks=2048)
    op = sw.prepare(src, dst)
    assert isinstance(op, cs.PreparedSwap) and op.bytes_per_pair == 3 * 4096
    for _ in range(3):  # several calls, new mappings
        ev = check_swap(_Op(op), src, dst, random_mapping(n, n + 9, n + 11, rng), mode=mode)
        assert ev.path == mode or mode == "auto"


def test_prepared_staged_swap(rng):
    sw = cs.BlockSwapper(max_blocks=2048)
    host = cs.empty_pinned((1500, 32 << 10), np.uint8)
    gpu = cp.empty((1300, 32 << 10), cp.uint8)
    rand_fill(host, rng)
    poison(gpu)
    op = sw.prepare(host, gpu)
    m = np.column_stack((np.arange(1000) + 3, rng.choice(1300, 1000, replace=False)))
    assert check_swap(_Op(op), host, gpu, m, mode="staged").path == "staged"


def test_prepared_swap_checks_mappings_and_holds_its_arrays(rng):
    sw = cs.BlockSwapper(max_blocks=16)
    host = cs.empty_pinned((8, 256), np.uint8)
    op = sw.prepare(host, cp.empty((4, 256), cp.uint8))
    ref = weakref.ref(host)
    del host
    gc.collect()
    assert ref() is not None  # the op keeps its arrays alive
    with pytest.raises(IndexError, match="out of range"):
        op([(0, 4)])  # one copy: the copy engines, checked on the host
    with pytest.raises(ValueError, match="distinct destination"):
        op([(0, 1), (2, 1)]).synchronize()  # checked by the launch
    with pytest.raises(ValueError, match="distinct destination"):
        op([(0, 1), (2, 1)], check="host")
    with pytest.raises(ValueError, match="dst: expected an array on GPU|host memory on both sides"):
        sw.prepare(np.zeros((4, 8), np.uint8), np.zeros((4, 8), np.uint8))
    assert "host -> GPU" in repr(op)


def test_peers_case_runs_every_contender_bit_exactly():
    from cupy_swap.tools.bench import SwapCase
    from cupy_swap.tools.peers import CONTENDERS, run_peers_case

    for case in (SwapCase("in", 4096, 16), SwapCase("out", 32768, 1)):
        row = run_peers_case(case, reps=3)
        for name in CONTENDERS:
            assert row[name + "_ok"], name
            assert row[name] > 0
        assert row["lead"] in CONTENDERS


def test_host_time_table_has_every_mode_and_form():
    from cupy_swap.tools.bench import HOST_TIME_MODES, run_host_time

    result = run_host_time(counts=(1, 16), reps=5)
    assert result["memcpy_us"] > 0
    seen = {(r["parts"], r["n"], r["mode"], r["form"]) for r in result["rows"]}
    for parts in (1, 64):
        for n in (1, 16):
            for mode in HOST_TIME_MODES:
                for form in ("array", "list", "prepared"):
                    assert (parts, n, mode, form) in seen
    assert {r["path"] for r in result["rows"] if r["mode"] == "staged"} == {"staged"}


def test_prepared_swap_after_its_pool_is_unregistered(rng):
    """An op made on a registered pool resolves its aliases again once the
    pool is unregistered, and refuses clearly instead of reaching unmapped
    memory."""
    sw = cs.BlockSwapper(max_blocks=16)
    pool = np.empty((16, 4096), np.uint8)
    cs.register_host(pool)
    gpu = cp.empty((16, 4096), cp.uint8)
    rand_fill(gpu, rng)
    op = sw.prepare(gpu, pool)
    op([(0, 1), (2, 3)], mode="kernel").synchronize()
    assert np.array_equal(pool[[1, 3]], cp.asnumpy(gpu)[[0, 2]])
    cs.unregister_host(pool)
    with pytest.raises(ValueError, match="page-locked"):
        op([(4, 5)], mode="kernel")


def test_swap_with_fresh_views_of_the_same_memory_reuses_its_op(rng):
    """Servers build ``[pool[:, layer] for layer in ...]`` on every call; each
    such call once missed the op cache and re-checked every array (1145 us
    per call at 64 parts).  Fresh views of the same memory now find the op
    the first call built, and copy what a reference copy does."""
    layers = 8
    sw = cs.BlockSwapper(max_blocks=32)
    pool = cs.empty_pinned((32, layers, 2048), np.uint8)
    gpu = [cp.empty((32, 2048), cp.uint8) for _ in range(layers)]
    rand_fill(pool, rng)
    for g in gpu:
        poison(g)
    mappings = [random_mapping(8, 32, 32, rng) for _ in range(3)]
    for m in mappings:
        check_swap(sw, [pool[:, i] for i in range(layers)], list(gpu), m)
    assert len(sw._ops._entries) == 1  # one op, found again by the fresh views
    out = cs.empty_pinned((32, layers, 2048), np.uint8)
    poison(out)
    for m in mappings:
        check_swap(sw, [g[:] for g in gpu], [out[:, i] for i in range(layers)], m)
    assert len(sw._ops._entries) == 2  # and one for the other direction
