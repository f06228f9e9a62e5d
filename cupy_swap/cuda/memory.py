"""Page-locked host memory and the device alias that kernels use to reach it.

Kernels never dereference a host pointer directly: they read and write host
memory through the device address that CUDA maps it to
(``cudaHostGetDevicePointer``; here read from ``cudaPointerGetAttributes``).
Memory that this module allocates or registers is remembered in a small
registry, so finding the alias of an array inside it costs a bisection, not a
driver call.
"""

from __future__ import annotations

import bisect
import collections
import math
import os
import threading
import weakref

import numpy as np

__all__ = [
    "host_mapping_status",
    "empty_pinned",
    "zeros_pinned",
    "register_host",
    "unregister_host",
    "is_pinned",
    "host_alias",
    "note_swap_device",
    "uva_disabled_by_env",
]

# cudaHostAllocPortable | cudaHostAllocMapped, and the same bits for
# cudaHostRegister: usable from every device, mapped into their address space.
_PORTABLE_MAPPED = 0x1 | 0x2
_MEMORY_TYPE_HOST = 1


def uva_disabled_by_env() -> bool:
    """True when ``CUPY_SWAP_DISABLE_UVA=1`` asks the library to act as if host
    memory could not be mapped (used to test the copy-engine fallback)."""
    return os.environ.get("CUPY_SWAP_DISABLE_UVA", "") not in ("", "0")


_mapping_status: dict[int, tuple[bool, str]] = {}


def host_mapping_status(device: int) -> tuple[bool, str]:
    """Whether kernels on ``device`` can reach pinned host memory through a
    device alias, and why not when they cannot.

    Needs unified addressing and ``canMapHostMemory``; ``CUPY_SWAP_DISABLE_UVA=1``
    forces "no" (to exercise the copy-engine fallback).  Cached per device;
    the environment variable is read every time.
    """
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
    if _registry.find(ptr, 1) is not None:
        return True
    return _runtime().pointerGetAttributes(ptr).type == _MEMORY_TYPE_HOST


class _Range:
    """One pinned host range that cupy_swap allocated or registered."""

    __slots__ = ("start", "end", "alias_offset", "owned")

    def __init__(self, start: int, end: int, alias_offset: int | None, owned: bool):
        self.start = start
        self.end = end
        self.alias_offset = alias_offset  # device alias minus host address; None: unmapped
        self.owned = owned  # released by cupy_swap (empty_pinned, shared_pinned) vs register_host


class _Registry:
    """Sorted, thread-safe set of non-overlapping pinned ranges."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._starts: list[int] = []
        self._ranges: list[_Range] = []

    def add(self, r: _Range) -> None:
        with self._lock:
            i = bisect.bisect_right(self._starts, r.start)
            self._starts.insert(i, r.start)
            self._ranges.insert(i, r)

    def remove(self, start: int) -> _Range | None:
        with self._lock:
            i = bisect.bisect_left(self._starts, start)
            if i < len(self._starts) and self._starts[i] == start:
                self._starts.pop(i)
                return self._ranges.pop(i)
            return None

    def find(self, ptr: int, nbytes: int) -> _Range | None:
        """The range holding all of ``[ptr, ptr + nbytes)``, if any."""
        with self._lock:
            i = bisect.bisect_right(self._starts, ptr) - 1
            if i >= 0:
                r = self._ranges[i]
                if ptr + nbytes <= r.end:
                    return r
            return None


_registry = _Registry()
_generation = [0]


def generation() -> int:
    """Counter bumped whenever a registered range goes away, so cached
    host aliases (see ``BlockSwapper``) know to resolve again."""
    return _generation[0]


def _runtime():
    from cupy.cuda import runtime

    return runtime


def _device_alias(ptr: int) -> int:
    """Device address of pinned host address ``ptr`` (0 if not pinned/mapped)."""
    runtime = _runtime()
    attrs = runtime.pointerGetAttributes(ptr)
    if attrs.type != _MEMORY_TYPE_HOST:
        return 0
    return int(attrs.devicePointer)


class _PinnedBuffer:
    """Owner of one cudaHostAlloc allocation, exposed to NumPy as an array."""

    def __init__(self, shape: tuple[int, ...], dtype: np.dtype):
        release_dropped()
        runtime = _runtime()
        nbytes = math.prod(shape) * dtype.itemsize
        # cudaHostAlloc(0) fails; keep a one-byte allocation behind empty arrays.
        ptr = runtime.hostAlloc(max(nbytes, 1), _PORTABLE_MAPPED)
        try:
            alias = _device_alias(ptr)
        except Exception:
            runtime.freeHost(ptr)
            raise
        _registry.add(_Range(ptr, ptr + max(nbytes, 1), alias - ptr if alias else None, True))
        self._finalizer = weakref.finalize(self, _free_pinned, ptr)
        self.__array_interface__ = array_interface(ptr, shape, dtype)


def array_interface(ptr: int, shape: tuple[int, ...], dtype: np.dtype) -> dict:
    """NumPy's ``__array_interface__`` of a C-contiguous array at host address
    ``ptr``, for an owner object that NumPy then keeps alive as the base."""
    return {
        "shape": shape,
        "typestr": dtype.str,
        "descr": dtype.descr,
        "data": (ptr, False),
        "strides": None,
        "version": 3,
    }


# Buffers whose last reference went away.  The finalizer may run inside a
# garbage collection at any bytecode boundary, including while this very
# thread holds ``_registry._lock`` (Python 3.12+ runs the GC from the eval
# breaker, e.g. right after ``bisect`` returns in ``find``): it must not take
# that lock, so it only queues the pointer (deque.append is atomic) and the
# next registry user frees it.  The memory stays pinned until then, so its
# address cannot be handed out again while the registry still lists it.
_pending_frees: collections.deque = collections.deque()


def _free_pinned(ptr: int) -> None:
    _pending_frees.append((ptr, _free_host))


def _free_host(ptr: int) -> None:
    _runtime().freeHost(ptr)


def release_later(ptr: int, release) -> None:
    """Queue ``release(ptr)`` for a range registered at ``ptr``, to run (after
    the range leaves the registry) at the next registry use: safe to call from
    a finalizer, which may run inside the registry's locked section."""
    _pending_frees.append((ptr, release))


def release_dropped() -> None:
    """Run the queued releases of dropped buffers now (every registry user
    does it first; never call with ``_registry._lock`` held)."""
    while _pending_frees:
        try:
            ptr, release = _pending_frees.popleft()
        except IndexError:
            return
        _registry.remove(ptr)  # owned ranges: every array over them is gone (no generation bump)
        try:
            release(ptr)
        except Exception:  # interpreter shutdown: the driver may already be gone
            pass


def register_range(ptr: int, nbytes: int, owned: bool = False) -> int:
    """Page-lock ``[ptr, ptr + nbytes)`` (``cudaHostRegister``, portable and
    mapped), remember it, and return its device alias (0: not mapped).
    ``owned``: cupy_swap releases it (a shared pool), so
    :func:`unregister_host` refuses it."""
    release_dropped()
    runtime = _runtime()
    runtime.hostRegister(ptr, nbytes, _PORTABLE_MAPPED)
    try:
        alias = _device_alias(ptr)
    except Exception:
        runtime.hostUnregister(ptr)
        raise
    _registry.add(_Range(ptr, ptr + nbytes, alias - ptr if alias else None, owned))
    return alias


def synchronize_swap_devices() -> None:
    """``cudaDeviceSynchronize`` on every GPU a ``BlockSwapper`` was made for:
    after it no queued swap reads or writes host memory."""
    if not _swap_devices:
        return
    runtime = _runtime()
    prev = runtime.getDevice()
    try:
        for device in sorted(_swap_devices):
            runtime.setDevice(device)
            runtime.deviceSynchronize()
    finally:
        runtime.setDevice(prev)


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
    shape = _normalize_shape(shape)
    dtype = np.dtype(dtype)
    return np.asarray(_PinnedBuffer(shape, dtype))


def zeros_pinned(shape, dtype="float32") -> np.ndarray:
    """Like :func:`empty_pinned`, filled with zeros."""
    a = empty_pinned(shape, dtype)
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
    release_dropped()
    if nbytes == 0:
        raise ValueError("array: expected at least one byte to register, got an empty array")
    if _registry.find(ptr, 1) is not None:
        raise ValueError(
            f"array: expected memory not yet pinned, got a range starting at {ptr:#x} that cupy_swap "
            f"already pinned (empty_pinned or register_host)"
        )
    register_range(ptr, nbytes)


# GPUs that BlockSwappers were created for: their queued swaps may still
# read or write registered memory.
_swap_devices: set[int] = set()


def note_swap_device(device: int) -> None:
    """Remember that swaps may be queued on GPU ``device`` (see
    :func:`unregister_host`)."""
    _swap_devices.add(int(device))


def unregister_host(array: np.ndarray) -> None:
    """Undo :func:`register_host` for the same array (same start address).

    Swaps on the memory may still be queued: the call first waits for all
    work queued on every GPU a ``BlockSwapper`` was created for
    (``cudaDeviceSynchronize``), so no queued copy reads or writes the range
    after it is unpinned.  Do not call it while a stream captures a graph,
    and do not replay graphs that swap to or from the range afterwards.
    """
    ptr, _ = _contiguous_span(array, "array")
    release_dropped()
    r = _registry.find(ptr, 1)
    if r is None or r.start != ptr or r.owned:
        raise ValueError(
            "array: expected an array passed to cupy_swap.register_host (same start address); "
            "empty_pinned and shared_pinned memory is released when its arrays are gone"
        )
    synchronize_swap_devices()
    _registry.remove(ptr)
    _generation[0] += 1
    _runtime().hostUnregister(ptr)


def is_pinned(array: np.ndarray) -> bool:
    """True if every byte of ``array`` lies in one page-locked host range
    that is mapped for the GPU (``array`` is assumed contiguous)."""
    ptr, nbytes = array.ctypes.data, array.nbytes
    return host_alias(ptr, nbytes) != 0


def host_alias(ptr: int, nbytes: int) -> int:
    """Device address of host range ``[ptr, ptr + nbytes)``, or 0 when the
    range is not in page-locked memory that is mapped for the GPU.

    Ranges from :func:`empty_pinned` and :func:`register_host` resolve from the
    registry; other pinned memory (``cupyx.empty_pinned``, ``torch``'s
    ``pin_memory()``) is asked of the driver.
    """
    if _pending_frees:
        release_dropped()
    r = _registry.find(ptr, max(nbytes, 1))
    if r is not None:
        return 0 if r.alias_offset is None else ptr + r.alias_offset
    first = _device_alias(ptr)
    if not first or nbytes <= 1:
        return first
    # Both ends must sit in one mapped allocation (same alias offset), or part
    # of the range is pageable or registered separately.
    last = _device_alias(ptr + nbytes - 1)
    return first if last - (ptr + nbytes - 1) == first - ptr else 0
