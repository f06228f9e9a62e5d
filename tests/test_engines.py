"""``bench --engines`` on the CPU: the V1 pattern's pointer lists and the pull
request's launches address the right bytes (replayed with memmove / NumPy),
the run's logic with a stand-in for the GPU (every shape, count, direction;
checks after timing; a failing contender reported, not fatal; counts that do
not fit left out), the figures, the table, the chart, and the command line."""

from __future__ import annotations

import ctypes
import json
import math
import sys
import types

import numpy as np
import pytest

from cupy_swap.tools import cli, cli_bench, cli_common, engine_adapters, engines, plot
from cupy_swap.tools.engines import (
    CONTENDERS,
    SHAPES,
    EngineShape,
    counts_that_fit,
    finish_row,
    footprint,
    pointer_lists,
    pr_launch_args,
    summary,
    time_in_turns,
)

KIB = 1024


class _GpuPart:
    """A NumPy array posing as a GPU part: ``data.ptr`` and ``strides``."""

    def __init__(self, array):
        self.array = array
        self.data = types.SimpleNamespace(ptr=array.ctypes.data)
        self.strides = array.strides


def _bufs(shape: EngineShape, blocks: int, rng):
    """Host cache laid out as ``shape`` says, GPU parts as NumPy arrays."""
    P, B = shape.parts, shape.block_bytes
    if shape.host == "pool":
        host_arrays = [rng.integers(0, 256, (blocks, P, B), dtype=np.uint8)]
        host_parts = [host_arrays[0][:, p] for p in range(P)]
    else:
        host_arrays = [rng.integers(0, 256, (blocks, B), dtype=np.uint8) for _ in range(P)]
        host_parts = host_arrays
    gpu = [rng.integers(0, 256, (blocks, B), dtype=np.uint8) for _ in range(P)]
    bufs = engines.EngineBuffers.__new__(engines.EngineBuffers)
    bufs.shape, bufs.blocks = shape, blocks
    bufs.host_arrays, bufs.host_parts, bufs.gpu_parts = host_arrays, host_parts, [_GpuPart(g) for g in gpu]
    return bufs, gpu


def _arrays(parts):
    return [p.array if isinstance(p, _GpuPart) else p for p in parts]


@pytest.mark.parametrize("host", ["separate", "pool"])
@pytest.mark.parametrize("direction", ["in", "out"])
def test_v1_pointer_lists_copy_what_the_mapping_says(host, direction, rng):
    shape = EngineShape("t", 3, 48, host, "test")
    bufs, _ = _bufs(shape, 9, rng)
    src, dst = (_arrays(side) for side in bufs.sides(direction))
    expected = [d.copy() for d in dst]
    mapping = np.array([[4, 0], [7, 8], [1, 3]])
    for e, s in zip(expected, src):
        e[mapping[:, 1]] = s[mapping[:, 0]]
    addresses = engines._part_addresses(bufs, direction, device=False)
    dsts, srcs, sizes = pointer_lists(*addresses, mapping, shape.block_bytes)
    assert dsts.dtype == srcs.dtype == sizes.dtype == np.uint64 and len(sizes) == 9
    for d, s, n in zip(dsts.tolist(), srcs.tolist(), sizes.tolist()):
        ctypes.memmove(d, s, n)
    for got, want in zip(dst, expected):
        assert np.array_equal(got, want)


@pytest.mark.parametrize("host", ["separate", "pool"])
def test_pr_launches_read_and_write_the_right_words(host, rng):
    """Replays each launch as the kernel runs it (block s of the source at
    base + s * stride, ``words`` 8-byte words) over the parts' bytes."""
    shape = EngineShape("t", 2, 64, host, "test")
    bufs, _ = _bufs(shape, 6, rng)
    src, dst = (_arrays(side) for side in bufs.sides("in"))
    mapping = np.array([[5, 1], [0, 4]])
    expected = [d.copy() for d in dst]
    for e, s in zip(expected, src):
        e[mapping[:, 1]] = s[mapping[:, 0]]
    launches = pr_launch_args(*engines._part_addresses(bufs, "in", device=False), shape.block_bytes)
    assert [(a[2] is None) for a in launches] == [host == "separate"] * 2
    for s_base, d_base, s_words, d_words in launches:
        s_stride = shape.block_bytes if s_words is None else 8 * s_words
        d_stride = shape.block_bytes if d_words is None else 8 * d_words
        for s, d in mapping.tolist():
            ctypes.memmove(d_base + d * d_stride, s_base + s * s_stride, shape.block_bytes)
    for got, want in zip(dst, expected):
        assert np.array_equal(got, want)


def test_strided_kernel_compiles():
    nvrtc = pytest.importorskip("cupy_backends.cuda.libs.nvrtc", reason="CuPy with NVRTC bindings is needed")
    prog = nvrtc.createProgram(engines.STRIDED_KERNEL_SOURCE, "strided.cu", [], [])
    try:
        nvrtc.compileProgram(prog, ["--gpu-architecture=sm_90"])
        assert b"seed_swap_blocks_strided" in nvrtc.getCUBIN(prog)
    finally:
        nvrtc.destroyProgram(prog)


def test_shapes_are_the_engines_geometries():
    by_key = {s.key: s for s in SHAPES}
    assert by_key["vllm"].parts == 64 and by_key["vllm"].block_bytes == 16 * 8 * 128 * 2
    assert by_key["vllm-pool"].host == "pool" and by_key["vllm"].host == "separate"
    assert by_key["mla"].parts == 61 and by_key["mla"].block_bytes == 64 * 576 * 2
    assert by_key["2m"].parts == 1 and by_key["2m"].block_bytes == 2 << 20
    assert [s.label() for s in SHAPES] == ["64 x 32 KiB", "64 x 32 KiB, pool", "61 x 72 KiB", "1 x 2 MiB"]
    assert set(engines.COLUMNS) == set(engines.LABELS) == set(CONTENDERS)


def test_footprint_and_what_fits():
    mla = SHAPES[2]
    gpu, host = footprint(mla, 1250)
    cache = 2500 * 61 * 72 * KIB
    assert (
        host == cache + 1250 * 61 * 72 * KIB and gpu == 2 * cache + 1250 * 61 * 72 * KIB + 2 * 1250 * 72 * KIB
    )
    assert counts_that_fit(mla, (1250, 1, 16, 256), 1 << 50, 1 << 50) == [1, 16, 256, 1250]
    assert counts_that_fit(mla, (1, 16, 256, 1250), footprint(mla, 256)[0] / 0.8, 1 << 50) == [1, 16, 256]


def test_time_in_turns_takes_each_calls_fastest_round():
    """Calls take turns; a slow round decides nothing; warm-up calls are not timed."""
    now = [0.0]
    cost = {"a": [5.0] * 2 + [9.0] * 4 + [1.0] * 4 + [3.0] * 4, "b": [5.0] * 2 + [2.0] * 12}
    order = []

    def call(name):
        def fn():
            order.append(name)
            now[0] += cost[name].pop(0)

        return fn

    def sync():
        now[0] += 0.5  # the wait after the submit: blocking = submit + 0.5

    out = time_in_turns({"a": call("a"), "b": call("b")}, sync, reps=12, rounds=3, clock=lambda: now[0])
    assert (
        order == ["a", "a", "b", "b"] + ["a"] * 4 + ["b"] * 4 + ["a"] * 4 + ["b"] * 4 + ["a"] * 4 + ["b"] * 4
    )
    assert out == {"a": (1.5, 1.0), "b": (2.5, 2.0)}


def _row(shape="vllm", n=16, direction="in", **gbps):
    row = {"shape": shape, "num_blocks": n, "direction": direction, "ceiling_gbps": 50.0, "bytes": 1}
    figures = {"pr_per_part": 30, "v1_pattern": 25, "swap": 40, "prepared": 45, "prepared_gpu_rows": 44}
    figures.update(gbps)
    for name, g in figures.items():
        row[name], row[name + "_host_us"], row[name + "_ok"] = (
            float(g),
            100.0 if name in engines.ENGINE_PATTERNS else 10.0,
            True,
        )
    row["paths"] = {"prepared": "kernel"}
    return finish_row(row)


def test_rows_name_their_lead_and_the_summary_counts_prepared_leads():
    a, b = _row(), _row(n=256, pr_per_part=50)
    assert (a["lead"], a["best_engine"], a["prepared_ratio"]) == ("prepared", "pr_per_part", 0.9)
    assert (b["lead"], b["best_engine"]) == ("pr_per_part", "pr_per_part")
    bad = _row(n=1, prepared=99)
    bad["prepared_ok"] = False
    finish_row(bad)
    assert bad["lead"] == "prepared_gpu_rows"  # a mismatch never leads
    s = summary([a, b, bad])
    assert (
        s["rows"] == 2 and s["prepared_leads"] == 1 and s["max_gain"] == 1.5 and s["host_ratio"] == (10, 10)
    )


def test_headline_and_table_line():
    line = engines.headline([_row()])
    assert line.startswith(
        "16 blocks of a 64-part cache (64 x 32 KiB blocks), host -> GPU: prepared 45.0 GB/s"
    )
    assert "0.90 of the memcpy ceiling" in line and "PR per part 30.0 GB/s (100 µs)" in line
    assert engines.headline([_row(n=1)]) is None
    text = engines.table_line(_row())
    assert text.startswith("64 x 32 KiB") and " 45.0 (   10)*" in text and text.endswith("kernel")
    partial = _row()
    del partial["swap"]
    partial["v1_pattern_ok"] = False
    text = engines.table_line(partial)
    assert "!" in text and " - " in text
    assert len(engines.table_head().split("memcpy")[1]) > 0


class _FakeBuffers:
    def __init__(self, shape, n_max, log):
        self.shape, self.blocks, self.log = shape, 2 * n_max, log
        log.append(("buffers", shape.key, n_max))

    def fill(self, seed):
        self.log.append(("fill",))

    def poison(self, direction):
        self.log.append(("poison", direction))

    def verify(self, direction, mapping):
        self.log.append(("verify", direction, len(mapping)))
        return self.log[-2] != ("call", "v1_pattern")  # the stand-in's V1 pattern copies wrong bytes


class _FakeHarness:
    def __init__(self, gpu_free=1 << 50):
        self.log, self.gpu_free = [], gpu_free

    def free_memory(self):
        return self.gpu_free, 1 << 50

    def settle(self):
        pass

    def buffers(self, shape, n_max):
        return _FakeBuffers(shape, n_max, self.log)

    def calls(self, bufs, direction, mapping):
        assert mapping.shape == (len(mapping), 2) and len(set(mapping[:, 1])) == len(mapping)

        def make(name):
            def fn():
                if name == "swap" and len(mapping) == 16:
                    raise RuntimeError("refused")
                self.log.append(("call", name))

            return fn

        return {name: make(name) for name in ("memcpy", *CONTENDERS)}

    def synchronize(self):
        pass

    def last_path(self):
        return "kernel"


def test_run_engines_measures_checks_and_reports_with_a_stand_in_gpu():
    h, rows, skipped = _FakeHarness(gpu_free=footprint(SHAPES[3], 16)[0] / 0.8), [], []
    out = engines.run_engines(
        ("vllm", "2m"),
        (1, 16, 1250),
        ("in", "out"),
        reps=6,
        harness=h,
        on_row=rows.append,
        on_skip=lambda shape, n, why: skipped.append((shape.key, n)),
    )
    assert out == rows
    assert [(r["shape"], r["direction"], r["num_blocks"]) for r in rows] == [
        ("vllm", "in", 1), ("vllm", "in", 16), ("vllm", "out", 1), ("vllm", "out", 16),
        ("2m", "in", 1), ("2m", "in", 16), ("2m", "out", 1), ("2m", "out", 16),
    ]  # fmt: skip
    assert skipped == [("vllm", 1250), ("2m", 1250)]
    assert ("buffers", "vllm", 16) in h.log and ("buffers", "2m", 16) in h.log
    for r in rows:
        assert r["v1_pattern_ok"] is False and r["prepared_ok"] is True and r["lead"] != "v1_pattern"
        assert math.isfinite(r["ceiling_gbps"]) and r["paths"]["prepared"] == "kernel"
        if r["num_blocks"] == 16:  # the contender that raised is reported, the rest measured
            assert "swap" not in r and r["swap_ok"] is False and "refused" in r["swap_error"]
        else:
            assert r["swap_ok"] is True
    # Each contender is checked after a poison and one call of its own.
    i = h.log.index(("poison", "in"))
    assert h.log[i : i + 3] == [("poison", "in"), ("call", "pr_per_part"), ("verify", "in", 1)]


# --- the command line


@pytest.fixture
def fake_engines(monkeypatch):
    seen = {}

    def fake_run(shapes=engines.SHAPE_KEYS, counts=engines.ENGINE_COUNTS, directions=("in", "out"), **kw):
        seen.update(counts=list(counts), directions=list(directions), reps=kw["reps"])
        rows = [_row(n=n, direction=d) for d in directions for n in counts]
        for r in rows:
            kw["on_row"](r)
        return rows

    monkeypatch.setattr(cli_common, "require_gpu", lambda: "fake GPU")
    monkeypatch.setattr(cli_common, "environment_lines", lambda: ["GPU 0: fake"])
    from cupy_swap.tools import bench

    monkeypatch.setattr(bench, "swapper_settings", lambda: "settings: fake")
    monkeypatch.setattr(engines, "run_engines", fake_run)

    # The adapter rows are measured by their own GPU test (test_engines_bench_gpu.py):
    # here they are only asked for, so a GPU machine does not run them in full.
    def fake_adapters(keys, counts=engines.ENGINE_COUNTS, **kw):
        seen.update(adapter_keys=list(keys), adapter_counts=list(counts))
        return []

    monkeypatch.setattr(engine_adapters, "run_adapters", fake_adapters)
    return seen


def test_bench_engines_prints_stores_and_charts(fake_engines, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    out, chart = tmp_path / "e.json", tmp_path / "e.png"
    argv = [
        "bench",
        "--engines",
        "--counts",
        "1,16",
        "--directions",
        "in",
        "--json",
        str(out),
        "--plot",
        str(chart),
    ]
    assert cli.main(argv) == cli.EXIT_OK
    assert {k: fake_engines[k] for k in ("counts", "directions", "reps")} == {
        "counts": [1, 16],
        "directions": ["in"],
        "reps": 30,
    }
    assert fake_engines["adapter_counts"] == [1, 16]
    text = capsys.readouterr().out
    assert "PR per part" in text and "V1 pattern" in text and "headline: 16 blocks" in text
    assert "prepared at or above the best engine pattern in 2 of 2 rows" in text
    report = json.loads(out.read_text())
    assert len(report["engines"]) == 2 and report["environment"] == ["GPU 0: fake", "settings: fake"]
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # And again from the stored file, without a GPU.
    replot = tmp_path / "again.svg"
    assert cli.main(["bench", "--from-json", str(out), "--plot", str(replot)]) == cli.EXIT_OK
    assert "V1 pattern" in capsys.readouterr().out and replot.read_text().lstrip().startswith("<?xml")


def test_bench_engines_defaults_to_every_count(fake_engines):
    assert cli.main(["bench", "--engines"]) == cli.EXIT_OK
    assert fake_engines["counts"] == [1, 16, 256, 1250] and fake_engines["directions"] == ["in", "out"]
    assert fake_engines["adapter_counts"] == [1, 16, 256, 1250]
    assert {k.split("-")[0] for k in fake_engines["adapter_keys"]} == {"vllm", "sglang"}


def test_a_mismatch_in_bench_engines_exits_1(fake_engines, monkeypatch):
    def fake_run(**kw):
        row = _row()
        row["v1_pattern_ok"] = False
        kw["on_row"](row)
        return [row]

    monkeypatch.setattr(engines, "run_engines", fake_run)
    assert cli.main(["bench", "--engines"]) == cli.EXIT_MISMATCH


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--engines", "--block-bytes", "4k"], "--engines cannot honour --block-bytes"),
        (["--engines", "--layers", "2"], "--engines cannot honour --layers"),
        (["--engines", "--peers", "--plot", "x.png"], "argument --plot: charts one part"),
    ],
)
def test_bench_engines_refuses_what_it_cannot_honour(argv, message, monkeypatch, capsys):
    monkeypatch.setattr(cli_common, "gpu_status", lambda: pytest.fail("looked for a GPU"))
    with pytest.raises(SystemExit) as e:
        cli.main(["bench", *argv])
    assert e.value.code == cli.EXIT_USAGE and message in capsys.readouterr().err


def test_engines_without_a_gpu_exits_3(monkeypatch, capsys):
    monkeypatch.setattr(cli_common, "gpu_status", lambda: (False, "no CUDA GPU is available (test)"))
    with pytest.raises(SystemExit) as e:
        cli.main(["bench", "--engines"])
    assert e.value.code == cli.EXIT_NO_GPU
    err = capsys.readouterr().err.strip().splitlines()
    assert "GPU" in err[0] and "Traceback" not in "\n".join(err)


def test_bench_help_lists_remote_and_main_hands_it_over(monkeypatch, capsys):
    with pytest.raises(SystemExit):
        cli.parse_args(["bench", "--help"])
    help_text = "".join(capsys.readouterr().out.split())  # argparse wraps lines, also at hyphens
    assert "--remotetransferstoanotherprocessthroughNIXL;see`cupy-swapbench--remote--help`" in help_text
    assert "--enginesswapsshapedasenginesmakethem" in help_text
    from cupy_swap.tools import remote_bench

    got = []
    monkeypatch.setattr(remote_bench, "main", lambda argv: got.append(argv) or 0)
    assert cli.main(["bench", "--remote", "--help"]) == 0 and got == [["--help"]]


def test_plot_engines_draws_a_panel_per_direction_and_shape(tmp_path):
    pytest.importorskip("matplotlib")
    rows = [
        _row(shape=s, n=n, direction=d) for s in ("vllm", "mla") for d in ("in", "out") for n in (1, 16, 256)
    ]
    rows[0]["prepared_ok"] = False  # left out of its line
    fig = plot.plot_engines(rows, str(tmp_path / "c.png"), title="GPU 0: fake")
    assert len(fig.axes) == 4
    titles = sorted(ax.get_title() for ax in fig.axes)
    assert titles[0] == "61 x 72 KiB, GPU -> host"
    first = next(ax for ax in fig.axes if ax.get_title() == "64 x 32 KiB, host -> GPU")
    lines = {line.get_label(): list(line.get_xdata()) for line in first.get_lines()}
    assert lines[engines.LABELS["prepared"]] == [16, 256] and lines[engines.LABELS["swap"]] == [1, 16, 256]
    assert (tmp_path / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_load_run_reads_engines_reports(tmp_path):
    path = tmp_path / "e.json"
    path.write_text(json.dumps({"environment": ["GPU 0: x"], "engines": [_row()]}))
    run = plot.load_run(str(path))
    assert run.kind == "engines" and run.rows[0]["shape"] == "vllm" and run.environment == ["GPU 0: x"]
    path.write_text(json.dumps({"engines": [{"shape": "vllm"}]}))
    with pytest.raises(ValueError, match="engines row 0 lacks direction, num_blocks, ceiling_gbps"):
        plot.load_run(str(path))


def test_the_part_tables_know_engines():
    assert cli_bench.PART_TAKES["--engines"] == {"counts", "directions"}
    assert "--engines" in cli_bench.PART_MEASURES


def test_markdown_table_bolds_the_lead_and_marks_mismatches():
    rows = [_row(), _row(n=256, direction="out", pr_per_part=50)]
    rows[1]["v1_pattern_ok"] = False
    lines = engines.markdown_table(rows)
    assert lines[0] == (
        "| cache | blocks | direction | memcpy | PR per part | V1 pattern | prepared | prepared, GPU rows | swap() |"
    )
    assert (
        lines[2]
        == "| 64 x 32 KiB | 16 | host -> GPU | 50.0 | 30.0 (100) | 25.0 (100) | **45.0 (10)** | 44.0 (10) | 40.0 (10) |"
    )
    assert "| **50.0 (100)** | 25.0 (100) ! |" in lines[3]
    assert engines.markdown_table(rows, keep=lambda r: r["direction"] == "in")[2:] == [lines[2]]


def test_results_page_says_what_where_and_how():
    report = {"environment": ["GPU 0: fake"], "engines": [_row(), _row(n=256, pr_per_part=50)]}
    page = engines.results_page(report, "abc1234", "python -m cupy_swap bench --engines", ["extra"])
    text = "\n".join(page)
    assert page[0] == "# bench --engines" and "commit abc1234: `python -m cupy_swap bench --engines`" in text
    assert "- GPU 0: fake" in text and "in 1 of 2 rows" in text and "Headline: 16 blocks" in text
    assert "| 64 x 32 KiB | 256 |" in text and page[-1] == "extra" and "engines_chart.png" in text


class _Dev(np.ndarray):
    """A NumPy array posing as a CuPy one: ``data.ptr``."""

    @property
    def data(self):
        return types.SimpleNamespace(ptr=self.ctypes.data)


def _splitmix(seed, out):
    i = np.arange(out.size, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = np.uint64(seed) + i * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    out[...] = z ^ (z >> np.uint64(31))


@pytest.fixture
def numpy_cupy(monkeypatch):
    """CuPy's calls that EngineBuffers makes, done by NumPy (device memory is host memory)."""
    runtime = types.SimpleNamespace(
        memcpy=lambda dst, src, n, kind: ctypes.memmove(dst, src, n),
        memcpyHostToDevice=1,
        memcpyDeviceToHost=2,
    )
    fake = types.SimpleNamespace(
        uint8=np.uint8,
        uint64=np.uint64,
        empty=lambda shape, dtype: np.empty(shape, dtype).view(_Dev),
        asarray=np.asarray,
        array_equal=np.array_equal,
        ElementwiseKernel=lambda *a: _splitmix,
        cuda=types.SimpleNamespace(
            runtime=runtime, Device=lambda: types.SimpleNamespace(synchronize=lambda: None)
        ),
    )
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setitem(sys.modules, "cupy.cuda", fake.cuda)
    monkeypatch.setitem(sys.modules, "cupy.cuda.runtime", runtime)
    monkeypatch.setattr(engines, "_FILL_KERNEL", None)
    from cupy_swap.cuda import memory

    monkeypatch.setattr(memory, "empty_pinned", lambda shape, dtype: np.empty(shape, dtype))


@pytest.mark.parametrize("host", ["separate", "pool"])
@pytest.mark.parametrize("direction", ["in", "out"])
def test_engine_buffers_fill_poison_and_verify(host, direction, numpy_cupy):
    bufs = engines.EngineBuffers(EngineShape("t", 3, 64, host, "test"), 4)
    assert bufs.blocks == 8 and len(bufs.host_parts) == len(bufs.gpu_parts) == 3
    bufs.fill(7)
    for h, m in zip(bufs.host_parts, bufs.mirror_parts):
        assert np.array_equal(h, m)  # the mirror holds what the host holds
    assert (
        len({bytes(p[b]) for p in bufs.host_parts + bufs.gpu_parts for b in range(8)}) == 48
    )  # all distinct
    mapping = np.array([[2, 5], [7, 0]])
    src, dst = bufs.sides(direction)
    assert (src, dst) == (
        (bufs.host_parts, bufs.gpu_parts) if direction == "in" else (bufs.gpu_parts, bufs.host_parts)
    )

    def swap(wrong=None, stray=None):
        bufs.poison(direction)
        assert all((p == engines.POISON).all() for p in dst)
        for p, (s, d) in enumerate(zip(src, dst)):
            d[mapping[:, 1]] = s[mapping[:, 0]]
            if wrong == p:
                d[0, 3] ^= 1
            if stray == p:
                d[6, 0] = 0
        return bufs.verify(direction, mapping)

    assert swap() is True
    assert swap(wrong=1) is False and swap(stray=2) is False
    assert swap() is True  # and a good copy after bad ones
