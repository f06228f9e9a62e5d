"""Page-locked host memory and the device alias that kernels use to reach it
(read from ``cudaPointerGetAttributes``).  Memory this module allocates or
registers is kept in a sorted registry, so finding an array's alias costs a
bisection, not a driver call.
"""

from __future__ import annotations

import functools
import math
import mmap
import os
import threading
from typing import NamedTuple

import numpy as np

from . import capture, driver, release
from .availability import translate_unavailable
from .spans import Spans

# cudaHostAllocPortable | cudaHostAllocMapped, and the same bits for
# cudaHostRegister: usable from every device, mapped into their address space.
_PORTABLE_MAPPED = 0x1 | 0x2
_MEMORY_TYPE_HOST = 1


def uva_disabled_by_env() -> bool:
    """``CUPY_SWAP_DISABLE_UVA=1``: act as if host memory could not be mapped."""
    return os.environ.get("CUPY_SWAP_DISABLE_UVA", "") not in ("", "0")


_mapping_status: dict[int, tuple[bool, str]] = {}


def host_mapping_status(device: int) -> tuple[bool, str]:
    """``(mapped, why)``: whether kernels on ``device`` can reach pinned host
    memory through a device alias (cached per device; the environment
    variable is read every time)."""
    if uva_disabled_by_env():
        return False, "CUPY_SWAP_DISABLE_UVA is set"
    status = _mapping_status.get(device)
    if status is None:
        runtime = _runtime()
        if not runtime.deviceGetAttribute(runtime.cudaDevAttrUnifiedAddressing, device):
            status = (False, f"GPU {device} has no unified addressing")
        elif not runtime.deviceGetAttribute(runtime.cudaDevAttrCanMapHostMemory, device):
            status = (False, f"GPU {device} cannot map host memory")
        else:
            status = (True, "unified addressing and host-memory mapping available")
        _mapping_status[device] = status
    return status


def host_pinned_unmapped(ptr: int) -> bool:
    """True when ``ptr`` is page-locked host memory (mapped or not)."""
    if _registry.holding(ptr, ptr + 1) is not None:
        return True
    return _runtime().pointerGetAttributes(ptr).type == _MEMORY_TYPE_HOST


class _Range(NamedTuple):
    """One pinned host range that cupy_swap allocated or registered."""

    start: int
    end: int
    alias_offset: int | None  # device alias minus host address; None: unmapped
    owned: bool  # released by cupy_swap (empty_pinned, shared_pinned) vs register_host


_registry = Spans()  # _Range records
_generation = [0]


def generation() -> int:
    """Bumped when existing memory is registered or unregistered: cached
    layouts resolve their host aliases again."""
    return _generation[0]


def _runtime():
    from cupy.cuda import runtime

    return runtime


def _device_alias(ptr: int) -> int:
    """Device address of pinned host address ``ptr`` (0 if not pinned/mapped)."""
    attrs = _runtime().pointerGetAttributes(ptr)
    return int(attrs.devicePointer) if attrs.type == _MEMORY_TYPE_HOST else 0


class _PinnedBuffer:
    """Owner of one cudaHostAlloc allocation, exposed to NumPy; freed by the
    releaser once every array on it is gone.  ``only_gpu``: see
    :func:`zeros_pinned_for_gpu`."""

    def __init__(self, shape, dtype, only_gpu: int | None = None):
        shape, dtype = _normalize_shape(shape), np.dtype(dtype)
        release.start()
        runtime = _runtime()
        nbytes = math.prod(shape) * dtype.itemsize
        caller_device = runtime.getDevice()
        device = caller_device if only_gpu is None else only_gpu
        runtime.setDevice(device)
        try:
            # cudaHostAlloc(0) fails; keep a one-byte allocation behind empty arrays.
            with capture.relaxed():  # legal while another thread captures
                ptr = runtime.hostAlloc(max(nbytes, 1), _PORTABLE_MAPPED)
                try:
                    alias = _device_alias(ptr)
                except Exception:
                    runtime.freeHost(ptr)
                    raise
        finally:
            runtime.setDevice(caller_device)
        _registry.add(
            ptr, ptr + max(nbytes, 1), _Range(ptr, ptr + max(nbytes, 1), alias - ptr if alias else None, True)
        )
        free = functools.partial(release_owned, ptr, runtime.freeHost, device, only_gpu is None)
        self._finalizer = release.when_dropped(self, free, None, f"pinned buffer {ptr:#x}")
        self.__array_interface__ = array_interface(ptr, shape, dtype)


def array_interface(ptr: int, shape: tuple[int, ...], dtype: np.dtype) -> dict:
    """``__array_interface__`` of a C-contiguous array at host address ``ptr``."""
    return {"shape": shape, "typestr": dtype.str, "descr": dtype.descr, "data": (ptr, False), "version": 3}


# One private page of this process, registered and unregistered by
# wait_for_gpus_in_use (under the lock: a page is registered once at a time).
_wait_page: list = []
_wait_lock = threading.Lock()


def _after_fork_in_child() -> None:
    # A fork while another thread waited would leave the child a held lock.
    global _wait_lock
    _wait_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


# Run first by wait_for_gpus_in_use: slots.py adds the wait for ring slots that calls have
# taken and not launched yet, so a launch that resolved the old aliases is queued before
# the GPU wait (a call that takes a slot after the generation bump sees it and goes back);
# streams.py then waits for every swap event handed out (CUDA's documented wait).
before_unpin: list = []


def wait_for_gpus_in_use() -> None:
    """Return once the work queued on every GPU this process uses when the
    call starts has completed (the last GPU is left current).  Call it in
    relaxed capture mode.

    The frees alone wait for one GPU only (``cudaFreeHost``: the allocating
    one; ``cudaHostUnregister``: the current one; two H200s,
    benchmarks/probes/free_host_probe.py).  Unregistering a private page
    with each GPU current waits for it and, unlike ``cudaDeviceSynchronize``,
    leaves another thread's capture valid (benchmarks/probes/capture_probe.py).
    Raises RuntimeError when the GPUs in use cannot be listed or a wait
    fails (the page is then set aside).
    """
    for hook in before_unpin:
        hook()
    runtime = _runtime()
    with _wait_lock:
        if not _wait_page:
            _wait_page.append(mmap.mmap(-1, mmap.PAGESIZE))  # its own page: never registered by anyone else
        ptr = np.frombuffer(_wait_page[0], np.uint8).ctypes.data
        for device in driver.devices_in_use():
            runtime.setDevice(device)
            runtime.hostRegister(ptr, mmap.PAGESIZE, _PORTABLE_MAPPED)
            try:
                runtime.hostUnregister(ptr)  # waits for the work queued on this GPU
            except BaseException:
                release.keep_for_process(_wait_page.pop())  # may still be registered: never reuse or unmap
                raise


def release_owned(ptr: int, free, device: int | None = None, every_gpu: bool = True) -> None:
    """On the releaser thread, once every array over an owned range is gone:
    unpublish it, wait for every GPU in use (with ``every_gpu`` False, the
    free's own wait for ``device`` is enough), then ``free(ptr)`` with
    ``device`` current (tests/test_lifetimes_gpu.py, tests/test_multi_gpu.py)."""
    _registry.remove(ptr)  # owned ranges: no array over them, so no cached layout (no generation bump)
    try:
        if every_gpu:
            wait_for_gpus_in_use()
    except BaseException:
        release.keep_for_process(free)  # a GPU may still use the memory: never free or unmap it
        raise
    if device is not None:  # the allocating thread's GPU: no context made on another one
        _runtime().setDevice(device)
    free(ptr)


def release_dropped(timeout: float | None = None) -> bool:
    """Wait until the memory dropped so far has been released (it is soon
    anyway), e.g. before measuring free memory.  False if ``timeout``
    seconds passed first."""
    return release.drain(timeout)


def register_range(ptr: int, nbytes: int, owned: bool = False) -> int:
    """Page-lock and publish ``[ptr, ptr + nbytes)``; its device alias (0: not
    mapped).  ``owned`` (a shared pool): :func:`unregister_host` refuses it."""
    release.start()
    runtime = _runtime()
    with capture.relaxed():  # legal while another thread captures
        runtime.hostRegister(ptr, nbytes, _PORTABLE_MAPPED)
        try:
            alias = _device_alias(ptr)
        except Exception:
            runtime.hostUnregister(ptr)
            raise
    _registry.add(ptr, ptr + nbytes, _Range(ptr, ptr + nbytes, alias - ptr if alias else None, owned))
    return alias


def _normalize_shape(shape) -> tuple[int, ...]:
    if isinstance(shape, (int, np.integer)):
        shape = (int(shape),)
    try:
        shape = tuple(int(s) for s in shape)
    except TypeError:
        raise TypeError(f"shape: expected an int or a sequence of ints, got {shape!r}") from None
    if any(s < 0 for s in shape):
        raise ValueError(f"shape: expected non-negative sizes, got {shape}")
    return shape


@translate_unavailable("empty_pinned()")
def empty_pinned(shape, dtype="float32") -> np.ndarray:
    """Allocate an uninitialized NumPy array in page-locked, portable, mapped
    host memory, sized exactly (no pool, no power-of-two rounding).

    Parameters
    ----------
    shape : int or tuple of int
        Array shape, e.g. ``(num_blocks, 16, 8, 128)`` for a KV-cache layer.
    dtype : numpy dtype-like
        Element type.

    Returns
    -------
    numpy.ndarray
        C-contiguous array of ``shape``; the memory is freed when the array and
        every view of it are gone.
    """
    return np.asarray(_PinnedBuffer(shape, dtype))


@translate_unavailable("zeros_pinned()")
def zeros_pinned(shape, dtype="float32") -> np.ndarray:
    """Like :func:`empty_pinned`, filled with zeros."""
    # Undecorated, so that a failure is named zeros_pinned(), not empty_pinned().
    a = empty_pinned.__wrapped__(shape, dtype)
    a.fill(0)
    return a


def zeros_pinned_for_gpu(shape, dtype, device: int) -> np.ndarray:
    """Zeroed pinned memory only GPU ``device``'s work touches (ring
    rows, status words): allocated with it current, its ``cudaFreeHost``
    waits for that GPU alone, not holding up the others' swap calls
    (benchmarks/probes/release_lock_probe.py)."""
    a = np.asarray(_PinnedBuffer(shape, dtype, only_gpu=device))
    a.fill(0)
    return a


def _contiguous_span(array: np.ndarray, name: str) -> tuple[int, int]:
    if not isinstance(array, np.ndarray):
        raise TypeError(f"{name}: expected a numpy.ndarray, got {type(array).__name__}")
    if not (array.flags.c_contiguous or array.flags.f_contiguous):
        raise ValueError(
            f"{name}: expected a contiguous array (one memory range), got strides {array.strides}"
        )
    return array.ctypes.data, array.nbytes


@translate_unavailable("register_host()")
def register_host(array: np.ndarray) -> None:
    """Page-lock existing NumPy memory (``cudaHostRegister``, portable and
    mapped) so swaps can read and write it.

    Meant for large, long-lived pools, e.g. a host KV cache allocated once.
    Registration is costly (it touches every page); call it once per pool and
    :func:`unregister_host` before the memory is freed.

    Parameters
    ----------
    array : numpy.ndarray
        Contiguous array; its whole byte range is registered.
    """
    ptr, nbytes = _contiguous_span(array, "array")
    if nbytes == 0:
        raise ValueError("array: expected at least one byte to register, got an empty array")
    if _registry.holding(ptr, ptr + 1) is not None:
        raise ValueError(
            f"array: expected memory not yet pinned, got a range starting at {ptr:#x} that cupy_swap "
            f"already pinned (empty_pinned or register_host)"
        )
    register_range(ptr, nbytes)
    _generation[0] += 1  # a layout cached while this memory was pageable resolves again


def unregister_host(array: np.ndarray) -> None:
    """Undo :func:`register_host` for the same array (same start address).

    The range is unpublished (a later swap on it raises), the call waits for
    the work queued on every GPU this process uses (leaving another thread's
    capture valid), then unpins it.  If CUDA refuses, the range is published
    again, so the call can be retried.  Do not replay graphs that swap to or
    from the range afterwards.

    Raises
    ------
    ValueError
        ``array`` does not start a range passed to :func:`register_host`.
    RuntimeError
        CUDA could not unpin the range (it stays registered).
    """
    ptr, _ = _contiguous_span(array, "array")
    r = _registry.holding(ptr, ptr + 1)
    if r is None or r.start != ptr or r.owned:
        raise ValueError(
            "array: expected an array passed to cupy_swap.register_host (same start address); "
            "empty_pinned and shared_pinned memory is released when its arrays are gone"
        )
    if _registry.remove(ptr) is None:  # unpublish (another thread may have been first)
        raise ValueError("array: expected a registered range, got one another call just unregistered")
    _generation[0] += 1  # cached layouts resolve their host aliases again
    runtime = _runtime()
    try:
        caller_device = runtime.getDevice()
        with capture.relaxed():
            try:
                wait_for_gpus_in_use()
            finally:
                runtime.setDevice(caller_device)
            runtime.hostUnregister(ptr)
    except BaseException as e:
        _registry.add(r.start, r.end, r)  # still pinned: publish it again
        if not isinstance(e, Exception):
            raise  # KeyboardInterrupt and the like: as they came
        raise RuntimeError(
            f"array: could not unpin the range at {ptr:#x} ({type(e).__name__}: {e}); it stays registered"
        ) from e


@translate_unavailable("is_pinned()")
def is_pinned(array) -> bool:
    """True if every byte ``array`` spans (any strides, negative ones
    included) lies in one page-locked host range mapped for the GPU.

    Parameters
    ----------
    array : numpy.ndarray, CPU torch tensor, or an object with ``__array_interface__``
        A host array; a tensor answers as its NumPy view does (of any
        dtype, bfloat16 included: only its bytes are looked at).

    Raises
    ------
    TypeError
        ``array`` is no host array (a GPU array or CUDA tensor, a list...).
    """
    low, high = byte_span(_host_array(array, "array"))
    return host_alias(low, high - low) != 0


def _host_array(obj, name: str) -> np.ndarray:
    """NumPy's view of a host array (no copy), or TypeError naming ``name``."""
    if isinstance(obj, np.ndarray):
        return obj
    import sys

    expected = f"{name}: expected a host array (a NumPy array, a CPU torch tensor or an object with __array_interface__)"
    torch = sys.modules.get("torch")  # a caller passing a tensor has imported torch
    if torch is not None and isinstance(obj, torch.Tensor):
        if obj.device.type != "cpu":
            raise TypeError(f"{expected}, got a torch tensor on {obj.device}, which is not host memory")
        from .arrays import convert_array

        view = convert_array(obj, name)  # a NumPy array, or a TypedView for a type NumPy lacks
        return getattr(view, "array", view)
    from ..core.parts import readable

    if readable(obj, "__cuda_array_interface__", name):
        raise TypeError(f"{expected}, got a GPU array ({type(obj).__name__}), which is not host memory")
    if readable(obj, "__array_interface__", name):
        return np.asarray(obj)
    raise TypeError(f"{expected}, got {type(obj).__name__}")


# ``(low, high)`` host addresses of the bytes an array can touch, any strides
# (NumPy 2 moved it from ``numpy.byte_bounds``).
byte_span = getattr(getattr(np.lib, "array_utils", None), "byte_bounds", None) or np.byte_bounds


def host_alias(ptr: int, nbytes: int) -> int:
    """Device address of host range ``[ptr, ptr + nbytes)``, or 0 when it is
    not in mapped page-locked memory (the registry first, then the driver for
    other pinned memory: ``cupyx.empty_pinned``, torch's ``pin_memory()``)."""
    r = _registry.holding(ptr, ptr + max(nbytes, 1))
    if r is not None:
        return 0 if r.alias_offset is None else ptr + r.alias_offset
    first = _device_alias(ptr)
    if not first or nbytes <= 1:
        return first
    # Both ends must sit in one mapped allocation (same alias offset), or part
    # of the range is pageable or registered separately.
    last = _device_alias(ptr + nbytes - 1)
    return first if last - (ptr + nbytes - 1) == first - ptr else 0
