"""Command line behaviour that needs no GPU."""

import subprocess
import sys

import pytest

from cupy_swap.tools import cli
from cupy_swap.tools.cli import EXIT_NO_GPU, _parse_sizes, build_parser, explain_no_gpu

from .conftest import GPU_OK


def _run(*argv):
    return subprocess.run([sys.executable, "-m", "cupy_swap", *argv], capture_output=True, text=True)


def test_parse_sizes():
    assert _parse_sizes("16b,48,4k,32KiB,2m") == [16, 48, 4096, 32768, 2 << 20]
    for bad in ("foo", "4x", "0", "-4k", "1,,2", ""):
        with pytest.raises(ValueError, match="not a size"):
            _parse_sizes(bad)


def test_parser_defaults():
    args = build_parser().parse_args(["bench"])
    assert args.counts == [1, 1250] and args.block_bytes == [32768] and args.directions == ["in", "out"]
    assert args.modes == ["auto"] and args.reps == 30


def test_exit_codes_are_distinct():
    assert len({cli.EXIT_OK, cli.EXIT_MISMATCH, cli.EXIT_USAGE, EXIT_NO_GPU}) == 4
    assert cli.EXIT_USAGE == 2 and EXIT_NO_GPU == 3


# (a) a bad argument is reported by argparse (exit 2) before any GPU check, on
# any machine: with a GPU these would otherwise start a benchmark or crash in it.
@pytest.mark.parametrize(
    "argv, message",
    [
        (["bench", "--bogus"], "unrecognized arguments: --bogus"),
        (["bench", "--block-bytes", "foo"], "argument --block-bytes: 'foo' is not a size"),
        (["bench", "--counts", "1,x"], "argument --counts: 'x' is not a positive whole number"),
        (["bench", "--modes", "kernal"], "argument --modes: 'kernal' not among auto, kernel, dma, staged"),
        (["bench", "--directions", "up"], "argument --directions: 'up' not among in, out"),
        (["bench", "--reps", "0"], "argument --reps: '0' is not a positive whole number"),
        (["demo", "--reps", "many"], "argument --reps: 'many' is not a positive whole number"),
        (["calibrate", "--bogus"], "unrecognized arguments: --bogus"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
        (["bench", "--gpus", "0,x"], "argument --gpus: expected 'all' or a comma list of GPU indices"),
        (["bench", "--gpus", "1,1"], "argument --gpus: expected distinct non-negative GPU indices"),
        (
            ["bench", "--drivers", "fork"],
            "argument --drivers: 'fork' not among threads, one-thread, processes",
        ),
    ],
)
def test_bad_argument_is_reported_before_the_gpu_check(argv, message, monkeypatch):
    r = _run(*argv)
    assert r.returncode == 2, r.stderr
    assert message in r.stderr and "usage: cupy-swap" in r.stderr
    assert "needs an NVIDIA GPU" not in r.stderr and "Traceback" not in r.stderr
    # In process too, with the GPU check made to fail loudly if it were reached.
    monkeypatch.setattr(cli, "gpu_status", lambda: pytest.fail("GPU checked before the arguments"))
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2


# (b) and (d): no GPU has its own exit code, and the message does not send a
# user without a driver to upgrade one.
@pytest.mark.skipif(GPU_OK, reason="checks the no-GPU message")
@pytest.mark.parametrize("argv", [[], ["demo"], ["bench"], ["calibrate"]])
def test_without_gpu_says_so_and_exits_3(argv):
    r = _run(*argv)
    assert r.returncode == EXIT_NO_GPU, r.stderr
    assert "GPU" in r.stderr and "Traceback" not in r.stderr
    assert f"exit status {EXIT_NO_GPU}" in r.stderr
    if cli.probe_driver() is None:  # this machine has no driver at all
        assert "no NVIDIA driver found" in r.stderr
        assert "upgrade" not in r.stderr.lower() and "insufficient" not in r.stderr.lower()


@pytest.mark.skipif(GPU_OK, reason="checks the no-GPU message")
def test_info_without_gpu_exits_3():
    r = _run("info")
    assert r.returncode == EXIT_NO_GPU, r.stderr
    assert "GPU: none" in r.stdout and "upgrade" not in r.stdout.lower()


def test_no_gpu_main_exit_code_in_process(monkeypatch, capsys):
    monkeypatch.setattr(cli, "gpu_status", lambda: (False, "no CUDA GPU is available (test)"))
    monkeypatch.setattr(cli, "probe_driver", lambda: None)
    for argv in (
        [],
        ["bench", "--counts", "3"],
        ["bench", "--peers"],
        ["bench", "--host-time"],
        ["calibrate"],
    ):
        with pytest.raises(SystemExit) as e:
            cli.main(argv)
        assert e.value.code == EXIT_NO_GPU
    assert cli.main(["info"]) == EXIT_NO_GPU
    err = capsys.readouterr().err
    assert "no NVIDIA driver found" in err and "upgrade" not in err


# What the CUDA runtime says without a driver (libcuda.so.1 missing) is the
# same as for an old driver; only the driver probe tells them apart.
RUNTIME_SAYS = (
    "no CUDA GPU is available (cudaErrorInsufficientDriver: "
    "CUDA driver version is insufficient for CUDA runtime version)"
)


def test_explain_no_driver_does_not_suggest_an_upgrade():
    text = explain_no_gpu(RUNTIME_SAYS, None, 12090)
    assert "no NVIDIA driver found" in text and "libcuda.so.1" in text
    assert "upgrade" not in text.lower() and "insufficient" not in text.lower()


def test_explain_driver_too_old_suggests_an_upgrade():
    text = explain_no_gpu(RUNTIME_SAYS, {"init": 0, "version": 12020, "devices": 1}, 13000)
    assert "older than the CUDA 13.0 runtime" in text and "NVIDIA driver for CUDA 12.2" in text
    assert "upgrade the driver" in text and "cupy-swap[cuda12]" in text


def test_explain_driver_without_device():
    for driver in (
        {"init": 100, "version": 12040, "devices": None},
        {"init": 0, "version": 12040, "devices": 0},
    ):
        text = explain_no_gpu(RUNTIME_SAYS, driver, 12090)
        assert "installed but sees no GPU" in text and "upgrade" not in text


def test_explain_driver_that_does_not_start_and_other_cases():
    text = explain_no_gpu(RUNTIME_SAYS, {"init": 999, "version": 12040, "devices": None}, 12090)
    assert "does not start" in text and "999" in text and "upgrade" not in text
    missing = "CuPy is not installed (No module named 'cupy'); install cupy-swap[cuda12] or [cuda13]"
    assert explain_no_gpu(missing, None, None) == missing
    other = "no CUDA GPU is available (cudaErrorDevicesUnavailable: all CUDA-capable devices are busy)"
    assert explain_no_gpu(other, {"init": 0, "version": 12040, "devices": 1}, 12090) == other


def test_probe_driver_runs_anywhere():
    found = cli.probe_driver()
    assert found is None or set(found) == {"init", "version", "devices"}


# (c) the top-level help lists every command in plain text, and the exit codes.
def test_top_level_help_lists_commands_and_exit_codes():
    r = _run("--help")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "{demo,bench" not in out  # not argparse's brace list
    for name, line in cli.COMMANDS.items():
        assert f"  {name:<10} {line}" in out
    assert "demo runs when none is given" in out
    assert "exit status:" in out and "3  no usable NVIDIA GPU" in out and "2  bad command line" in out


@pytest.mark.parametrize("name", list(cli.COMMANDS))
def test_command_help_says_exit_codes(name):
    r = _run(name, "--help")
    assert r.returncode == 0, r.stderr
    assert cli.COMMANDS[name] in r.stdout and "3  no usable NVIDIA GPU" in r.stdout


def test_readme_states_the_demo_footprint_and_exit_codes():
    import inspect
    from pathlib import Path

    from cupy_swap.tools.bench import CaseBuffers

    # demo_footprint mirrors CaseBuffers: a cache of 2 x N blocks per side plus an N-block buffer.
    assert inspect.signature(CaseBuffers).parameters["spare"].default == 2
    assert cli.demo_footprint() == (2 * 1250 + 1250) * 32768
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    main_job = readme.split("## The main job", 1)[1].split("\n## ", 1)[0]
    mb = f"{cli.demo_footprint() / 1e6:.0f} MB"
    assert f"{mb} of pinned host memory and {mb} of GPU memory" in main_job
    assert f"**{EXIT_NO_GPU} no usable GPU**" in main_job and "2 a bad command line" in main_job


def _fake_row(case, mode):
    return {
        "direction": case.direction,
        "block_bytes": case.block_bytes,
        "num_blocks": case.num_blocks,
        "parts": case.parts,
        "contiguous": case.contiguous,
        "mode": mode,
        "path": "kernel",
        "gbps": 1.0,
        "ceiling_gbps": 2.0,
        "ratio": 0.5,
        "device_ratio": 0.5,
        "latency_s": 1e-3,
        "verified": True,
    }


def test_bench_passes_parsed_arguments_on(monkeypatch, tmp_path, capsys):
    """The parsed lists reach the cases (CPU: the measuring functions are stubbed)."""
    seen = []

    def fake_run_case(case, *, max_ctas=None, reps=30, baseline=True, mode="auto"):
        seen.append((case.direction, case.block_bytes, case.num_blocks, case.parts, mode, reps, max_ctas))
        return _fake_row(case, mode)

    monkeypatch.setattr(cli, "_require_gpu", lambda: "fake GPU")
    monkeypatch.setattr(cli, "environment_lines", lambda: ["GPU 0: fake"])
    monkeypatch.setattr(cli, "swapper_settings", lambda: "settings: fake")
    monkeypatch.setattr(cli, "run_case", fake_run_case)
    out = tmp_path / "b.json"
    argv = ["bench", "--block-bytes", "4k,2m", "--counts", "3", "--directions", "out"]
    argv += ["--modes", "kernel,dma", "--layers", "2", "--reps", "5", "--max-ctas", "4", "--json", str(out)]
    assert cli.main(argv) == cli.EXIT_OK
    assert seen == [
        ("out", 4096, 3, 2, "kernel", 5, 4),
        ("out", 4096, 3, 2, "dma", 5, 4),
        ("out", 2 << 20, 3, 2, "kernel", 5, 4),
        ("out", 2 << 20, 3, 2, "dma", 5, 4),
    ]
    assert "ratio" in capsys.readouterr().out and out.exists()

    bidir = []
    monkeypatch.setattr(cli, "run_bidir", lambda b, n, **kw: bidir.append((b, n)) or _bidir_row(b))
    assert cli.main(["bench", "--bidir", "--bidir-blocks", "16", "--block-bytes", "8k"]) == cli.EXIT_OK
    assert bidir == [(8192, 16)] * 3


def _bidir_row(block_bytes):
    return {
        "block_bytes": block_bytes,
        "paths": ["kernel", "kernel"],
        "verified": True,
        "gbps": 1.0,
        "ceiling_gbps": 2.0,
        "ratio": 0.5,
        "sustained_gbps": 1.0,
        "sustained_ceiling_gbps": 2.0,
        "sustained_ratio": 0.5,
    }
