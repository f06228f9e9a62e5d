"""``benchmarks/probes/launch_paths.py`` runs on the device only; here, without a GPU: it
shows its help, its kernels compile for sm_80 and sm_90 under the names it looks up, and its
ctypes copy of ``CUDA_KERNEL_NODE_PARAMS`` has the driver's size."""

import ctypes
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

PROBE = Path(__file__).resolve().parents[1] / "benchmarks" / "probes" / "launch_paths.py"


def _probe():
    spec = importlib.util.spec_from_file_location("launch_paths", PROBE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_help_runs_without_a_gpu():
    r = subprocess.run([sys.executable, str(PROBE), "--help"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    for way in ("set+graph", "slot+graph", "cuLaunchKernel", "cudaMemcpyAsync", "--out"):
        assert way in r.stdout


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_kernels_compile_under_their_names(arch):
    nvrtc = pytest.importorskip("cupy_backends.cuda.libs.nvrtc", reason="CuPy with NVRTC bindings is needed")
    probe = _probe()
    prog = nvrtc.createProgram(probe.SOURCE, "launch_paths.cu", [], [])
    try:
        for name in probe.KERNELS:
            nvrtc.addNameExpression(prog, name)
        nvrtc.compileProgram(prog, [f"--gpu-architecture={arch}", "-std=c++17"])
        cubin = nvrtc.getCUBIN(prog)
        for name in probe.KERNELS:
            assert nvrtc.getLoweredName(prog, name).encode() in cubin
    finally:
        nvrtc.destroyProgram(prog)


def test_kernel_node_params_have_the_drivers_layout():
    params = _probe().KernelNodeParams
    # func, 7 unsigned ints (grid, block, shared bytes), padding, kernelParams, extra
    assert ctypes.sizeof(params) == 56
    assert (params.kernelParams.offset, params.extra.offset) == (40, 48)
