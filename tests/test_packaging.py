"""The wheel carries the kernel sources, and an installed wheel finds and
compiles them (CPU only: NVRTC, no GPU)."""

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(out), str(ROOT)],
        check=True,
        capture_output=True,
    )
    (whl,) = out.glob("cupy_swap-*.whl")
    return whl


def test_wheel_contains_kernels(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    for src in (ROOT / "kernels_cu").iterdir():
        assert f"cupy_swap/kernels_cu/{src.name}" in names
    assert "cupy_swap/__init__.py" in names
    assert any(n.endswith("entry_points.txt") for n in names)


def test_installed_wheel_loads_kernels(wheel, tmp_path):
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--quiet", "--target", str(target), str(wheel)],
        check=True,
    )
    code = (
        "import cupy_swap, cupy_swap.kernels as k\n"
        "d = k.kernel_dir()\n"
        "assert str(d).startswith(%r), d\n"
        "assert str(cupy_swap.__file__).startswith(%r)\n"
        "cubin = k.compile_with_nvrtc('sm_90')\n"
        "print('ok', d, len(cubin))\n"
    ) % (str(target), str(target))
    env = dict(os.environ, PYTHONPATH=str(target))
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("ok")
