"""The package's layers, low to high; a module imports only from its own layer
or the layers below it, and no chain of imports comes back to where it began.

    0  core/        NumPy only (never imports CuPy), CPU-tested
    1  cuda/        the driver, kernels, rings, pinned memory and its registries
    2  hostpool/    the pinned-memory engine (feeds cuda/'s registries)
    3  the swap:    the top-level modules (swapper, prepared, op_cache, api_types,
                    the package's __init__) and the folders of its paths:
                    graphs/ (captured swap, replay verdicts, GraphSwap) and
                    staged/ (plan and stager)
    4  tools/, remote/, engines/, __main__: imported by nothing below them

Every import counts: at module level, inside functions and under
``TYPE_CHECKING`` (an import that waits for its call is still an arrow).
A module of a folder this table does not know fails the test, so a new
folder is placed in a layer on purpose."""

import ast
import subprocess
import sys
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "cupy_swap"

# Low to high.  A folder (cupy_swap/NAME/) or a top-level module (NAME.py).
LAYERS = (
    {"core"},
    {"cuda"},
    {"hostpool"},
    {"__init__", "api_types", "op_cache", "prepared", "swapper", "graphs", "staged"},
    {"tools", "remote", "engines", "__main__"},
)


def _module(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module(p): p for p in sorted(PKG.rglob("*.py"))}


def _edges(path: Path, modules) -> list[tuple[str, int]]:
    """``(module, line)`` of every package module a file imports: relative
    imports resolved; ``from pkg import sub`` counts as importing ``pkg.sub``
    (and ``pkg`` itself only when a name it imports is not a submodule)."""
    tree = ast.parse(path.read_text())
    package = _module(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module
            subs = [f"{mod}.{a.name}" for a in node.names if f"{mod}.{a.name}" in modules]
            found += [(s, node.lineno) for s in subs]
            if len(subs) < len(node.names):
                found.append((mod, node.lineno))
    return [(m, line) for m, line in found if m == "cupy_swap" or m.startswith("cupy_swap.")]


def _layer(module: str) -> int:
    parts = module.split(".")
    key = parts[1] if len(parts) > 1 else "__init__"
    for i, names in enumerate(LAYERS):
        if key in names:
            return i
    raise AssertionError(f"{module}: in no layer of LAYERS (tests/test_layers.py); place it in one")


def _imports(path: Path) -> set[str]:
    """Modules a file imports (relative imports resolved inside the package)."""
    tree = ast.parse(path.read_text())
    rel = path.relative_to(PKG.parent).with_suffix("").parts
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(rel[: len(rel) - node.level])
                found.add(".".join(base + ([node.module] if node.module else [])))
            else:
                found.add(node.module)
    return found


def _reachable(graph: dict, start: str) -> set[str]:
    """Every module ``start`` imports, directly or through others."""
    seen, todo = set(), list(graph[start])
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo += graph[m]
    return seen


def test_every_module_has_a_layer():
    for module in _modules():
        _layer(module)


def test_no_import_climbs_a_layer():
    modules = _modules()
    upward = [
        f"{module} (layer {_layer(module)}) imports {target} (layer {_layer(target)}), line {line}"
        for module, path in modules.items()
        for target, line in _edges(path, modules)
        if _layer(target) > _layer(module)
    ]
    assert upward == [], "imports from a lower layer up to a higher one:\n" + "\n".join(upward)


def test_no_import_circle():
    modules = _modules()
    graph = {
        m: sorted({t for t, _ in _edges(p, modules) if t in modules and t != m}) for m, p in modules.items()
    }
    reach = {m: _reachable(graph, m) for m in graph}
    circles = sorted({tuple(sorted(o for o in reach[m] if m in reach[o])) for m in graph if m in reach[m]})
    assert circles == [], "import circles:\n" + "\n".join(" <-> ".join(c) for c in circles)


def test_the_checks_see_an_upward_import_and_a_circle(tmp_path, monkeypatch):
    """The two tests above on a made-up package: they are not vacuous."""
    pkg = tmp_path / "cupy_swap"
    for name, text in {
        "__init__.py": "",
        "core/__init__.py": "",
        "core/a.py": "from ..cuda import b\n",  # climbs: core -> cuda
        "cuda/__init__.py": "",
        "cuda/b.py": "def f():\n    from ..core import a\n",  # and back: a circle (inside a function)
    }.items():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text(text)
    monkeypatch.setattr(sys.modules[__name__], "PKG", pkg)
    for test in (test_no_import_climbs_a_layer, test_no_import_circle):
        try:
            test()
        except AssertionError as e:
            assert "cupy_swap.core.a" in str(e) and "cupy_swap.cuda.b" in str(e)
        else:
            raise AssertionError(f"{test.__name__} passed on a package that breaks it")


def test_core_imports_only_numpy_and_itself():
    for path in (PKG / "core").glob("*.py"):
        for mod in _imports(path):
            top = mod.split(".")[0]
            assert top in (
                "numpy",
                "__future__",
                "dataclasses",
                "typing",
                "sys",
                "itertools",
            ) or mod.startswith("cupy_swap.core"), f"{path.name} imports {mod}"


def test_core_runs_without_cupy():
    code = (
        "import sys; sys.modules['cupy'] = None\n"  # any import of cupy fails
        "import numpy as np\n"
        "from cupy_swap.core import layout, mapping, route, copies, parts\n"
        "from cupy_swap.staged import plan\n"  # the staged plan: NumPy only too
        "m = mapping.normalize_mapping([(0, 1), (2, 3)])\n"
        "assert mapping.run_starts(m).tolist() == [0, 1]\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
