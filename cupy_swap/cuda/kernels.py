"""Find, assemble and compile the CUDA sources in ``kernels_cu/``, lazily per
device through ``cupy.RawModule`` (NVRTC).  ``#include "x.cuh"`` lines are
inlined here, so the text CuPy hashes for its disk cache is the whole
program; a content hash also goes into the compile options.
"""

from __future__ import annotations

import hashlib
import re
import threading
from functools import cache
from pathlib import Path

MAIN_SOURCE = "block_swap.cu"
_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"\s*$', re.MULTILINE)


def kernel_dir() -> Path:
    """Folder holding the ``*.cu`` sources: ``cupy_swap/kernels_cu`` in a
    wheel, else the checkout's top-level ``kernels_cu``."""
    here = Path(__file__).resolve().parent.parent  # the cupy_swap package
    for candidate in (here / "kernels_cu", here.parent / "kernels_cu"):
        if (candidate / MAIN_SOURCE).is_file():
            return candidate
    raise FileNotFoundError(
        f"cupy_swap: kernel sources not found (looked for {MAIN_SOURCE} in "
        f"{here / 'kernels_cu'} and {here.parent / 'kernels_cu'}); the installation is incomplete"
    )


def _inline(path: Path, seen: set) -> str:
    if path in seen:
        return ""  # every header has #pragma once semantics
    seen.add(path)
    text = path.read_text()

    def expand(match: re.Match) -> str:
        return f"// ---- {match.group(1)} ----\n" + _inline(path.parent / match.group(1), seen)

    return _INCLUDE.sub(expand, text)


@cache
def kernel_source() -> str:
    """The main kernel file with every quoted include inlined."""
    return _inline(kernel_dir() / MAIN_SOURCE, set())


@cache
def source_hash() -> str:
    """SHA-256 (first 16 hex digits) of the assembled source."""
    return hashlib.sha256(kernel_source().encode()).hexdigest()[:16]


def compile_options() -> tuple[str, ...]:
    """NVRTC options (the content hash makes the cache key visible)."""
    return ("-std=c++17", f"-DCUPY_SWAP_SOURCE_HASH=0x{source_hash()}ull")


def compile_with_nvrtc(arch: str) -> bytes:
    """Compile the sources to a cubin for ``arch`` (e.g. ``"sm_90"``) with
    NVRTC, without a GPU (the CPU tests); RuntimeError with NVRTC's log."""
    from cupy_backends.cuda.libs import nvrtc

    prog = nvrtc.createProgram(kernel_source(), MAIN_SOURCE, [], [])
    try:
        try:
            nvrtc.compileProgram(prog, [f"--gpu-architecture={arch}", *compile_options()])
        except nvrtc.NVRTCError as e:
            raise RuntimeError(f"NVRTC failed for {arch}: {e}\n{nvrtc.getProgramLog(prog)}") from None
        return nvrtc.getCUBIN(prog)
    finally:
        nvrtc.destroyProgram(prog)


_modules: dict[int, object] = {}
_functions: dict[tuple, int] = {}
_lock = threading.Lock()


def _module(device: int):
    mod = _modules.get(device)
    if mod is None:
        import cupy

        with _lock, cupy.cuda.Device(device):
            mod = _modules.get(device)
            if mod is None:
                mod = cupy.RawModule(code=kernel_source(), options=compile_options())
                mod.compile()
                _modules[device] = mod
    return mod


def get_function(device: int, name: str) -> int:
    """``CUfunction`` handle of kernel ``name`` on ``device``, compiled and
    loaded on first use."""
    key = (device, name)
    fn = _functions.get(key)
    if fn is None:
        import cupy

        mod = _module(device)
        with cupy.cuda.Device(device):
            kernel = mod.get_function(name)
            fn = kernel.kernel.ptr
        _functions[key] = fn
        _keep_alive.append(kernel)
    return fn


def load_all(device: int, smem: int) -> None:
    """Every kernel of the module loaded on ``device`` now, each allowed
    ``smem`` bytes of dynamic shared memory (the fetch kernel none), once
    per process and GPU.  CUDA loads kernels lazily (``CUDA_MODULE_LOADING``
    is ``LAZY`` by default since 12.2), and a load waits for the whole
    device: on the H200 a first launch waited out a kernel that held another
    stream (5 s, its limit) under ``LAZY`` and not at all under ``EAGER``
    (NOTES 75), so a swap behind a stream that waits on the host could hang.
    So a swapper loads everything when it is made, and no swap loads a
    kernel."""
    if device in _all_loaded:
        return
    from cupy.cuda import driver as cupy_driver

    from . import abi
    from .driver import load_function

    for name in abi.kernel_names():
        if not has_function(device, name):
            continue  # the largest tier, left out by older compilers
        fn = get_function(device, name)
        load_function(fn)
        if name != abi.FETCH_KERNEL:
            cupy_driver.funcSetAttribute(fn, _MAX_DYNAMIC_SHARED, smem)
    _all_loaded.add(device)


_MAX_DYNAMIC_SHARED = 8  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
_all_loaded: set = set()


def has_function(device: int, name: str) -> bool:
    """True when the compiled module has kernel ``name`` (the slot kernel of
    the most parts needs CUDA 12.1+ and is left out by older compilers)."""
    try:
        get_function(device, name)
    except Exception as e:  # CuPy raises CUDADriverError(CUDA_ERROR_NOT_FOUND)
        if "NOT_FOUND" in str(e) or "not found" in str(e).lower():
            return False
        raise
    return True


_keep_alive: list = []  # RawKernel objects own the loaded functions
