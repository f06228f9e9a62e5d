"""The README's quickstarts run as written: each ```python block under a
"## Quickstart" heading is executed on the GPU, and its swaps must land."""

import re
from pathlib import Path

import numpy as np
import pytest

from .gpu_helpers import require_gpu

cp = require_gpu()

README = Path(__file__).resolve().parents[1] / "README.md"


def _quickstart(title: str) -> str:
    section = README.read_text().split(f"## Quickstart ({title})", 1)[1].split("\n## ", 1)[0]
    (code,) = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    return code


def test_cupy_quickstart_runs_as_written():
    scope: dict = {}
    exec(compile(_quickstart("CuPy"), "README quickstart (CuPy)", "exec"), scope)
    gpu, host = scope["gpu"], scope["host"]
    cp.cuda.Device().synchronize()
    assert np.array_equal(host[[100, 101]], cp.asnumpy(gpu[[5, 9]]))  # out, then back in to 7 and 8
    assert np.array_equal(cp.asnumpy(gpu[[7, 8]]), host[[100, 101]])


def test_torch_quickstart_runs_as_written():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs torch with CUDA")
    scope: dict = {}
    exec(compile(_quickstart("torch"), "README quickstart (torch)", "exec"), scope)
    gpu, host = scope["gpu"], scope["host"]
    torch.cuda.synchronize()
    assert torch.equal(host[[100, 101]], gpu[[5, 9]].cpu())
