"""``bench --engines`` on a GPU at tiny counts: every contender copies every
shape bit-exactly in both directions, and the check itself catches a wrong
byte in a mapped block and a write outside the mapping."""

import json
import subprocess
import sys

import numpy as np
import pytest

from .gpu_helpers import require_gpu

pytestmark = pytest.mark.gpu

cp = require_gpu()


def test_bench_engines_tiny_every_contender_bit_exact(tmp_path):
    out = tmp_path / "engines.json"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "cupy_swap",
            "bench",
            "--engines",
            "--counts",
            "1,3",
            "--reps",
            "3",
            "--adapters",
            "none",
        ]
        + ["--json", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    rows = json.loads(out.read_text())["engines"]
    from cupy_swap.tools.engines import CONTENDERS, OURS, SHAPE_KEYS

    assert {(x["shape"], x["num_blocks"], x["direction"]) for x in rows} == {
        (s, n, d) for s in SHAPE_KEYS for n in (1, 3) for d in ("in", "out")
    }
    for row in rows:
        for name in CONTENDERS:
            assert row[name + "_ok"] is True, (
                row["shape"],
                row["num_blocks"],
                name,
                row.get(name + "_error"),
            )
            assert row[name] > 0 and row[name + "_host_us"] > 0
        assert set(row["paths"]) == set(OURS)


@pytest.mark.parametrize("direction", ["in", "out"])
def test_the_check_catches_wrong_and_stray_bytes(direction):
    from cupy_swap import BlockSwapper
    from cupy_swap.tools.engines import EngineBuffers, EngineShape

    bufs = EngineBuffers(EngineShape("t", 3, 4096, "pool", "test"), 4)
    bufs.fill(1)
    mapping = np.array([[0, 5], [6, 1], [3, 2]])
    src, dst = bufs.sides(direction)
    sw = BlockSwapper(max_blocks=8)

    def swap_and_check(spoil=None):
        bufs.poison(direction)
        sw.swap(src, dst, mapping).synchronize()
        if spoil is not None:
            spoil(dst)
        return bufs.verify(direction, mapping)

    def poke(part, block):
        def spoil(parts):
            parts[part][block, 7] ^= 1  # NumPy or CuPy
            cp.cuda.Device().synchronize()

        return spoil

    assert swap_and_check() is True
    assert swap_and_check(poke(2, 1)) is False  # a mapped block with one wrong bit
    assert swap_and_check(poke(0, 7)) is False  # a block outside the mapping written
