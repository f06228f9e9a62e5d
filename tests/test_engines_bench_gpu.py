"""``bench --engines``' adapter rows (issue 51, item 4) on a GPU at tiny
counts: every adapter row's two contenders (vLLM's worker pattern and
cupy_swap's vLLM worker; SGLang's kernel, or its transcription, and
cupy_swap's SGLang functions) copy every shape bit-exactly in both
directions, through the bench's own checks; the checks themselves catch a
wrong byte in a mapped block and a write outside the mapping; and the
command stores the rows.  (Written without a GPU: first run by the lead.)"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from cupy_swap.tools import engine_adapters
from cupy_swap.tools.engine_adapters import ADAPTER_CONTENDERS, ADAPTER_KEYS

from .gpu_helpers import require_gpu, require_torch_cuda

pytestmark = [pytest.mark.gpu, pytest.mark.torch]

cp = require_gpu()
torch = require_torch_cuda()


def test_adapter_rows_tiny_every_contender_bit_exact():
    rows, skipped = [], []
    out = engine_adapters.run_adapters(
        counts=(1, 3),
        reps=3,
        on_row=rows.append,
        on_skip=lambda shape, n, why: skipped.append((shape.key, n, why)),
    )
    assert out == rows and skipped == []
    assert {(r["shape"], r["num_blocks"], r["direction"]) for r in rows} == {
        (k, n, d) for k in ADAPTER_KEYS for n in (1, 3) for d in ("in", "out")
    }
    for row in rows:
        for name in ADAPTER_CONTENDERS[row["engine"]]:
            where = (row["shape"], row["num_blocks"], row["direction"], name, row.get(name + "_error"))
            assert row[name + "_ok"] is True, where
            assert row[name] > 0 and row[name + "_host_us"] > 0, where
        assert row["ceiling_gbps"] > 0 and "gain" in row and "host_gain" in row
        assert row.get("path") in {"kernel", "dma", "staged"}, row.get("path")
        if row["engine"] == "sglang":
            assert row["sglang_kernel_source"].startswith(("sgl-kernel", "transcription"))
        else:
            assert row["vllm_classes"] in ("vLLM's", "stand-ins of vLLM's")
    for line in engine_adapters.adapter_goal_lines(
        rows
    ):  # the figures are tiny; the lines must still be made
        assert "not measured" not in line or "vLLM goal (" in line


def _host_index(shape, kv, layer, token):
    """One element of a host pool token, by the layout's dims."""
    if shape.mla:
        return (layer, token, 0, 0)
    if shape.layout == "layer_first":
        return (kv, layer, token, 0, 0)
    if shape.layout == "page_first":
        return (kv, token, layer, 0, 0)
    return (kv, token // shape.page_size, 0, token % shape.page_size, layer, 0)


def _spoil(bufs, shape, direction, case, mapped: bool):
    """Flip one bit of the destination: in a mapped block / token, or in one
    the transfer must not have written."""
    if shape.engine == "vllm":
        if direction == "in":
            blocks = case.pairs[:, 0]
            block = int(blocks[0]) if mapped else int(np.setdiff1d(np.arange(bufs.gpu_blocks), blocks)[0])
            bufs.pages[2][block, 7] ^= 1
        else:
            rows = case.pairs[:, 1]
            row = int(rows[0]) if mapped else int(np.setdiff1d(np.arange(len(bufs.rows[2])), rows)[0])
            bufs.rows[2][row, 7] ^= 1
    else:
        if direction == "in":
            tokens = case.device_tokens
            token = (
                int(tokens[0]) if mapped else int(np.setdiff1d(np.arange(bufs.device_pages * 16), tokens)[0])
            )
            layers = bufs.pools.device_pool.kv_buffer if shape.mla else bufs.pools.device_pool.v_buffer
            layers[1].view(torch.int16)[token, 0, 3] ^= 1
        else:
            tokens = case.host_tokens
            token = (
                int(tokens[0]) if mapped else int(np.setdiff1d(np.arange(bufs.host_pages * 16), tokens)[0])
            )
            bufs.host[_host_index(shape, 1, 1, token)] ^= 1
    torch.cuda.synchronize()


@pytest.mark.parametrize("direction", ["in", "out"])
@pytest.mark.parametrize("key", ["vllm-llama-c4", "sglang-pf", "sglang-ph", "sglang-mla"])
def test_the_adapter_rows_checks_catch_wrong_and_stray_bytes(key, direction):
    shape = engine_adapters._adapter_shape(key)
    bufs = engine_adapters.AdapterHarness().buffers(shape, 4)
    try:
        bufs.fill(5)
        case = bufs.plan(3, np.random.default_rng(6))
        calls = bufs.calls(direction, case)
        ours = ADAPTER_CONTENDERS[shape.engine][1]
        submit, wait = calls[ours]

        def transfer_and_check(spoil=None):
            bufs.poison(direction)
            submit()
            wait()
            if spoil is not None:
                _spoil(bufs, shape, direction, case, spoil == "mapped")
            return bufs.verify(direction, case)

        assert transfer_and_check() is True
        assert transfer_and_check("mapped") is False  # a mapped block with one wrong bit
        assert transfer_and_check("stray") is False  # a block outside the mapping written
        assert transfer_and_check() is True  # and a good transfer after bad ones
    finally:
        bufs.close()


def test_bench_engines_stores_the_adapter_rows(tmp_path):
    out = tmp_path / "engines.json"
    r = subprocess.run(
        [sys.executable, "-m", "cupy_swap", "bench", "--engines", "--counts", "1", "--reps", "3"]
        + ["--directions", "out", "--adapters", "sglang", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads(out.read_text())
    rows = report["adapters"]
    assert [x["shape"] for x in rows] == list(engine_adapters.adapter_shapes(["sglang"]))
    assert all(x["sglang_kernel_ok"] and x["sglang_functions_ok"] for x in rows)
    assert "SGLang goal: at or above SGLang's kernel in" in r.stdout
