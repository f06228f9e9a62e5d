"""``bench --captured`` on the CPU: its options and refusals (exit 2, one
line, before any GPU is looked for), the rows reaching the table, the JSON
report and the exit status (the measuring stubbed), the table and summary
of made-up rows, the turns of the timing, and the bit-for-bit comparison."""

from __future__ import annotations

import json

import numpy as np
import pytest

from cupy_swap.tools import bench, captured_bench, cli, cli_bench, cli_common
from cupy_swap.tools.captured_bench import best_in_turns, rows_match, summary, summary_line, table_line


def _row(shape="vllm", n=16, direction="in", replay=100.0, eager=100.0, replay_ok=True, eager_ok=True):
    return {
        "shape": shape,
        "num_blocks": n,
        "direction": direction,
        "replay_us": replay,
        "eager_us": eager,
        "ratio": replay / eager,
        "replay_ok": replay_ok,
        "eager_ok": eager_ok,
        "replay_failures": [],
    }


@pytest.fixture
def no_gpu(monkeypatch):
    """Fail loudly should anything look for a GPU or measure."""
    monkeypatch.setattr(cli_common, "gpu_status", lambda: pytest.fail("looked for a GPU"))
    monkeypatch.setattr(cli_common, "require_gpu", lambda: pytest.fail("looked for a GPU"))
    monkeypatch.setattr(captured_bench, "run_captured", lambda *a, **k: pytest.fail("measured"))


@pytest.fixture
def fake_run(monkeypatch):
    """A GPU whose captured measurements are stubbed; returns what the run was asked."""
    seen = {}

    def run(counts=captured_bench.COUNTS, directions=("in", "out"), *, replays, on_row, on_skip, **kw):
        seen.update(counts=list(counts), directions=list(directions), replays=replays)
        on_skip(captured_bench._shape("mla"), 99, "does not fit")
        rows = [_row(n=n, direction=d) for d in directions for n in counts]
        for r in rows:
            on_row(r)
        return rows

    monkeypatch.setattr(cli_common, "require_gpu", lambda: "fake GPU")
    monkeypatch.setattr(cli_common, "environment_lines", lambda: ["GPU 0: fake"])
    monkeypatch.setattr(bench, "swapper_settings", lambda: "settings: fake")
    monkeypatch.setattr(captured_bench, "run_captured", run)
    return seen


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["--block-bytes", "4k"],
            "--captured cannot honour --block-bytes (it measures its own engine shapes",
        ),
        (["--layers", "2"], "--captured cannot honour --layers"),
        (["--modes", "kernel,dma"], "--captured cannot honour --modes"),
        (["--contiguous", "--max-ctas", "4"], "--captured cannot honour --contiguous, --max-ctas"),
        (["--no-baseline"], "--captured cannot honour --no-baseline"),
        (["--plot", "x.png"], "argument --plot: charts the measurements of --peers or --engines"),
        (["--bidir-blocks", "8"], "argument --bidir-blocks: applies to --bidir only"),
        (["--counts", "0"], "argument --counts: '0' is not a positive whole number"),
        (["--directions", "up"], "argument --directions: 'up' not among in, out"),
    ],
)
def test_refuses_what_it_cannot_honour(argv, message, no_gpu, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["bench", "--captured", *argv])
    assert e.value.code == cli.EXIT_USAGE
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(errors) == 1 and errors[0].startswith(f"cupy-swap bench: error: {message}")


def test_from_json_refuses_captured(tmp_path, no_gpu, capsys):
    stored = tmp_path / "e.json"
    stored.write_text(json.dumps({"peers": [{"direction": "in", "block_bytes": 1, "num_blocks": 1}]}))
    with pytest.raises(SystemExit) as e:
        cli.main(["bench", "--from-json", str(stored), "--captured"])
    assert e.value.code == cli.EXIT_USAGE


def test_the_part_tables_know_captured():
    assert cli_bench.PART_TAKES["--captured"] == {"counts", "directions"}
    assert "--captured" in cli_bench.PART_MEASURES
    assert cli.parse_args(["bench", "--captured"]).captured
    assert not cli.parse_args(["bench"]).captured


def test_help_lists_captured(capsys):
    with pytest.raises(SystemExit):
        cli.parse_args(["bench", "--help"])
    text = "".join(capsys.readouterr().out.split())  # argparse wraps lines
    assert "--captureddevicetimeofonereplayofaswapcapturedintoaCUDAgraph" in text
    assert "--captured--jsoncaptured.json" in text


def test_defaults_and_table(fake_run, capsys):
    assert cli.main(["bench", "--captured"]) == cli.EXIT_OK
    assert fake_run == {"counts": [16, 256], "directions": ["in", "out"], "replays": 200}
    out = capsys.readouterr().out
    assert captured_bench.table_head() in out and "left out: does not fit" in out
    assert table_line(_row(n=256, direction="out")) in out
    assert out.rstrip().splitlines()[-1] == summary_line([_row()] * 4)
    assert "in 4 of 4 rows at n >= 16" in out


def test_options_reach_the_run_and_the_json(fake_run, tmp_path, capsys):
    out = tmp_path / "c.json"
    argv = [
        "bench",
        "--captured",
        "--counts",
        "16",
        "--directions",
        "out",
        "--reps",
        "50",
        "--json",
        str(out),
    ]
    assert cli.main(argv) == cli.EXIT_OK
    assert fake_run == {"counts": [16], "directions": ["out"], "replays": 50}
    report = json.loads(out.read_text())
    assert report["captured"] == [_row(direction="out")] and report["environment"][0] == "GPU 0: fake"


@pytest.mark.parametrize("bad", ["replay_ok", "eager_ok"])
def test_a_mismatch_exits_1(bad, fake_run, monkeypatch):
    def run(**kw):
        row = _row()
        row[bad] = False
        kw["on_row"](row)
        return [row]

    monkeypatch.setattr(captured_bench, "run_captured", run)
    assert cli.main(["bench", "--captured"]) == cli.EXIT_MISMATCH


def test_without_a_gpu_exits_3(monkeypatch, capsys):
    monkeypatch.setattr(cli_common, "gpu_status", lambda: (False, "no CUDA GPU is available (test)"))
    with pytest.raises(SystemExit) as e:
        cli.main(["bench", "--captured"])
    assert e.value.code == cli.EXIT_NO_GPU
    assert "GPU" in capsys.readouterr().err


def test_table_line_marks_failed_checks():
    assert table_line(_row(replay=123.456, eager=120.0)) == (
        "64 x 32 KiB          16  in      123.5       120.0         1.029"
    )
    line = table_line(_row(shape="2m", n=256, direction="out", replay_ok=False))
    assert line.startswith("1 x 2 MiB           256 out      100.0!      100.0 ")
    assert table_line(_row(shape="mla", eager_ok=False)).endswith("100.0!        1.000")
    head = captured_bench.table_head()
    assert len(head) == len(line) and head.index("replay µs") + 9 == line.index("100.0!") + 5


def test_summary_counts_matched_rows_within_5_percent_at_16_blocks_or_more():
    rows = [
        _row(n=1, replay=300.0),  # below 16 blocks: not counted
        _row(n=16, replay=105.0),  # 1.05: within
        _row(n=16, replay=106.0),  # 1.06: not
        _row(n=256, replay=50.0),  # faster: within
        _row(n=256, replay_ok=False),  # bytes differ: not
        _row(n=256, eager_ok=False),  # the eager call's check is not the replay's
    ]
    assert summary(rows) == (3, 5)
    assert summary_line(rows) == (
        "replay within 5 % of eager (replay/eager <= 1.05, bytes matched) in 3 of 5 rows at n >= 16"
    )
    assert summary([]) == (0, 0)


def test_best_in_turns_alternates_and_keeps_each_fastest_round():
    order = []
    figures = {"replay": iter([3.0, 1.0, 2.0]), "eager": iter([2.0, 5.0, 4.0])}

    def batch(name):
        return lambda: order.append(name) or next(figures[name])

    best = best_in_turns({name: batch(name) for name in figures}, rounds=3)
    assert best == {"replay": 1.0, "eager": 2.0}
    assert order == ["replay", "eager"] * 3


def test_rows_match_compares_every_part_bit_for_bit(rng):
    src = [rng.integers(0, 256, (8, 16), dtype=np.uint8) for _ in range(3)]
    dst = [np.zeros((8, 16), np.uint8) for _ in range(3)]
    mapping = np.array([[0, 5], [3, 1], [7, 2]], np.int64)
    for s, d in zip(src, dst):
        d[mapping[:, 1]] = s[mapping[:, 0]]
    assert rows_match(src, dst, mapping)
    dst[2][1, 15] ^= 1  # one bit of one row of the last part
    assert not rows_match(src, dst, mapping)
