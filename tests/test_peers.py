"""The contenders of ``bench --peers``, on the CPU: the seed's kernel
compiles, and the table covers the cases the performance issue names."""

import pytest

from cupy_swap.tools.peers import CONTENDERS, PEER_CASES, SEED_KERNEL_SOURCE

nvrtc = pytest.importorskip("cupy_backends.cuda.libs.nvrtc", reason="CuPy with NVRTC bindings is needed")


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_seed_kernel_compiles(arch):
    prog = nvrtc.createProgram(SEED_KERNEL_SOURCE, "seed.cu", [], [])
    try:
        nvrtc.compileProgram(prog, [f"--gpu-architecture={arch}"])
        assert b"seed_swap_blocks" in nvrtc.getCUBIN(prog)
    finally:
        nvrtc.destroyProgram(prog)


def test_peer_cases_cover_the_table():
    grid = {(c.direction, c.block_bytes, c.num_blocks) for c in PEER_CASES}
    assert len(grid) == len(PEER_CASES) == 24
    for d in ("in", "out"):
        for b in (4 << 10, 32 << 10, 256 << 10, 2 << 20):
            for n in (1, 16, 1250):
                assert (d, b, n) in grid
    assert all(c.parts == 1 for c in PEER_CASES)
    assert CONTENDERS[-2:] == ("cupy_swap", "cupy_swap_prepared")
