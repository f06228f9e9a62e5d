"""Command line behaviour that needs no GPU."""

import argparse
import json
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from cupy_swap.cuda import availability
from cupy_swap.tools import bench, cli, cli_bench, cli_common, cli_demo, node
from cupy_swap.tools.cli import EXIT_NO_GPU, build_parser
from cupy_swap.tools.cli_common import parse_sizes as _parse_sizes

from .fakes import case_row
from .gpu_helpers import GPU_OK

README = Path(__file__).resolve().parents[1] / "README.md"


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


def test_exit_codes_are_distinct_and_usage_is_argparses():
    assert len({cli.EXIT_OK, cli.EXIT_MISMATCH, cli.EXIT_USAGE, EXIT_NO_GPU}) == 4
    # argparse exits with its own status on a bad command line: EXIT_USAGE must be it.
    with pytest.raises(SystemExit) as e:
        argparse.ArgumentParser().parse_args(["--bogus"])
    assert e.value.code == cli.EXIT_USAGE


# (a) a bad argument is reported by argparse (exit 2) before any GPU check, on
# any machine: with a GPU these would otherwise start a benchmark or crash in it.
# The usage line is the command's own (the demo's for options without a command).
@pytest.mark.parametrize(
    "argv, message",
    [
        (["--reps", "0"], "argument --reps: '0' is not a positive whole number"),
        (["--block-bytes", "4k"], "unrecognized arguments: --block-bytes 4k"),
        (
            ["bench", "--json", "/no/such/dir/out.json"],
            "argument --json: expected an existing directory for '/no/such/dir/out.json', "
            "but '/no/such/dir' does not exist",
        ),
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
def test_bad_argument_is_reported_before_the_gpu_check(argv, message, monkeypatch, capsys):
    command = argv[0] if argv[0] in cli.COMMANDS else "demo"
    usage = "usage: {} [-h]" if argv[0] == "frobnicate" else "usage: {} " + command + " [-h]"
    r = _run(*argv)
    assert r.returncode == 2, r.stderr
    assert message in r.stderr and usage.format("python -m cupy_swap") in r.stderr
    assert f"python -m cupy_swap{'' if argv[0] == 'frobnicate' else ' ' + command}: error: " in r.stderr
    assert "needs an NVIDIA GPU" not in r.stderr and "Traceback" not in r.stderr
    # In process too, with the GPU check made to fail loudly if it were reached.
    monkeypatch.setattr(cli_common, "gpu_status", lambda: pytest.fail("GPU checked before the arguments"))
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2
    assert usage.format("cupy-swap") in capsys.readouterr().err


# (b) and (d): no GPU has its own exit code, and the message does not send a
# user without a driver to upgrade one.
@pytest.mark.skipif(GPU_OK, reason="checks the no-GPU message")
@pytest.mark.parametrize(
    "argv",
    [[], ["demo"], ["bench"], ["calibrate"]]
    + [["bench", *mode.split()] for mode in ("--peers", "--engines", "--bidir", "--gpus all", "--host-time")]
    + [["bench", "--with-gemm"], ["bench", "--sweep", "wide"]],
)
def test_without_gpu_says_so_and_exits_3(argv):
    r = _run(*argv)
    assert r.returncode == EXIT_NO_GPU, r.stderr
    assert "GPU" in r.stderr and "Traceback" not in r.stderr and r.stderr.count("\n") == 1  # one line
    assert f"exit status {EXIT_NO_GPU}" in r.stderr
    if availability.probe_driver() is None:  # this machine has no driver at all
        assert "no NVIDIA driver found" in r.stderr
        assert "upgrade" not in r.stderr.lower() and "insufficient" not in r.stderr.lower()


@pytest.mark.skipif(GPU_OK, reason="checks the no-GPU message")
def test_info_without_gpu_exits_3():
    r = _run("info")
    assert r.returncode == EXIT_NO_GPU, r.stderr
    # The diagnosis goes to stderr, as every other command's; the version line stays on stdout.
    assert r.stdout.startswith("cupy_swap ") and "GPU" not in r.stdout
    assert r.stderr.startswith("cupy_swap: GPU: none (") and "upgrade" not in r.stderr.lower()


def test_no_gpu_main_exit_code_in_process(monkeypatch, capsys):
    monkeypatch.setattr(cli_common, "gpu_status", lambda: (False, "no CUDA GPU is available (test)"))
    monkeypatch.setattr(availability, "probe_driver", lambda: None)
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


def test_the_command_line_says_blocks_and_one_reference():
    """The README says "blocks"; so does every help text.  The table bench
    prints by default is its "default table", so that "reference" is left to
    nothing but the kernel it is compared with."""
    texts = [_run("--help").stdout] + [_run(name, "--help").stdout for name in cli.COMMANDS]
    for text in texts:
        assert not re.search(r"\bpages?\b", text), text
        assert "reference table" not in text
    assert "vLLM pull request 11531" in texts[1 + list(cli.COMMANDS).index("bench")]
    assert cli_demo.BLOCK_TEXT.startswith("block = ")


@pytest.mark.parametrize("name", list(cli.COMMANDS))
def test_command_help_says_exit_codes(name):
    r = _run(name, "--help")
    assert r.returncode == 0, r.stderr
    assert cli.COMMANDS[name] in r.stdout and "3  no usable NVIDIA GPU" in r.stdout


@pytest.mark.parametrize("direction", ["out", "in"])
def test_demo_footprint_is_what_the_demo_allocates(direction, monkeypatch):
    """The footprint the demo prints is the bytes CaseBuffers allocates for
    the demo's case on each side (counted with stand-in allocators)."""
    host, gpu = [], []

    def allocate(where):
        return lambda shape, dtype: where.append(np.empty(shape, dtype)) or where[-1]

    monkeypatch.setattr(bench.memory, "empty_pinned", allocate(host))
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(empty=allocate(gpu), uint8=np.uint8))
    monkeypatch.setattr(bench, "fill_random", lambda a, rng: None)
    bench.CaseBuffers(
        bench.SwapCase(direction, cli_demo.BLOCK_BYTES, cli_demo.DEMO_BLOCKS), np.random.default_rng(0)
    )
    assert sum(a.nbytes for a in host) == sum(a.nbytes for a in gpu) == cli_demo.demo_footprint()


def test_bench_passes_parsed_arguments_on(monkeypatch, tmp_path, capsys):
    """The parsed lists reach the cases (CPU: the measuring functions are stubbed)."""
    seen = _stub_measurements(monkeypatch)
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
    monkeypatch.setattr(bench, "run_bidir", lambda b, n, **kw: bidir.append((b, n)) or _bidir_row(b))
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


def _stub_measurements(monkeypatch, *, devices=1):
    """A machine with ``devices`` GPUs whose measurements are stubbed; returns
    the list of run_case calls (direction, block_bytes, num_blocks, parts,
    mode, reps, max_ctas)."""
    seen = []

    def fake_run_case(case, *, max_ctas=None, reps=30, baseline=True, mode="auto"):
        seen.append((case.direction, case.block_bytes, case.num_blocks, case.parts, mode, reps, max_ctas))
        return case_row(case, mode)

    monkeypatch.setattr(cli_common, "require_gpu", lambda: "fake GPU")
    monkeypatch.setattr(cli_common, "device_count", lambda: devices)
    monkeypatch.setattr(cli_common, "environment_lines", lambda: ["GPU 0: fake"])
    monkeypatch.setattr(bench, "swapper_settings", lambda: "settings: fake")
    monkeypatch.setattr(bench, "run_case", fake_run_case)
    return seen


# Item: options without a command are the demo's (the bare command runs the demo).
def test_options_without_a_command_are_the_demos(monkeypatch, capsys):
    seen = _stub_measurements(monkeypatch)
    assert cli.main(["--reps", "5"]) == cli.EXIT_OK
    assert [(d, n, reps) for d, _, n, _, _, reps, _ in seen] == [("out", 1250, 5), ("in", 1250, 5)]
    assert "bit-exact: yes" in capsys.readouterr().out
    args = cli.parse_args([])
    assert args.command == "demo" and args.reps == 30


def test_top_level_options_stay_top_level(capsys):
    for argv in (["--version"], ["--vers"]):
        with pytest.raises(SystemExit) as e:
            cli.parse_args(argv)
        assert e.value.code == 0 and capsys.readouterr().out.startswith("cupy_swap ")
    for argv in (["-h"], ["--help"]):
        with pytest.raises(SystemExit) as e:
            cli.parse_args(argv, prog="cupy-swap")
        out = capsys.readouterr().out
        assert e.value.code == 0 and "usage: cupy-swap [-h] [--version] [COMMAND] [options]" in out
        assert "`cupy-swap --reps 5`" in out and "`cupy-swap COMMAND --help`" in out


def _readme_commands() -> list[list[str]]:
    """Every ``python -m cupy_swap ...`` command of the README, inline (which may
    wrap lines; also as ``cupy-swap ...``) or in a code block (up to a ``#`` comment)."""
    text = README.read_text()
    found = [" ".join(m.split()) for m in re.findall(r"`(?:python -m cupy_swap|cupy-swap)\b([^`]*)`", text)]
    found += [m.strip() for m in re.findall(r"^python -m cupy_swap\b([^#\n]*)", text, flags=re.M)]
    return [cmd.split() for cmd in found]


def test_readme_commands_parse(monkeypatch):
    commands = _readme_commands()
    assert commands, "found no python -m cupy_swap command in README.md"
    monkeypatch.setattr(cli_common, "gpu_status", lambda: pytest.fail("parsing looked for a GPU"))
    assert ["bench", "--engines"] in commands and ["info"] in commands  # also as `cupy-swap ...`
    for argv in commands:
        if argv == ["--help"]:
            continue  # the top level's help, which exits
        if argv[:1] == ["bench"] and "--remote" in argv:
            continue  # cli.main hands these to remote_bench: test_readme_remote_bench_commands_parse
        args = cli.parse_args(argv, prog="python -m cupy_swap")
        named = argv[0] if argv and not argv[0].startswith("-") else "demo"  # bare options: the demo's
        assert args.command == named, argv
    # And the demo's one option, which the README names for the bare command.
    assert cli.parse_args(["--reps", "5"]).reps == 5


@pytest.mark.parametrize("name", list(cli.COMMANDS))
def test_command_usage_is_its_own(name, capsys):
    parser = cli.build_parser("python -m cupy_swap")
    args = parser.parse_args([name])
    assert args.command_parser.prog == f"python -m cupy_swap {name}"
    args.command_parser.print_usage()
    assert capsys.readouterr().out.startswith(f"usage: python -m cupy_swap {name} [-h]")


# Item: --gpus beyond this machine's GPUs is a usage error (exit 2), found before
# anything is measured (here: before the header, which builds a swapper).
@pytest.mark.parametrize(
    "gpus, devices, message",
    [
        ("7", 1, "argument --gpus: expected GPU index 0 (this machine has 1 GPU), got 7"),
        ("0,2,5", 2, "argument --gpus: expected GPU indices from 0 to 1 (this machine has 2 GPUs), got 2, 5"),
    ],
)
def test_gpus_beyond_the_machine_is_a_usage_error(gpus, devices, message, monkeypatch, capsys):
    _stub_measurements(monkeypatch, devices=devices)
    monkeypatch.setattr(cli_bench, "_header", lambda args: pytest.fail("measured before checking --gpus"))
    with pytest.raises(SystemExit) as e:
        cli.main(["bench", "--gpus", gpus])
    assert e.value.code == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert "usage: cupy-swap bench [-h]" in err and f"cupy-swap bench: error: {message}" in err


def test_gpus_all_reaches_the_harness_as_indices(monkeypatch, capsys):
    _stub_measurements(monkeypatch, devices=2)
    ran = []

    def fake_run_node(devices, **kw):
        ran.append((devices, kw["block_bytes"], kw["n"]))
        return {"together": [{"verified": True}]}

    monkeypatch.setattr(node, "run_node", fake_run_node)
    assert cli.main(["bench", "--gpus", "all", "--gpu-blocks", "8", "--block-bytes", "4k"]) == cli.EXIT_OK
    assert ran == [([0, 1], 4096, 8)]
    assert "2 GPU(s) [0, 1] at once" in capsys.readouterr().out


def test_select_devices():
    assert node.select_devices("all", 3) == [0, 1, 2]
    assert node.select_devices([2, 0], 3) == [2, 0]
    for spec, count, message in (
        ([3], 3, "expected GPU indices from 0 to 2 (this machine has 3 GPUs), got 3"),
        ([-1], 1, "expected GPU index 0 (this machine has 1 GPU), got -1"),
        ([], 2, "expected distinct GPU indices, got []"),
        ([1, 1], 2, "expected distinct GPU indices, got [1, 1]"),
        ("some", 2, "expected 'all' or a list of GPU indices, got 'some'"),
        ("all", 0, "expected a machine with at least one GPU, got 0 GPUs"),
    ):
        with pytest.raises(ValueError) as e:
            node.select_devices(spec, count)
        assert str(e.value) == message


# Item: --json is checked before the run, so a sweep is not thrown away at its end.
def test_check_output_file(tmp_path, monkeypatch):
    new = str(tmp_path / "out.json")
    assert cli_common.check_output_file(new) == new and not os.path.exists(new)  # checked, not created
    (tmp_path / "old.json").write_text("{}")
    assert cli_common.check_output_file(str(tmp_path / "old.json")) == str(tmp_path / "old.json")
    (tmp_path / "file").write_text("")
    cases = [
        ("", "expected a file name, got ''"),
        (str(tmp_path), f"expected a file name, got {str(tmp_path)!r}, a directory"),
        (
            str(tmp_path / "no" / "out.json"),
            f"expected an existing directory for {str(tmp_path / 'no' / 'out.json')!r}, "
            f"but {str(tmp_path / 'no')!r} does not exist",
        ),
        (
            str(tmp_path / "file" / "out.json"),
            f"expected a directory for {str(tmp_path / 'file' / 'out.json')!r}, "
            f"but {str(tmp_path / 'file')!r} is not one",
        ),
    ]
    for path, message in cases:
        with pytest.raises(ValueError) as e:
            cli_common.check_output_file(path)
        assert str(e.value) == message
    # Permissions through os.access (root may write anywhere, so stand in for it).
    monkeypatch.setattr(os, "access", lambda path, mode: False)
    with pytest.raises(
        ValueError, match=r"expected a writable directory for .*out\.json', but .* is not writable"
    ):
        cli_common.check_output_file(new)
    with pytest.raises(ValueError, match=r"expected a writable file, but .*old\.json' is not writable"):
        cli_common.check_output_file(str(tmp_path / "old.json"))


def test_bench_json_into_a_missing_directory_fails_before_the_gpu_check(monkeypatch, capsys):
    monkeypatch.setattr(cli_common, "gpu_status", lambda: pytest.fail("GPU checked before --json"))
    with pytest.raises(SystemExit) as e:
        cli.main(["bench", "--json", "/no/such/dir/out.json"])
    assert e.value.code == cli.EXIT_USAGE
    assert (
        "cupy-swap bench: error: argument --json: expected an existing directory" in capsys.readouterr().err
    )


def test_bench_json_that_cannot_be_written_at_the_end_is_kept(monkeypatch, tmp_path, capsys):
    """The directory goes away during the run: the figures land in a temporary file."""
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    spare_dir = tmp_path / "spare"
    spare_dir.mkdir()
    monkeypatch.setattr(cli_common.tempfile, "tempdir", str(spare_dir))
    seen = _stub_measurements(monkeypatch)
    fake = bench.run_case

    def run_case_then_remove(case, **kw):
        if out_dir.exists():
            out_dir.rmdir()
        return fake(case, **kw)

    monkeypatch.setattr(bench, "run_case", run_case_then_remove)
    assert cli.main(["bench", "--counts", "3", "--json", str(out_dir / "b.json")]) == cli.EXIT_OK
    (spare,) = spare_dir.glob("cupy_swap-bench-*.json")
    assert len(json.loads(spare.read_text())["results"]) == len(seen) == 2
    err = capsys.readouterr().err
    assert f"could not write --json {out_dir / 'b.json'}" in err and str(spare) in err


# Item: after `pip install .` without an extra, the message says CuPy is missing
# (not a GPU) and gives this project's install command, not a package PyPI lacks.
def test_without_cupy_says_so_with_the_install_command(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "cupy", None)  # `import cupy` raises ImportError
    for argv in ([], ["bench"], ["calibrate"]):
        with pytest.raises(SystemExit) as e:
            cli.main(argv)
        assert e.value.code == EXIT_NO_GPU
        err = capsys.readouterr().err
        assert err.startswith("cupy_swap: CuPy is not installed (")
        assert 'pip install ".[cuda12]" (CUDA 12.x driver)' in err and 'pip install ".[cuda13]"' in err
        assert "; this command needs CuPy (exit status 3: CuPy missing)." in err and err.count("\n") == 1
        assert "needs an NVIDIA GPU" not in err and "cupy-swap[" not in err
    assert cli.main(["info"]) == EXIT_NO_GPU
    err = capsys.readouterr().err
    assert "cupy_swap: CuPy: missing (CuPy is not installed" in err and "GPU: none" not in err


# Issue 39: `bench --remote` checks every argument, the --json file's folder included, before
# it looks for NIXL or measures anything; a bad one is one line and exit status 2.
REMOTE_BAD = [
    (
        ["--json", "/no/such/dir/x.json"],
        "argument --json: expected an existing directory for '/no/such/dir/x.json', "
        "but '/no/such/dir' does not exist",
    ),
    (["--staged-chunks=-2M"], "argument --staged-chunks: '-2M' is not a chunk size such as 2M or 32M, or 0"),
    (["--staged-chunks", "2M,-1"], "argument --staged-chunks: '-1' is not a chunk size"),
    (["--staged-chunks", "2Q"], "argument --staged-chunks: '2Q' is not a chunk size"),
    (["--rows", "32Kx16", "--sizes", "4K"], "argument --rows: not allowed with --sizes (give SIZExCOUNT"),
    (["--counts", "4", "--rows", "32Kx16"], "argument --rows: not allowed with --counts"),
    (["--rows", "32Kx"], "argument --rows: '32Kx' is not a SIZExCOUNT pair such as 32Kx1250 or 2Mx16"),
    (["--rows", "32Kx0"], "argument --rows: '32Kx0' is not a SIZExCOUNT pair"),
    (["--sizes", "5Q"], "argument --sizes: '5Q' is not a block size such as 4096, 4K, 32K or 2M"),
    (["--counts", "16,x"], "argument --counts: 'x' is not a positive whole number"),
    (["--reps", "0"], "argument --reps: '0' is not a positive whole number"),
    (["--max-memory", "lots"], "argument --max-memory: 'lots' is not a size such as 512M or 8G"),
    (["--rows", "2Mx1250"], "2M x 1250 needs about 15.3 GiB of memory for its two processes"),
    (["--from", "cpu"], "argument --from: invalid choice: 'cpu'"),
    (["--bogus"], "unrecognized arguments: --bogus"),
]


@pytest.mark.parametrize("argv, message", REMOTE_BAD)
def test_remote_bench_refuses_a_bad_command_line_in_one_line_before_measuring(
    argv, message, monkeypatch, capsys
):
    import cupy_swap.remote
    from cupy_swap.tools import remote_bench

    monkeypatch.setattr(remote_bench, "run", lambda *a, **k: pytest.fail("measured before the arguments"))
    monkeypatch.setattr(cupy_swap.remote, "unavailable_reason", lambda: pytest.fail("NIXL looked for first"))
    assert cli.main(["bench", "--remote", *argv]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("cupy-swap bench --remote: error: ") and err.endswith(" (see --help)\n")
    assert message in err and err.count("\n") == 1, err
    assert "invalid literal" not in err and "Traceback" not in err


@pytest.mark.parametrize("argv", [["--json", "/no/such/dir/x.json"], ["--rows", "32Kx"]])
def test_remote_bench_bad_command_line_as_a_user_runs_it(argv):
    """Issue 39: --json into a missing folder ran the whole benchmark (NIXL
    installed), then lost it in a traceback, exit 1; --rows 32Kx printed
    int()'s message.  The timeout fails a run that measures first."""
    r = subprocess.run(
        [sys.executable, "-m", "cupy_swap", "bench", "--remote", *argv],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and r.stdout == "", r.stdout + r.stderr
    assert r.stderr.startswith("python -m cupy_swap bench --remote: error: argument ")
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr


def test_remote_bench_help_reads_like_the_others():
    """Issue 39: the help showed the module docstring's RST, options without
    help text and no exit status."""
    from cupy_swap.tools import remote_bench

    r = _run("bench", "--remote", "--help")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert out.startswith("usage: python -m cupy_swap bench --remote [-h] ")
    assert "``" not in out and "::" not in out and ":data:" not in out
    assert "exit status:\n  0  success\n  1  a transfer's bytes did not match\n  2  bad command line" in out
    assert "3  no usable NVIDIA GPU for --from gpu or --to gpu" in out
    for name in ("direct", "staged", "raw", "raw-nonote", "raw-1desc", "local"):
        assert f"\n  {name:<11} " in out, name
    parser = remote_bench.build_parser()
    assert all(action.help for action in parser._actions), [a.dest for a in parser._actions if not a.help]


def test_remote_bench_rows_reach_the_run_and_the_json_is_written_after_each(monkeypatch, tmp_path, capsys):
    """--sizes x --counts (the other's default when one is given), the staged
    chunks as bytes; the --json file holds every row measured so far."""
    import cupy_swap.remote
    from cupy_swap.tools import remote_bench

    out = tmp_path / "remote.json"
    ran, seen_in_file = [], []

    def fake_run(src, dst, block_bytes, n, reps, seed=0, chunks=()):
        seen_in_file.append(len(json.loads(out.read_text())) if out.exists() else 0)
        ran.append((src, dst, block_bytes, n, reps, chunks))
        return [
            {"from": src, "to": dst, "contender": c, "gbps": 1.0, "best_gbps": 1.0, "exact": True}
            for c in ("direct", "raw")
        ]

    monkeypatch.setattr(remote_bench, "run", fake_run)
    monkeypatch.setattr(cupy_swap.remote, "unavailable_reason", lambda: None)
    argv = ["bench", "--remote", "--sizes", "4K,2M", "--counts", "3", "--reps", "2"]
    argv += ["--staged-chunks", "2M,0", "--json", str(out)]
    assert cli.main(argv) == cli.EXIT_OK
    assert ran == [("host", "host", 4096, 3, 2, (2 << 20, 0)), ("host", "host", 2 << 20, 3, 2, (2 << 20, 0))]
    assert seen_in_file == [0, 2] and len(json.loads(out.read_text())) == 4
    ran.clear()
    assert cli.main(["bench", "--remote", "--sizes", "8K"]) == cli.EXIT_OK
    assert [(b, n) for _, _, b, n, _, _ in ran] == [(8192, 16), (8192, 1250)]
    ran.clear()
    assert cli.main(["bench", "--remote"]) == cli.EXIT_OK
    assert [(b, n) for _, _, b, n, _, _ in ran] == [(32768, 1250), (2 << 20, 16)]
    capsys.readouterr()


def test_remote_bench_without_nixl_says_so_in_one_line_and_exits_2(monkeypatch, capsys):
    import cupy_swap.remote
    from cupy_swap.tools import remote_bench

    monkeypatch.setattr(remote_bench, "run", lambda *a, **k: pytest.fail("measured without NIXL"))
    monkeypatch.setattr(cupy_swap.remote, "unavailable_reason", lambda: "cupy_swap.remote needs NIXL (test)")
    assert cli.main(["bench", "--remote", "--reps", "1"]) == cli.EXIT_USAGE
    assert capsys.readouterr().err == "cupy-swap bench --remote: cupy_swap.remote needs NIXL (test)\n"


def test_readme_remote_bench_commands_parse():
    from cupy_swap.tools import remote_bench

    remote = [argv for argv in _readme_commands() if "--remote" in argv]
    assert remote, "the README shows no bench --remote command"
    for argv in remote:
        remote_bench.parse_args([a for a in argv[1:] if a != "--remote"])
