"""CUDA availability errors on the CPU (cupy_swap/cuda/availability.py): stand-in
CuPy exceptions and a stand-in driver probe tell no driver, no device, a driver
that does not start, a driver too old and a missing CuPy apart."""

import sys
import uuid
from pathlib import Path

import numpy as np
import pytest

import cupy_swap
from cupy_swap.cuda import availability
from cupy_swap.cuda.availability import (
    CudaUnavailableError,
    cuda_unavailable_error,
    explain_no_gpu,
    translate_unavailable,
)

from .gpu_helpers import GPU_OK

INSUFFICIENT = "cudaErrorInsufficientDriver: CUDA driver version is insufficient for CUDA runtime version"


class CUDARuntimeError(RuntimeError):
    """Stands in for ``cupy_backends.cuda.api.runtime.CUDARuntimeError``
    (matched by class name and ``status``)."""

    def __init__(self, status, text):
        super().__init__(text)
        self.status = status


class CUDADriverError(CUDARuntimeError):
    """Stands in for ``cupy.cuda.driver.CUDADriverError``."""


def _machine(monkeypatch, driver, runtime=12090):
    """Make the probes report ``driver`` (as probe_driver would) and ``runtime``."""
    monkeypatch.setattr(availability, "probe_driver", lambda: driver)
    monkeypatch.setattr(availability, "runtime_version", lambda: runtime)


def _no_probe(monkeypatch):
    """Fail the test if the driver is probed."""
    monkeypatch.setattr(availability, "probe_driver", lambda: pytest.fail("driver probed"))


NO_DRIVER = None
NO_DEVICE = {"init": 100, "version": 12040, "devices": None}
ZERO_DEVICES = {"init": 0, "version": 12040, "devices": 0}
NO_START = {"init": 999, "version": 12040, "devices": None}
OLD_DRIVER = {"init": 0, "version": 12020, "devices": 1}
GOOD_DRIVER = {"init": 0, "version": 13000, "devices": 1}


def test_no_driver_is_not_called_an_old_driver(monkeypatch):
    _machine(monkeypatch, NO_DRIVER)
    err = cuda_unavailable_error(CUDARuntimeError(35, INSUFFICIENT), "BlockSwapper()")
    assert isinstance(err, CudaUnavailableError) and isinstance(err, RuntimeError)
    assert err.reason == "no-driver"
    assert str(err).startswith("BlockSwapper(): no NVIDIA driver found (libcuda.so.1 cannot be loaded)")
    assert "insufficient" not in str(err) and "upgrade" not in str(err)


@pytest.mark.parametrize("driver", [NO_DEVICE, ZERO_DEVICES])
def test_driver_without_device(monkeypatch, driver):
    _machine(monkeypatch, driver)
    for exc in (
        CUDARuntimeError(100, "cudaErrorNoDevice: no CUDA-capable device is detected"),
        CUDARuntimeError(35, INSUFFICIENT),
    ):
        err = cuda_unavailable_error(exc)
        assert err.reason == "no-device", str(err)
        assert "installed but sees no GPU" in str(err) and "CUDA_VISIBLE_DEVICES" in str(err)


def test_driver_that_does_not_start(monkeypatch):
    _machine(monkeypatch, NO_START)
    err = cuda_unavailable_error(CUDARuntimeError(3, "cudaErrorInitializationError: initialization error"))
    assert err.reason == "driver-failed" and "does not start" in str(err) and "CUresult 999" in str(err)


def test_driver_older_than_the_runtime(monkeypatch):
    _machine(monkeypatch, OLD_DRIVER, runtime=13000)
    err = cuda_unavailable_error(CUDARuntimeError(35, INSUFFICIENT), "empty_pinned()")
    assert err.reason == "driver-too-old"
    text = str(err)
    assert text.startswith("empty_pinned(): the NVIDIA driver for CUDA 12.2 is older than the CUDA 13.0")
    assert 'upgrade the driver, or install the cuda12 extra (pip install ".[cuda12]"' in text


def test_driver_error_and_error_without_status(monkeypatch):
    _machine(monkeypatch, NO_DEVICE)
    err = cuda_unavailable_error(CUDADriverError(100, "CUDA_ERROR_NO_DEVICE: no CUDA-capable device"))
    assert err.reason == "no-device"
    bare = CUDARuntimeError(None, "cudaErrorNoDevice: no CUDA-capable device is detected")
    assert cuda_unavailable_error(bare).reason == "no-device"


def test_other_availability_errors_keep_cudas_words(monkeypatch):
    _machine(monkeypatch, GOOD_DRIVER)
    busy = "cudaErrorDevicesUnavailable: CUDA-capable device(s) is/are busy or unavailable"
    err = cuda_unavailable_error(CUDARuntimeError(46, busy), "BlockSwapper()")
    assert err.reason == "unavailable" and str(err) == f"BlockSwapper(): {busy}"


@pytest.mark.parametrize(
    "exc",
    [
        CUDARuntimeError(2, "cudaErrorMemoryAllocation: out of memory"),
        CUDARuntimeError(101, "cudaErrorInvalidDevice: invalid device ordinal"),
        CUDARuntimeError(None, "cudaErrorInvalidValue: invalid argument"),
        RuntimeError(INSUFFICIENT),  # not a CUDA error class: the text alone does not count
        ValueError("block_mapping: expected pairs"),
        ModuleNotFoundError("No module named 'torch'", name="torch"),
        ImportError("cannot import name 'nope' from 'cupy_swap.core'", name="cupy_swap.core"),
    ],
    ids=lambda e: type(e).__name__ + ":" + str(e)[:24],
)
def test_not_an_availability_problem(monkeypatch, exc):
    _no_probe(monkeypatch)
    assert cuda_unavailable_error(exc) is None


def test_cupy_missing_names_this_projects_extras(monkeypatch):
    _no_probe(monkeypatch)
    err = cuda_unavailable_error(ModuleNotFoundError("No module named 'cupy'", name="cupy"), "BlockSwapper()")
    text = str(err)
    assert err.reason == "no-cupy"
    assert text.startswith("BlockSwapper(): CuPy is not installed (No module named 'cupy')")
    assert 'pip install ".[cuda12]" (CUDA 12.x driver)' in text
    assert 'pip install ".[cuda13]" (CUDA 13.x driver)' in text
    # cupy-swap is not on PyPI: never `pip install cupy-swap[...]`.
    assert "cupy-swap[" not in text and "cupy_swap[" not in text
    assert "GPU" not in text.replace("NVIDIA driver", "")  # a missing CuPy is not a missing GPU
    broken = cuda_unavailable_error(ImportError("CuPy is not correctly installed: libnvrtc missing"))
    assert broken.reason == "no-cupy" and str(broken).startswith("CuPy cannot be imported (CuPy is not")


def test_install_extras_are_pyprojects():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
    extras = tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]
    for name, (driver, requirements) in availability.INSTALL_EXTRAS.items():
        assert list(requirements) == extras[name], name
        assert driver == f"CUDA {name[len('cuda') :]}.x"
    assert {n for n in extras if n.startswith("cuda")} == set(availability.INSTALL_EXTRAS)


def test_translate_raises_from_the_cuda_error(monkeypatch):
    _machine(monkeypatch, NO_DRIVER)
    original = CUDARuntimeError(35, INSUFFICIENT)
    with pytest.raises(CudaUnavailableError, match=r"^zeros_pinned\(\): no NVIDIA driver found") as e:
        with translate_unavailable("zeros_pinned()"):
            raise original
    assert e.value.__cause__ is original and e.value.reason == "no-driver"


def test_translate_lets_other_errors_and_nested_translations_through(monkeypatch):
    _no_probe(monkeypatch)
    bad = ValueError("shape: expected non-negative sizes, got (-1,)")
    with pytest.raises(ValueError) as e:
        with translate_unavailable("empty_pinned()"):
            raise bad
    assert e.value is bad
    inner = CudaUnavailableError("empty_pinned(): no NVIDIA driver found", "no-driver")
    with pytest.raises(CudaUnavailableError) as e:
        with translate_unavailable("BlockSwapper()"):
            raise inner
    assert e.value is inner  # not prefixed twice
    with translate_unavailable("BlockSwapper()"):
        result = 42
    assert result == 42


def test_translate_as_a_decorator(monkeypatch):
    _machine(monkeypatch, NO_DEVICE)
    calls = []

    @translate_unavailable("BlockSwapper()")
    def make(status):
        calls.append(status)
        if status:
            raise CUDARuntimeError(status, INSUFFICIENT)
        return "made"

    assert make(0) == "made"
    with pytest.raises(CudaUnavailableError, match=r"^BlockSwapper\(\): the NVIDIA driver for CUDA 12.4"):
        make(35)
    with pytest.raises(CudaUnavailableError):  # a fresh context each call
        make(35)
    assert calls == [0, 35, 35]


def test_exported_from_the_package():
    assert cupy_swap.CudaUnavailableError is CudaUnavailableError
    assert "CudaUnavailableError" in cupy_swap.__all__


# The no-GPU explanations (moved from the command line with the probe).
RUNTIME_SAYS = f"no CUDA GPU is available ({INSUFFICIENT})"


def test_explain_no_driver_does_not_suggest_an_upgrade():
    text = explain_no_gpu(RUNTIME_SAYS, None, 12090)
    assert "no NVIDIA driver found" in text and "libcuda.so.1" in text
    assert "upgrade" not in text.lower() and "insufficient" not in text.lower()


def test_explain_driver_too_old_suggests_an_upgrade():
    text = explain_no_gpu(RUNTIME_SAYS, OLD_DRIVER, 13000)
    assert "older than the CUDA 13.0 runtime" in text and "NVIDIA driver for CUDA 12.2" in text
    assert "upgrade the driver" in text and 'pip install ".[cuda12]"' in text and "cupy-swap[" not in text


def test_explain_driver_without_device():
    for driver in (NO_DEVICE, ZERO_DEVICES):
        text = explain_no_gpu(RUNTIME_SAYS, driver, 12090)
        assert "installed but sees no GPU" in text and "upgrade" not in text


def test_explain_driver_that_does_not_start_and_other_cases():
    text = explain_no_gpu(RUNTIME_SAYS, NO_START, 12090)
    assert "does not start" in text and "999" in text and "upgrade" not in text
    missing = availability.cupy_missing_message(ModuleNotFoundError("No module named 'cupy'", name="cupy"))
    assert explain_no_gpu(missing, None, None) == missing
    other = "no CUDA GPU is available (cudaErrorDevicesUnavailable: all CUDA-capable devices are busy)"
    assert explain_no_gpu(other, {"init": 0, "version": 12040, "devices": 1}, 12090) == other


def test_probe_driver_runs_anywhere():
    found = availability.probe_driver()
    assert found is None or set(found) == {"init", "version", "devices"}


# On a machine with CuPy and no NVIDIA driver, CuPy's own error is translated.
NO_DRIVER_HERE = not GPU_OK and availability.probe_driver() is None


@pytest.mark.skipif(not NO_DRIVER_HERE, reason="needs CuPy on a machine without an NVIDIA driver")
def test_real_cupy_error_without_a_driver():
    runtime = pytest.importorskip("cupy.cuda.runtime")
    with pytest.raises(CudaUnavailableError, match=r"^getDevice\(\): no NVIDIA driver found") as e:
        with translate_unavailable("getDevice()"):
            runtime.getDevice()
    assert type(e.value.__cause__).__name__ == "CUDARuntimeError"


ENTRY_POINTS = {
    "BlockSwapper": lambda: cupy_swap.BlockSwapper(max_blocks=4),
    "empty_pinned": lambda: cupy_swap.empty_pinned((4,), np.float32),
    "zeros_pinned": lambda: cupy_swap.zeros_pinned((4,), np.float32),
    "is_pinned": lambda: cupy_swap.is_pinned(np.zeros(4)),
    "register_host": lambda: cupy_swap.register_host(np.zeros(1024)),
    "shared_pinned": lambda: cupy_swap.shared_pinned(
        f"cupy-swap-availability-{uuid.uuid4().hex[:12]}", (4,), np.float32, create=True
    ),
}


@pytest.mark.skipif(not NO_DRIVER_HERE, reason="needs CuPy on a machine without an NVIDIA driver")
@pytest.mark.parametrize("name", list(ENTRY_POINTS))
def test_entry_points_without_a_driver_say_so(name):
    with pytest.raises(CudaUnavailableError, match="no NVIDIA driver found") as e:
        ENTRY_POINTS[name]()
    assert "insufficient" not in str(e.value) and "ulimit" not in str(e.value)


def test_zeros_pinned_names_itself_when_cuda_is_unavailable(monkeypatch):
    """zeros_pinned(10) once reported its failure as ``empty_pinned(): ...``."""
    from cupy_swap.cuda import memory

    _machine(monkeypatch, NO_DRIVER)

    def no_runtime():
        raise CUDARuntimeError(35, INSUFFICIENT)

    monkeypatch.setattr(memory, "_runtime", no_runtime)
    for fn, name in ((cupy_swap.zeros_pinned, "zeros_pinned"), (cupy_swap.empty_pinned, "empty_pinned")):
        with pytest.raises(CudaUnavailableError, match=rf"^{name}\(\): no NVIDIA driver found"):
            fn(10)


def test_swap_event_without_cupy_says_cupy_is_missing(monkeypatch):
    """``cupy_swap.SwapEvent`` is built from CuPy on first use; without CuPy
    it raises the same CudaUnavailableError as every other entry point, not
    a bare ModuleNotFoundError."""
    from cupy_swap.cuda import streams

    monkeypatch.setattr(streams, "_cls", [])  # not built yet
    monkeypatch.setitem(sys.modules, "cupy", None)  # `import cupy` raises ImportError
    with pytest.raises(CudaUnavailableError, match=r"^cupy_swap\.SwapEvent: CuPy is not installed") as e:
        cupy_swap.SwapEvent  # noqa: B018
    assert e.value.reason == "no-cupy" and isinstance(e.value.__cause__, ImportError)
