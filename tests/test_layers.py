"""The package's layers: ``core`` needs only NumPy (never imports CuPy),
and ``core``, ``cuda`` and the swapper modules never import ``tools``."""

import ast
import subprocess
import sys
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "cupy_swap"


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


def test_nothing_below_tools_imports_tools():
    for layer in ("core", "cuda"):
        for path in (PKG / layer).glob("*.py"):
            assert not any(m.startswith("cupy_swap.tools") for m in _imports(path)), path.name
    for name in ("swapper.py", "prepared.py", "graph.py", "__init__.py"):
        assert not any(m.startswith("cupy_swap.tools") for m in _imports(PKG / name)), name


def test_core_runs_without_cupy():
    code = (
        "import sys; sys.modules['cupy'] = None\n"  # any import of cupy fails
        "import numpy as np\n"
        "from cupy_swap.core import layout, mapping, route, staged_plan, copies, parts\n"
        "m = mapping.normalize_mapping([(0, 1), (2, 3)])\n"
        "assert mapping.run_starts(m).tolist() == [0, 1]\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
