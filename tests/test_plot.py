"""``bench --plot`` and ``bench --from-json``, and the bench's refusals of
options it cannot honour: all on the CPU (measurements are stubbed)."""

import json
import os
import sys

import pytest

from cupy_swap.tools import bench, cli, cli_bench, cli_common, peers, plot
from cupy_swap.tools.peers import CONTENDER_COLUMNS, CONTENDER_LABELS, CONTENDERS, PEER_CASES

from .fakes import case_row

pytest.importorskip("matplotlib", reason="the test extra brings matplotlib")

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
ENVIRONMENT = ["GPU 0: Fake GPU, 1 SMs", "PCIe link: Gen5 x16 (max Gen5 x16), driver 1.0"]


def _peers_row(direction, block_bytes, num_blocks):
    """A row as run_peers_case returns it (and --peers --json stores it)."""
    row = {
        "direction": direction,
        "block_bytes": block_bytes,
        "num_blocks": num_blocks,
        "contiguous": False,
        "bytes": block_bytes * num_blocks,
        "ceiling_gbps": 50.0,
    }
    for i, name in enumerate(CONTENDERS):
        row[name] = 10.0 + i
        row[name + "_ok"] = True
    row.update(path="kernel", batch_api="cuMemcpyBatchAsync", lead=CONTENDERS[-1])
    return row


def _rows(directions=("in", "out"), sizes=(4096, 32768), counts=(1, 16)):
    return [_peers_row(d, b, n) for d in directions for b in sizes for n in counts]


def _write_report(path, rows):
    report = {"environment": ENVIRONMENT, "page": "page", "argv": ["bench", "--peers"], "peers": rows}
    path.write_text(json.dumps(report, indent=1))
    return str(path)


@pytest.fixture
def no_gpu(monkeypatch):
    """Fail loudly should anything look for a GPU or measure."""
    monkeypatch.setattr(cli_common, "gpu_status", lambda: pytest.fail("looked for a GPU"))
    monkeypatch.setattr(cli_common, "require_gpu", lambda: pytest.fail("looked for a GPU"))
    monkeypatch.setattr(peers, "run_peers_case", lambda *a, **k: pytest.fail("measured"))
    monkeypatch.setattr(bench, "run_case", lambda *a, **k: pytest.fail("measured"))


@pytest.fixture
def fake_gpu(monkeypatch):
    """A GPU whose peers measurements are stubbed; returns the cases run."""
    seen = []

    def fake_run_peers_case(case, *, reps=20, seed=0, max_ctas=None):
        seen.append((case.direction, case.block_bytes, case.num_blocks, max_ctas))
        return _peers_row(case.direction, case.block_bytes, case.num_blocks)

    monkeypatch.setattr(cli_common, "require_gpu", lambda: "fake GPU")
    monkeypatch.setattr(cli_common, "environment_lines", lambda: list(ENVIRONMENT))
    monkeypatch.setattr(bench, "swapper_settings", lambda: "settings: fake")
    monkeypatch.setattr(peers, "run_peers_case", fake_run_peers_case)
    return seen


def _lines(ax):
    return {line.get_label(): line for line in ax.get_lines()}


def test_plot_peers_draws_one_panel_per_direction_and_count(tmp_path):
    out = tmp_path / "chart.png"
    fig = plot.plot_peers(_rows(), str(out), title="GPU 0: Fake GPU")
    assert out.read_bytes()[:8] == PNG_SIGNATURE
    assert [ax.get_title() for ax in fig.axes] == [
        "host -> GPU, 1 block",
        "host -> GPU, 16 blocks",
        "GPU -> host, 1 block",
        "GPU -> host, 16 blocks",
    ]
    for ax in fig.axes:
        lines = _lines(ax)
        assert list(lines) == [CONTENDER_LABELS[n] for n in CONTENDERS] + [plot.CEILING_LABEL]
        assert all(list(line.get_xdata()) == [4096, 32768] for line in lines.values())
        assert ax.get_xscale() == "log"
        assert [t.get_text() for t in ax.get_xticklabels()] == ["4 KiB", "32 KiB"]
    (legend,) = fig.legends
    assert [t.get_text() for t in legend.get_texts()] == list(_lines(fig.axes[0]))
    assert "GPU 0: Fake GPU" in fig._suptitle.get_text()


def test_plot_leaves_out_mismatches_and_missing_panels(tmp_path):
    rows = _rows(directions=("in",), counts=(1, 16)) + _rows(directions=("out",), counts=(16,))
    rows[0]["cupy_swap_ok"] = False  # in, 4 KiB x 1: its speed means nothing
    for row in rows:
        del row["cupy_swap_prepared"], row["cupy_swap_prepared_ok"]  # an older report
    fig = plot.plot_peers(rows, str(tmp_path / "chart.svg"))
    assert (tmp_path / "chart.svg").read_text().lstrip().startswith("<?xml")
    assert len(fig.axes) == 3  # no panel for out x 1 block
    first = _lines(fig.axes[0])
    assert len(first) == len(CONTENDERS)  # the prepared op's line is absent, the ceiling present
    assert list(first[CONTENDER_LABELS["cupy_swap"]].get_xdata()) == [32768]


def test_size_label_and_panel_title():
    assert [plot.size_label(n) for n in (48, 4096, 3 << 19, 2 << 20)] == ["48 B", "4 KiB", "1.5 MiB", "2 MiB"]
    assert plot.panel_title("out", 1250) == "GPU -> host, 1250 blocks"


def test_from_json_prints_and_plots_without_a_gpu(tmp_path, no_gpu, capsys):
    stored = _write_report(tmp_path / "peers.json", _rows())
    out = tmp_path / "chart.png"
    assert cli.main(["bench", "--from-json", stored, "--plot", str(out)]) == cli.EXIT_OK
    assert out.read_bytes()[:8] == PNG_SIGNATURE
    text = capsys.readouterr().out
    assert ENVIRONMENT[0] in text and f"chart: {out}" in text
    assert all(CONTENDER_COLUMNS[n] in text for n in CONTENDERS) and "seed" not in text


def test_peers_measures_stores_and_plots_then_replots(tmp_path, fake_gpu, capsys):
    """The JSON that --peers writes is the JSON --from-json reads."""
    stored, first, again = tmp_path / "peers.json", tmp_path / "a.png", tmp_path / "b.png"
    argv = ["bench", "--peers", "--json", str(stored), "--plot", str(first), "--max-ctas", "4"]
    assert cli.main(argv) == cli.EXIT_OK
    assert fake_gpu == [(c.direction, c.block_bytes, c.num_blocks, 4) for c in PEER_CASES]
    assert first.read_bytes()[:8] == PNG_SIGNATURE
    assert len(json.loads(stored.read_text())["peers"]) == len(PEER_CASES)
    assert cli.main(["bench", "--from-json", str(stored), "--plot", str(again)]) == cli.EXIT_OK
    assert again.read_bytes()[:8] == PNG_SIGNATURE
    fig = plot.plot_peers(plot.load_run(str(stored)).rows)
    assert len(fig.axes) == 6 and all(len(ax.get_lines()) == len(CONTENDERS) + 1 for ax in fig.axes)


def test_peers_honours_counts_block_bytes_and_directions(fake_gpu):
    argv = ["bench", "--peers", "--counts", "3,5", "--block-bytes", "8k", "--directions", "out"]
    assert cli.main(argv) == cli.EXIT_OK
    assert fake_gpu == [("out", 8192, 3, None), ("out", 8192, 5, None)]
    fake_gpu.clear()
    assert cli.main(["bench", "--peers", "--block-bytes", "1m"]) == cli.EXIT_OK  # counts: the default grid
    assert fake_gpu == [(d, 1 << 20, n, None) for d in ("in", "out") for n in (1, 16, 1250)]


def test_bidir_runs_every_block_size(fake_gpu, monkeypatch):
    seen = []

    def fake_run_bidir(block_bytes, n, **kw):
        seen.append((block_bytes, n))
        return {
            "block_bytes": block_bytes,
            "paths": ["kernel", "kernel"],
            "verified": True,
            **dict.fromkeys(("gbps", "ceiling_gbps", "ratio", "sustained_gbps"), 1.0),
            **dict.fromkeys(("sustained_ceiling_gbps", "sustained_ratio"), 1.0),
        }

    monkeypatch.setattr(bench, "run_bidir", fake_run_bidir)
    assert cli.main(["bench", "--bidir", "--block-bytes", "4k,8k", "--bidir-blocks", "7"]) == cli.EXIT_OK
    assert seen == [(4096, 7)] * 3 + [(8192, 7)] * 3


def test_host_time_honours_counts(fake_gpu, monkeypatch):
    seen = []
    monkeypatch.setattr(
        bench,
        "run_host_time",
        lambda counts, reps: seen.append(list(counts)) or {"memcpy_us": 1.0, "rows": []},
    )
    assert cli.main(["bench", "--host-time", "--counts", "2,4"]) == cli.EXIT_OK
    assert cli.main(["bench", "--host-time"]) == cli.EXIT_OK
    assert seen == [[2, 4], [1, 16, 1250]]


def test_wide_sweep_honours_directions_and_goals_still_parses(fake_gpu, monkeypatch):
    seen = []

    def fake_run_case(case, *, max_ctas=None, reps=30, baseline=True, mode="auto"):
        seen.append(case.direction)
        return case_row(case, mode)

    monkeypatch.setattr(bench, "run_case", fake_run_case)
    assert cli.main(["bench", "--sweep", "wide", "--directions", "in", "--no-baseline"]) == cli.EXIT_OK
    assert seen == ["in"] * len(cli_bench._wide_cases(["in"])) and len(seen) == 15
    assert cli.parse_args(["bench", "--sweep", "goals"]).sweep == "wide"


# Usage errors: exit 2 with the bench's usage line, before any GPU is looked for.
@pytest.mark.parametrize(
    "argv, message",
    [
        (["--peers", "--layers", "2"], "--peers cannot honour --layers (it measures one part"),
        (["--peers", "--modes", "kernel"], "--peers cannot honour --modes"),
        (["--bidir", "--counts", "4"], "--bidir cannot honour --counts"),
        (["--bidir", "--layers", "2", "--modes", "dma"], "--bidir cannot honour --layers, --modes"),
        (["--bidir", "--directions", "in"], "--bidir cannot honour --directions"),
        (["--gpus", "all", "--counts", "4"], "--gpus cannot honour --counts"),
        (["--with-gemm", "--block-bytes", "4k"], "--with-gemm cannot honour --block-bytes"),
        (["--host-time", "--directions", "out"], "--host-time cannot honour --directions"),
        (["--sweep", "wide", "--counts", "4"], "--sweep wide cannot honour --counts"),
        (["--gpu-blocks", "8"], "argument --gpu-blocks: applies to --gpus only"),
        (["--peers", "--bidir-rounds", "3"], "argument --bidir-rounds: applies to --bidir only"),
        (["--plot", "out.png"], "argument --plot: charts the measurements of --peers"),
        (
            ["--peers", "--plot", "out.gif"],
            "argument --plot: expected a file name ending in .png, .svg or .pdf",
        ),
        (["--peers", "--plot", "/no/such/dir/out.png"], "argument --plot: expected an existing directory"),
        (["--from-json", "/no/such/file.json"], "argument --from-json: cannot read '/no/such/file.json'"),
        (["--sweep", "seed"], "argument --sweep: expected wide, got 'seed'"),
    ],
)
def test_usage_errors_exit_2_before_measuring(argv, message, no_gpu, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["bench", *argv])
    assert e.value.code == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert "usage: cupy-swap bench [-h]" in err and f"cupy-swap bench: error: {message}" in err


def test_from_json_refuses_measuring_options(tmp_path, no_gpu, capsys):
    stored = _write_report(tmp_path / "peers.json", _rows())
    with pytest.raises(SystemExit) as e:
        cli.main(["bench", "--from-json", stored, "--peers", "--counts", "3", "--json", str(tmp_path / "x")])
    assert e.value.code == cli.EXIT_USAGE
    assert "measures nothing; leave out --counts, --json, --peers" in capsys.readouterr().err


@pytest.mark.parametrize(
    "content, message",
    [
        ("not json", "is not one"),
        ('{"results": []}', 'has no "peers" rows'),
        ('{"peers": [{"direction": "in"}]}', "peers row 0 lacks block_bytes, num_blocks, ceiling_gbps"),
        (
            '{"peers": [{"direction": "up", "block_bytes": 1, "num_blocks": 1, "ceiling_gbps": 1}]}',
            "has direction 'up'",
        ),
        ('{"peers": [{"direction": "in", "block_bytes": 1, "num_blocks": 1, "ceiling_gbps": 1}]}', "none of"),
    ],
)
def test_from_json_checks_the_file(content, message, tmp_path, no_gpu, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    with pytest.raises(SystemExit) as e:
        cli.main(["bench", "--from-json", str(bad)])
    assert e.value.code == cli.EXIT_USAGE
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("measure", [True, False])
def test_plot_without_matplotlib_is_a_usage_error(measure, tmp_path, no_gpu, monkeypatch, capsys):
    stored = _write_report(tmp_path / "peers.json", _rows())
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError
    source = ["--peers"] if measure else ["--from-json", stored]
    with pytest.raises(SystemExit) as e:
        cli.main(["bench", *source, "--plot", str(tmp_path / "out.png")])
    assert e.value.code == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert "argument --plot: needs matplotlib" in err and "pip install matplotlib" in err
    assert not (tmp_path / "out.png").exists()


def test_plot_into_an_unwritable_directory_is_a_usage_error(tmp_path, no_gpu, monkeypatch, capsys):
    locked = tmp_path / "locked"
    locked.mkdir()
    monkeypatch.setattr(os, "access", lambda path, mode: False)  # root may write anywhere: stand in
    with pytest.raises(SystemExit) as e:
        cli.main(["bench", "--peers", "--plot", str(locked / "out.png")])
    assert e.value.code == cli.EXIT_USAGE
    assert "argument --plot: expected a writable directory" in capsys.readouterr().err


def test_plot_that_cannot_be_written_at_the_end_is_kept(tmp_path, fake_gpu, monkeypatch, capsys):
    """The directory goes away during the run: the chart lands in a temporary file."""
    out_dir, spare_dir = tmp_path / "out", tmp_path / "spare"
    out_dir.mkdir()
    spare_dir.mkdir()
    monkeypatch.setattr(cli_common.tempfile, "tempdir", str(spare_dir))
    fake = peers.run_peers_case

    def measure_then_remove(case, **kw):
        if out_dir.exists():
            out_dir.rmdir()
        return fake(case, **kw)

    monkeypatch.setattr(peers, "run_peers_case", measure_then_remove)
    assert cli.main(["bench", "--peers", "--counts", "1", "--plot", str(out_dir / "c.png")]) == cli.EXIT_OK
    (spare,) = spare_dir.glob("cupy_swap-chart-*.png")
    assert spare.read_bytes()[:8] == PNG_SIGNATURE
    assert str(spare) in capsys.readouterr().err


@pytest.mark.parametrize("command", [None, *cli.COMMANDS])
def test_help_has_no_internal_words(command, capsys):
    with pytest.raises(SystemExit) as e:
        cli.parse_args([command, "--help"] if command else ["--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out.lower()
    for word in ("seed", "issue", "nvidia-h200", "goals"):
        assert word not in text, word


def test_table_headers_have_no_internal_words(capsys):
    cli_bench._print_peers_legend()
    print(cli_bench._peers_head(), cli_bench.TABLE_HEAD)
    text = capsys.readouterr().out.lower()
    assert "seed" not in text and "issue" not in text
    assert set(CONTENDER_LABELS) == set(CONTENDER_COLUMNS) == set(CONTENDERS)
