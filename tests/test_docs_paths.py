"""Every repository path the user-facing documents cite exists (issue 51: the
README cited ``host_floor.py``, which the repository did not have).

Checked: the documents' local links (relative to the document), paths that
start at one of the repository's folders (``examples/...``, ``benchmarks/...``,
from the root or from the document's folder; a glob must match something) and
file names quoted alone (``name.py``, somewhere in the repository).  The
history logs (``benchmarks/NOTES.md``, ``CHANGELOG.md``, the pages under
``benchmarks/results/history/``) name files that were deleted on purpose and
are not checked.  CPU only."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = (
    "README.md",
    "cupy_swap/remote/README.md",
    "benchmarks/HOSTPOOLS.md",
    "benchmarks/REFERENCE.md",
    "benchmarks/results/README.md",
)
# Not files: placeholders a reader fills in.
PLACEHOLDERS = {"examples/NAME.py"}

_FOLDERS = r"(?:cupy_swap|benchmarks|examples|tests|kernels_cu|\.ci)"
_PATH = re.compile(rf"(?<![\w./~-]){_FOLDERS}/[\w./*-]*[\w*]")  # not inside ~/.cache/cupy_swap/ or a URL
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_NAME = re.compile(r"`([\w-]+\.(?:py|sh|md|json|png|log|cu|toml|txt))`")
_SKIP_DIRS = {"__pycache__", "build", "dist", "node_modules"}
# The documents cite the repository; the sdist carries part of it (no .ci/, none of the
# earlier runs under benchmarks/results/history/: tests/test_packaging.py), so there the
# documents are not checked (the checker's own test still runs).
CHECKOUT = (ROOT / ".ci" / "run").is_file()


def _file_names(root: Path) -> set[str]:
    names = set()
    for _, dirs, files in os.walk(root):
        # No hidden folder but .ci/: a local .probe/ or .bisect/ copy is not the repository's.
        dirs[:] = [d for d in dirs if d not in _SKIP_DIRS and (d == ".ci" or not d.startswith("."))]
        names.update(files)
    return names


def cited(doc: str, text: str) -> list[tuple[str, str]]:
    """(kind, path) of every repository path ``text`` (the document ``doc``) cites."""
    out = [("link", m.group(1).split("#")[0]) for m in _LINK.finditer(text)]
    out = [(k, t) for k, t in out if t and "://" not in t and not t.startswith("mailto:")]
    out += [("path", m.group(0).rstrip(".")) for m in _PATH.finditer(text)]
    out += [("name", m.group(1)) for m in _NAME.finditer(text)]
    return out


def missing(doc: str, text: str, root: Path = ROOT, names: set[str] | None = None) -> list[str]:
    """The cited paths of ``text`` that do not exist under ``root``."""
    here = (root / doc).parent
    names = _file_names(root) if names is None else names
    bad, seen = [], set(PLACEHOLDERS)
    for kind, path in cited(doc, text):
        if path in seen:  # a link's target is a prose path too: one report
            continue
        seen.add(path)
        if kind == "link":
            found = (here / path).exists()
        elif kind == "path":
            found = any(
                list(base.glob(path)) if "*" in path else (base / path).exists() for base in (root, here)
            )
        else:
            found = path in names
        if not found:
            bad.append(f"{doc}: {kind} {path}")
    return bad


@pytest.fixture(scope="module")
def names() -> set[str]:
    return _file_names(ROOT)


@pytest.mark.skipif(not CHECKOUT, reason="the documents cite a checkout; the sdist carries part of it")
@pytest.mark.parametrize("doc", DOCS)
def test_every_path_a_document_cites_exists(doc, names):
    text = (ROOT / doc).read_text()
    assert cited(doc, text), f"{doc} cites nothing: check cited()"
    bad = missing(doc, text, names=names)
    assert not bad, "cited but not in the repository:\n" + "\n".join(bad)


def test_the_readme_cites_the_floor_probe_by_its_path():
    """The README's host-time floor comes from the shared floor probe, which the
    repository now carries under benchmarks/probes/."""
    found = cited("README.md", (ROOT / "README.md").read_text())
    assert ("link", "benchmarks/probes/host_floor.py") in found
    assert ("path", "examples/vllm_offload.py") in found  # the extractor reads prose paths too
    assert (ROOT / "benchmarks/probes/host_floor.py").is_file()


def test_a_missing_path_is_reported(tmp_path):
    """The checker itself: each kind of citation of a file that is not there fails."""
    (tmp_path / "examples").mkdir()
    (tmp_path / "examples" / "there.py").write_text("")
    text = (
        "See [a](examples/there.py), [b](examples/gone.py), examples/there.py, examples/lost.py, "
        "`there.py`, `nowhere.py`, ~/.cache/cupy_swap/x.json, https://example.org/examples/x.py "
        "and examples/NAME.py."
    )
    assert missing("README.md", text, root=tmp_path) == [
        "README.md: link examples/gone.py",
        "README.md: path examples/lost.py",
        "README.md: name nowhere.py",
    ]
