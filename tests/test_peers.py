"""The contenders of ``bench --peers``, on the CPU: the seed's kernel
compiles, the cases are every direction x block size x count, and every
contender has a column and a label."""

import pytest

from cupy_swap.tools.peers import (
    CONTENDER_COLUMNS,
    CONTENDER_LABELS,
    CONTENDERS,
    PEER_CASES,
    SEED_KERNEL_SOURCE,
    peer_cases,
)

nvrtc = pytest.importorskip("cupy_backends.cuda.libs.nvrtc", reason="CuPy with NVRTC bindings is needed")


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_seed_kernel_compiles(arch):
    prog = nvrtc.createProgram(SEED_KERNEL_SOURCE, "seed.cu", [], [])
    try:
        nvrtc.compileProgram(prog, [f"--gpu-architecture={arch}"])
        assert b"seed_swap_blocks" in nvrtc.getCUBIN(prog)
    finally:
        nvrtc.destroyProgram(prog)


def test_peer_cases_are_every_direction_size_and_count_once():
    cases = peer_cases(("in", "out"), (16, 4096), (1, 3, 7))
    # Direction outermost, then block size, then count; one part each.
    assert [(c.direction, c.block_bytes, c.num_blocks, c.parts) for c in cases] == [
        (d, b, n, 1) for d in ("in", "out") for b in (16, 4096) for n in (1, 3, 7)
    ]
    assert len({(c.direction, c.block_bytes, c.num_blocks) for c in PEER_CASES}) == len(PEER_CASES)


def test_every_contender_has_a_column_and_a_label():
    assert len(set(CONTENDERS)) == len(CONTENDERS)
    assert set(CONTENDER_COLUMNS) == set(CONTENDER_LABELS) == set(CONTENDERS)
    assert len(set(CONTENDER_COLUMNS.values())) == len(CONTENDERS)  # no two columns share a header
