"""Whether CUDA can be used here at all, and why not, in words that point at the fix.

The CUDA runtime reports a machine with no NVIDIA driver as
``cudaErrorInsufficientDriver``, like a driver really too old;
:func:`probe_driver` asks ``libcuda.so.1`` directly to tell the cases apart.
Library entry points turn such failures (and a missing CuPy) into
:class:`CudaUnavailableError` with :func:`translate_unavailable`; any other
exception passes through unchanged.  Nothing here imports CuPy at module level.
"""

from __future__ import annotations

import ctypes
from contextlib import contextmanager

# The CUDA extras of pyproject.toml's [project.optional-dependencies]: name ->
# (driver it is for, what it installs).  tests/test_availability.py holds them to
# pyproject.toml.  The project itself is not on PyPI, so the install command is
# the extra from a checkout, or the same requirements straight from PyPI.
INSTALL_EXTRAS = {
    "cuda12": ("CUDA 12.x", ("cupy-cuda12x>=14.1", "cuda-toolkit[nvrtc]==12.*")),
    "cuda13": ("CUDA 13.x", ("cupy-cuda13x>=14.1", "cuda-toolkit[nvrtc]==13.*")),
}

# How every "CuPy is missing" message starts (gpu_status's reason included), and
# the one for a CuPy that is there but fails to import (e.g. a broken install).
CUPY_MISSING = "CuPy is not installed"
_CUPY_BROKEN = "CuPy cannot be imported"

# CUDA runtime (cudaError_t) and driver (CUresult) codes that mean "CUDA cannot be
# used on this machine", not "this call was wrong".  The two enums agree on these.
_UNAVAILABLE_STATUS = {
    3: "cudaErrorInitializationError",
    34: "cudaErrorStubLibrary",
    35: "cudaErrorInsufficientDriver",
    46: "cudaErrorDevicesUnavailable",
    100: "cudaErrorNoDevice",
    802: "cudaErrorSystemNotReady",
    803: "cudaErrorSystemDriverMismatch",
    804: "cudaErrorCompatNotSupportedOnDevice",
}
_CUDA_ERROR_NO_DEVICE = 100
_CUDA_ERROR_CLASSES = ("CUDARuntimeError", "CUDADriverError")


class CudaUnavailableError(RuntimeError):
    """CUDA cannot be used here; the message names the cause and the fix, and
    the CUDA error it stands for is its ``__cause__``.

    Attributes
    ----------
    reason : str
        ``"no-cupy"``, ``"no-driver"``, ``"no-device"``, ``"driver-failed"``,
        ``"driver-too-old"`` or ``"unavailable"`` (another availability
        error, such as every GPU busy in exclusive-process mode).
    """

    def __init__(self, message: str, reason: str = "unavailable"):
        super().__init__(message)
        self.reason = reason


def _cuda_version(v: int) -> str:
    return f"{v // 1000}.{v % 1000 // 10}"


def probe_driver():
    """What ``libcuda.so.1`` says (no CuPy): None when it cannot be loaded,
    else ``{"init": CUresult of cuInit(0), "version": e.g. 12040 or None,
    "devices": device count or None}``."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    out = {"init": None, "version": None, "devices": None}
    try:
        v = ctypes.c_int(0)
        if lib.cuDriverGetVersion(ctypes.byref(v)) == 0:
            out["version"] = v.value
        out["init"] = lib.cuInit(0)
        n = ctypes.c_int(0)
        if out["init"] == 0 and lib.cuDeviceGetCount(ctypes.byref(n)) == 0:
            out["devices"] = n.value
    except (AttributeError, OSError):  # a libcuda without these symbols: say what we know
        pass
    return out


def runtime_version():
    """The CUDA runtime version CuPy loaded (e.g. 12090), or None when CuPy
    is missing or cannot tell."""
    try:
        from cupy.cuda import runtime

        return runtime.runtimeGetVersion()
    except Exception:
        return None


def _install_hint() -> str:
    extras = " or ".join(
        f'pip install ".[{name}]" ({driver} driver)' for name, (driver, _) in INSTALL_EXTRAS.items()
    )
    direct = " or ".join(
        "pip install " + " ".join(f'"{r}"' for r in reqs) for _, reqs in INSTALL_EXTRAS.values()
    )
    return (
        f"install the extra that matches the NVIDIA driver, from the cupy_swap checkout: {extras}; "
        f"or the same packages from PyPI: {direct}"
    )


def cupy_missing_message(exc: BaseException) -> str:
    """The message for the ImportError of ``import cupy``, with the install
    command; it starts with :data:`CUPY_MISSING` when CuPy is not there at all."""
    head = CUPY_MISSING if getattr(exc, "name", None) == "cupy" else _CUPY_BROKEN
    return f"{head} ({exc}); {_install_hint()}"


def _diagnose(what: str, driver, runtime_version) -> tuple[str, str]:
    """``(reason, text)`` for :func:`explain_no_gpu`; reason as in
    :class:`CudaUnavailableError`."""
    if what.startswith((CUPY_MISSING, _CUPY_BROKEN)):
        return "no-cupy", what
    if driver is None:
        return "no-driver", (
            "no NVIDIA driver found (libcuda.so.1 cannot be loaded): this machine has no NVIDIA GPU, "
            "or its driver is not installed"
        )
    drv, init, devices = driver.get("version"), driver.get("init"), driver.get("devices")
    drv_text = f"NVIDIA driver for CUDA {_cuda_version(drv)}" if drv else "NVIDIA driver"
    if init == _CUDA_ERROR_NO_DEVICE or devices == 0:
        return "no-device", (
            f"the {drv_text} is installed but sees no GPU (check CUDA_VISIBLE_DEVICES, "
            "and that the device is present: nvidia-smi)"
        )
    if init not in (None, 0):
        return "driver-failed", (
            f"the {drv_text} is installed but does not start (cuInit returned CUresult {init}; try nvidia-smi)"
        )
    too_old = "InsufficientDriver" in what or "insufficient" in what
    if too_old and drv and runtime_version and drv < runtime_version:
        major = drv // 1000
        other = (
            f', or install the cuda{major} extra (pip install ".[cuda{major}]" from the cupy_swap checkout)'
            if f"cuda{major}" in INSTALL_EXTRAS and major != runtime_version // 1000
            else ""
        )
        return "driver-too-old", (
            f"the {drv_text} is older than the CUDA {_cuda_version(runtime_version)} runtime CuPy uses: "
            f"upgrade the driver{other}"
        )
    return "unavailable", what


def explain_no_gpu(what: str, driver, runtime_version) -> str:
    """Why no GPU answered (``what``: a CUDA error's text or
    ``gpu_status``'s reason), given :func:`probe_driver`'s ``driver`` and
    :func:`runtime_version`: the cause and the fix, or ``what`` itself when
    the probe adds nothing."""
    return _diagnose(what, driver, runtime_version)[1]


def no_gpu_message(what: str) -> str:
    """:func:`explain_no_gpu` of ``what``, probing now."""
    return explain_no_gpu(what, probe_driver(), runtime_version())


def _unavailable_status(exc: BaseException):
    """The availability code of a CuPy CUDA error (matched by class name: CuPy
    need not import), or None."""
    if type(exc).__name__ not in _CUDA_ERROR_CLASSES:
        return None
    status = getattr(exc, "status", None)
    if isinstance(status, int):
        return status if status in _UNAVAILABLE_STATUS else None
    text = str(exc)  # no status: go by the error's name, which CuPy puts first
    return next((code for code, name in _UNAVAILABLE_STATUS.items() if text.startswith(name)), None)


def cuda_unavailable_error(exc: BaseException, what: str | None = None) -> CudaUnavailableError | None:
    """The :class:`CudaUnavailableError` (not raised, no ``__cause__``) that
    ``exc`` stands for: a CuPy CUDA error whose code means CUDA cannot be
    used here, or the ImportError of CuPy; else None.  ``what`` names the
    failed call (e.g. ``"BlockSwapper()"``) at the start of the message."""
    if isinstance(exc, ImportError):
        package = (getattr(exc, "name", None) or "").split(".")[0]
        if package not in ("cupy", "cupy_backends", "cupyx") and "CuPy" not in str(exc):
            return None
        reason, text = "no-cupy", cupy_missing_message(exc)
    elif _unavailable_status(exc) is not None:
        reason, text = _diagnose(str(exc), probe_driver(), runtime_version())
    else:
        return None
    return CudaUnavailableError(f"{what}: {text}" if what else text, reason)


@contextmanager
def translate_unavailable(what: str):
    """Context manager or decorator: raise :class:`CudaUnavailableError`
    (naming the call ``what``, e.g. ``"BlockSwapper()"``) from an exception
    that means CUDA cannot be used here; let any other one through."""
    try:
        yield
    except CudaUnavailableError:
        raise
    except Exception as e:
        err = cuda_unavailable_error(e, what)
        if err is None:
            raise
        raise err from e
