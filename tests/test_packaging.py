"""The wheel carries the kernel sources and the licence, and an installed
wheel finds and compiles them (CPU only: NVRTC, no GPU).

Everything here runs offline: the wheel is built without an isolated build
environment (the backend, hatchling, comes with the ``test`` extra) and
installed with ``--no-index``.  A failing build or install shows its own
output in the test report."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
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


@pytest.fixture(scope="module")
def sdist(tmp_path_factory) -> Path:
    """A freshly built sdist."""
    problem = _backend_problem()
    if problem:
        pytest.skip(problem)
    if importlib.util.find_spec("build") is None:
        pytest.skip("needs the build package (the test extra has it) to make an sdist offline")
    out = tmp_path_factory.mktemp("sdist")
    _run(
        [sys.executable, "-m", "build", "--sdist", "--no-isolation", "--outdir", str(out), str(ROOT)],
        "sdist",
    )
    (found,) = out.glob("*.tar.gz")
    return found


@pytest.fixture(scope="module")
def sdist_names(sdist) -> list[str]:
    """The paths inside the sdist, without its top folder."""
    import tarfile

    return [n.split("/", 1)[1] for n in tarfile.open(sdist).getnames() if "/" in n]


# Of the earlier runs the sdist carries only their index (the results page links to it).
CARRIED_HISTORY = ("benchmarks/results/history/README.md",)


def test_sdist_carries_the_sources_and_the_current_results_only(sdist_names):
    """The source distribution has what a build and the tests need, and the
    current results page with its files (the engines run among them) and
    the index of the earlier runs, but not the earlier runs."""
    names = sdist_names
    assert "kernels_cu/block_swap.cu" in names and "cupy_swap/py.typed" in names and "CHANGELOG.md" in names
    assert "benchmarks/lean_goals.py" in names
    assert "benchmarks/results/README.md" in names and "benchmarks/results/peers.json" in names
    assert "benchmarks/results/history/README.md" in names
    history = [n for n in names if n.startswith("benchmarks/results/history/")]
    assert history and all(n.startswith(CARRIED_HISTORY) for n in history), history
    assert not [n for n in names if n.startswith("benchmarks/wip")]


def test_tests_that_read_the_results_pass_in_the_unpacked_sdist(sdist, tmp_path):
    """The tests that read benchmarks/results run from the unpacked archive
    (they once failed there: the history index was left out)."""
    import tarfile

    with tarfile.open(sdist) as tar:
        tar.extractall(tmp_path, filter="data")
    (top,) = tmp_path.iterdir()
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_tables.py"],
        capture_output=True,
        text=True,
        cwd=top,
        env=dict(os.environ, PYTHONPATH=str(top)),
    )
    assert r.returncode == 0, r.stdout + r.stderr


def readme_links() -> list[str]:
    """The targets of the README's markdown links and images."""
    return re.findall(r"\]\(([^)\s]+)\)", (ROOT / "README.md").read_text())


def test_readme_links_resolve_inside_the_sdist(sdist_names):
    """Every local link of the README (also the package's long description)
    points at a file the sdist carries; the rest are web addresses."""
    local = [link.split("#")[0] for link in readme_links() if "://" not in link and not link.startswith("#")]
    assert local, "the README links to nothing local: check readme_links()"
    missing = [link for link in local if link.rstrip("/") not in sdist_names]
    assert not missing, f"README links that the sdist lacks: {missing}"


def test_metadata_names_authors_platforms_and_every_extra():
    project = _pyproject()["project"]
    assert project["authors"]
    classifiers = set(project["classifiers"])
    for minor in range(10, 14):
        assert f"Programming Language :: Python :: 3.{minor}" in classifiers
    assert {"Operating System :: POSIX :: Linux", "Environment :: GPU :: NVIDIA CUDA"} <= classifiers
    assert project["requires-python"] == ">=3.10"
    readme = (ROOT / "README.md").read_text()
    for extra in project["optional-dependencies"]:
        assert f"[{extra}" in readme or f",{extra}]" in readme, (
            f"the README does not document the {extra} extra"
        )
    assert any(r.startswith("ml_dtypes") for r in project["optional-dependencies"]["test"])


def _metadata_headers(wheel) -> list[str]:
    z = zipfile.ZipFile(wheel)
    (meta,) = [n for n in z.namelist() if re.fullmatch(r"cupy_swap-[^/]+\.dist-info/METADATA", n)]
    return z.read(meta).decode().split("\n\n", 1)[0].splitlines()


def test_metadata_and_readme_name_no_address_that_does_not_exist(wheel):
    """Issue 39: the README and the metadata named a repository URL that did
    not exist.  The project has no public address, so the metadata names
    none (what `pip show` and package indexes would print) and the README
    says how the source is obtained instead."""
    assert "urls" not in _pyproject()["project"]
    headers = _metadata_headers(wheel)
    assert not [h for h in headers if h.startswith(("Project-URL:", "Home-page:", "Download-URL:"))], headers
    readme = (ROOT / "README.md").read_text()
    assert "github.com/cupy-swap" not in readme and "git clone" not in readme
    assert "Source: its source archive or a checkout of its repository ([Install](#install))" in readme


def test_readme_installs_from_the_archive_the_sdist_build_makes(sdist):
    """The README's install command unpacks the archive `python -m build
    --sdist` makes (this version's name) and enters the folder it holds."""
    import tarfile

    (top,) = {n.split("/", 1)[0] for n in tarfile.open(sdist).getnames()}
    readme = (ROOT / "README.md").read_text()
    assert f"tar -xzf {sdist.name} && cd {top}   # or: cd path/to/your/checkout" in readme
    assert f"the source archive `{sdist.name}` (which `python -m build --sdist` makes" in readme


def test_unreleased_code_has_a_development_version():
    """Issue 51: the code after 0.2.0 still called itself 0.2.0.  While the
    CHANGELOG's newest section is "Unreleased" the version is a development
    version of a release the CHANGELOG does not list yet; a release's version
    heads the CHANGELOG."""
    from packaging.version import Version

    import cupy_swap

    version = Version(cupy_swap.__version__)
    sections = re.findall(r"^## (.+)$", (ROOT / "CHANGELOG.md").read_text(), re.M)
    released = [Version(s) for s in sections if s != "Unreleased"]
    if sections[0] == "Unreleased":
        assert version.is_devrelease, f"{version}: unreleased changes need a .devN version"
        assert version > max(released), (version, max(released))
    else:
        assert not version.is_devrelease and Version(sections[0]) == version, (version, sections[0])


def test_no_extra_installs_nixl_and_its_torch():
    """Issue 39: the nixl-cu12 extra installed an unpinned torch (nixl-cu12
    1.5.1 declares `Requires-Dist: torch`).  No extra names NIXL; the README
    installs it with --no-deps in Install, before anything uses it, as CI does."""
    extras = _pyproject()["project"]["optional-dependencies"]
    assert not [r for reqs in extras.values() for r in reqs if r.lower().startswith("nixl")], extras
    command = 'python -m pip install --no-deps "nixl-cu12>=1.5.1,<1.6"'
    readme = (ROOT / "README.md").read_text()
    assert -1 < readme.find(command) < readme.index("## Beyond one machine")
    assert readme.find(command) < readme.index("## Development")
    assert "nixl-cu12]" not in readme and "nixl-cu13]" not in readme
    assert 'pip install --quiet --no-deps "nixl-cu12>=1.5.1,<1.6"' in (ROOT / ".ci" / "run").read_text()


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


def test_readme_counts_are_the_stored_engines_runs():
    """Issue 39: the headline said "within 0.3 % of them in 6 more" where the
    stored table shows 5, one row named in two groups.  Each sentence that
    counts the engines rows is made from benchmarks/results/engines.json
    (``make_tables.py --counts``) and stands in the README as made."""
    spec = importlib.util.spec_from_file_location("make_tables", ROOT / "benchmarks" / "make_tables.py")
    tables = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tables)
    readme = " ".join((ROOT / "README.md").read_text().split())
    sentences = tables.readme_counts(ROOT / "benchmarks" / "results")
    assert len(sentences) == 3
    for sentence in sentences:
        assert sentence in readme, sentence
    rows = json.loads((ROOT / "benchmarks" / "results" / "engines.json").read_text())["engines"]
    s = tables.engines_standing(rows)
    groups = [
        {(r["shape"], r["num_blocks"], r["direction"]) for r in s[k]} for k in ("leads", "close", "behind")
    ]
    assert sum(map(len, groups)) == len(rows) == len(set().union(*groups))  # each row in one group
