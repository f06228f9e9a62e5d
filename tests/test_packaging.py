"""The wheel carries the kernel sources and the licence, and an installed
wheel finds and compiles them (CPU only: NVRTC, no GPU).

Everything here runs offline: the wheel is built without an isolated build
environment (the backend, hatchling, comes with the ``test`` extra) and
installed with ``--no-index``.  A failing build or install shows its own
output in the test report."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _pyproject() -> dict:
    try:
        import tomllib
    except ImportError:  # Python 3.10: pytest depends on tomli there
        import tomli as tomllib
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _build_requirement() -> str:
    """The ``hatchling>=X`` entry of ``[build-system] requires``."""
    (req,) = [r for r in _pyproject()["build-system"]["requires"] if r.startswith("hatchling")]
    return req


def _backend_problem() -> str | None:
    """Why the wheel cannot be built offline here, or None when it can."""
    from packaging.requirements import Requirement

    req = Requirement(_build_requirement())
    try:
        have = importlib.metadata.version("hatchling")
    except importlib.metadata.PackageNotFoundError:
        return (
            f"needs the build backend ({req}) installed to build the wheel without a package index: "
            'pip install -e ".[test]" (the test extra has it), or pip install hatchling'
        )
    if not req.specifier.contains(have, prereleases=True):
        return f"needs {req} to build the wheel; hatchling {have} is installed (pip install -U hatchling)"
    return None


def _run(cmd: list[str], what: str, **kw) -> subprocess.CompletedProcess:
    """Run ``cmd``; on failure, fail the test with the command's own output."""
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        pytest.fail(
            f"{what} failed (exit {r.returncode}): {' '.join(cmd)}\n"
            f"--- stdout ---\n{r.stdout}\n--- stderr ---\n{r.stderr}",
            pytrace=False,
        )
    return r


def build_command(out: Path) -> list[str]:
    """``python -m build`` without isolation when ``build`` is installed,
    else ``pip wheel`` without build isolation; neither needs a network."""
    if importlib.util.find_spec("build") is not None:
        return [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out), str(ROOT)]
    return [
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--no-build-isolation",
        "--no-deps",
        "--no-index",
        "--wheel-dir",
        str(out),
        str(ROOT),
    ]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    problem = _backend_problem()
    if problem:
        pytest.skip(problem)
    out = tmp_path_factory.mktemp("wheel")
    _run(build_command(out), "building the wheel")
    (whl,) = out.glob("cupy_swap-*.whl")
    return whl


def test_build_requirement_matches_the_licence_form():
    from packaging.requirements import Requirement

    req = Requirement(_build_requirement())
    project = _pyproject()["project"]
    if isinstance(project["license"], str) or "license-files" in project:
        # `license = "SPDX"` with `license-files` (PEP 639) needs hatchling >= 1.27.
        assert not req.specifier.contains("1.26.3")
    assert req.specifier.contains("1.27.0")
    test_extra = [r for r in project["optional-dependencies"]["test"] if r.startswith("hatchling")]
    assert test_extra == [str(req)]  # the test extra installs the backend the build needs


def test_wheel_contains_kernels(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    for src in (ROOT / "kernels_cu").iterdir():
        assert f"cupy_swap/kernels_cu/{src.name}" in names
    assert "cupy_swap/__init__.py" in names
    assert any(n.endswith("entry_points.txt") for n in names)


def test_wheel_is_typed(wheel):
    assert "cupy_swap/py.typed" in zipfile.ZipFile(wheel).namelist()


def test_sdist_carries_the_sources_but_not_the_result_logs(tmp_path):
    """The source distribution has what a build and the tests need, and none
    of the stored device logs under benchmarks/results/."""
    problem = _backend_problem()
    if problem:
        pytest.skip(problem)
    if importlib.util.find_spec("build") is None:
        pytest.skip("needs the build package (the test extra has it) to make an sdist offline")
    _run(
        [sys.executable, "-m", "build", "--sdist", "--no-isolation", "--outdir", str(tmp_path), str(ROOT)],
        "sdist",
    )
    import tarfile

    (sdist,) = tmp_path.glob("*.tar.gz")
    names = [n.split("/", 1)[1] for n in tarfile.open(sdist).getnames() if "/" in n]
    assert "kernels_cu/block_swap.cu" in names and "cupy_swap/py.typed" in names and "CHANGELOG.md" in names
    assert "benchmarks/lean_goals.py" in names
    assert not [n for n in names if n.startswith("benchmarks/results")]


def test_wheel_carries_the_licence(wheel):
    z = zipfile.ZipFile(wheel)
    names = z.namelist()
    (lic,) = [n for n in names if re.fullmatch(r"cupy_swap-[^/]+\.dist-info/licenses/LICENSE", n)]
    assert z.read(lic) == (ROOT / "LICENSE").read_bytes()
    (meta,) = [n for n in names if re.fullmatch(r"cupy_swap-[^/]+\.dist-info/METADATA", n)]
    metadata = z.read(meta).decode()
    headers = metadata.split("\n\n", 1)[0].splitlines()
    project = _pyproject()["project"]
    assert f"License-Expression: {project['license']}" in headers
    assert [f"License-File: {name}" for name in project["license-files"]] == [
        h for h in headers if h.startswith("License-File: ")
    ]


def test_installed_wheel_loads_kernels(wheel, tmp_path):
    target = tmp_path / "site"
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-index",
            "--no-build-isolation",
            "--quiet",
            "--target",
            str(target),
            str(wheel),
        ],
        "installing the wheel",
    )
    # Compiling needs CuPy's NVRTC bindings (the cuda12/cuda13 extra); without
    # them the installed wheel must still find its kernel sources.
    try:
        have_nvrtc = importlib.util.find_spec("cupy_backends.cuda.libs.nvrtc") is not None
    except ImportError:
        have_nvrtc = False
    compile_line = "cubin = k.compile_with_nvrtc('sm_90')\n" if have_nvrtc else "cubin = k.kernel_source()\n"
    code = (
        "import cupy_swap, cupy_swap.cuda.kernels as k\n"
        "d = k.kernel_dir()\n"
        "assert str(d).startswith(%r), d\n"
        "assert str(cupy_swap.__file__).startswith(%r)\n"
        "%s"
        "print('ok', d, len(cubin))\n"
    ) % (str(target), str(target), compile_line)
    env = dict(os.environ, PYTHONPATH=str(target))
    r = _run([sys.executable, "-c", code], "loading the installed wheel", cwd=tmp_path, env=env)
    assert r.stdout.startswith("ok")
