"""Host pools at production size: allocated (or opened), placed on the GPU's
NUMA node, and pinned in chunks, in the background if asked.

**Invariant.**  Every argument is checked before anything is allocated or
registered.  A pool this module allocates (``pin_pool``, ``pin_shared``) is
owned by one buffer object that NumPy arrays keep alive; once every array
and handle over it is gone, the releaser thread unpublishes it, waits for the
work queued on every GPU the process uses (:mod:`cupy_swap.cuda.release`),
unregisters its pinned chunks and only then unmaps it.  ``pin_array`` pins
memory the caller owns: :meth:`PinnedArrayPool.unregister` undoes it.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import functools
import math
import mmap
import os

import numpy as np

from ..cuda import capture, memory, release, shared
from ..cuda.availability import translate_unavailable
from . import numa
from .chunks import plan_chunks
from .handle import PinHandle
from .pools import PINNED, PoolRecord, registry
from .settings import chunk_bytes as chunk_setting
from .settings import parse_bytes

_TOUCH_THREADS = max(1, min(8, (os.cpu_count() or 2) // 2))
_TOUCH_SLICE = 256 << 20


def first_touch(start: int, nbytes: int) -> None:
    """Fault in fresh anonymous memory ``[start, start + nbytes)`` (zeros over
    zeros) with a few threads (``memset`` through ctypes drops the GIL), so
    the chunk's ``cudaHostRegister`` that follows holds the driver only to
    pin present pages (H200 host: 0.40 s/GiB untouched, 0.036 pre-touched,
    benchmarks/HOSTPOOLS.md).  The NUMA policy bound before applies."""
    slices = [(a, min(_TOUCH_SLICE, start + nbytes - a)) for a in range(start, start + nbytes, _TOUCH_SLICE)]
    if len(slices) == 1 or _TOUCH_THREADS == 1:
        for a, n in slices:
            ctypes.memset(a, 0, n)
        return
    with concurrent.futures.ThreadPoolExecutor(_TOUCH_THREADS, thread_name_prefix="cupy_swap-touch") as pool:
        list(pool.map(lambda s: ctypes.memset(s[0], 0, s[1]), slices))


def _check_common(device, chunk_bytes, background, progress):
    if device is not None and (isinstance(device, bool) or not isinstance(device, int) or device < 0):
        raise ValueError(f"device: expected None or a GPU index >= 0, got {device!r}")
    size = chunk_setting() if chunk_bytes is None else parse_bytes(chunk_bytes, "chunk_bytes")
    if not isinstance(background, bool):
        raise TypeError(f"background: expected True or False, got {background!r}")
    if progress is not None and not callable(progress):
        raise TypeError(f"progress: expected None or a callable taking a Progress, got {progress!r}")
    return size


def _shape_dtype(shape, dtype):
    shape = memory._normalize_shape(shape)
    dtype = np.dtype(dtype)
    if dtype.hasobject:
        raise TypeError(f"dtype: expected a plain data type, got {dtype}")
    if len(shape) == 0 or math.prod(shape) * dtype.itemsize == 0:
        raise ValueError(
            f"shape: expected at least one block of at least one byte, got shape {shape} of {dtype}"
        )
    return shape, dtype


def _describe(nbytes: int, chunks: int, name: str | None = None) -> str:
    kind = f"shared pool {name!r}" if name else "host pool"
    return f"{kind} ({nbytes / 2**30:.2f} GiB, {chunks} chunk{'s' if chunks != 1 else ''})"


def _current_device() -> int:
    return memory._runtime().getDevice()


class _PoolBuffer:
    """Owner of one mapping pinned in chunks, exposed to NumPy; ``keep`` is
    the memory behind it (an ``mmap``, unmapped after the chunks are
    unpinned, or the caller's array, kept alive until then)."""

    def __init__(self, keep, ptr: int, shape, dtype, record: PoolRecord, device: int, what: str):
        self.record = record
        self.__array_interface__ = memory.array_interface(ptr, shape, dtype)
        self._finalizer = release.when_dropped(
            self, functools.partial(_release_pool, record, keep, device), None, what
        )


def _release_pool(record: PoolRecord, keep, device: int) -> None:
    """On the releaser thread: unpublish, wait for every GPU in use, unpin
    each pinned chunk, then unmap (never before: CUDA would keep a
    registered range with nothing behind it)."""
    with capture.relaxed():  # the releaser is relaxed for good; said here for the capture rule's test
        pinned = [c for c, s in zip(record.chunks, record.states) if s == PINNED]
        for c in pinned:
            memory._registry.remove(c.start)
        registry.remove(record)
        try:
            if pinned:
                memory.wait_for_gpus_in_use()
                memory._runtime().setDevice(device)
            for c in pinned:
                memory._runtime().hostUnregister(c.start)
        except BaseException:
            release.keep_for_process(keep)  # a GPU may still use the pages, or CUDA holds them: never unmap
            raise
        if isinstance(keep, mmap.mmap):
            keep.close()


def _pin(
    mm, ptr, shape, dtype, device, placement, size, background, progress, name=None, keep=None, touch=None
):
    rows, row_bytes = shape[0], math.prod(shape[1:]) * dtype.itemsize
    chunks = plan_chunks(ptr, rows, row_bytes, size, mmap.PAGESIZE)
    what = _describe(rows * row_bytes, len(chunks), name)
    record = PoolRecord(ptr, rows, row_bytes, chunks, what)
    release.start()
    registry.add(record)
    buf = _PoolBuffer(mm if keep is None else keep, ptr, shape, dtype, record, device, what)
    handle = PinHandle(np.asarray(buf), record, buf, device, placement, progress, touch)
    if keep is not None:  # the caller's memory: pinned as long as the handle lives
        handle._keep = buf
        handle.array = keep
    handle._start(background)
    if not background and handle.error is not None:
        raise handle.error
    return handle


@translate_unavailable("pin_pool()")
def pin_pool(
    shape,
    dtype="float32",
    *,
    device=None,
    numa_policy="auto",
    chunk_bytes=None,
    background: bool = False,
    progress=None,
) -> PinHandle:
    """A zero-filled host pool, placed on the NUMA node of GPU ``device`` and
    pinned (portable, mapped) in chunks cut at block-row boundaries.

    Parameters
    ----------
    shape : int or tuple of int
        ``(num_blocks, ...)``: axis 0 indexes blocks (rows).
    dtype : numpy dtype-like
    device : int, optional
        The GPU that uses the pool (the current one by default): its NUMA
        node, and the context the registrations are made in.
    numa_policy : {"auto", "off"} or int or list of int
        ``"auto"``: the GPU's node (nothing on a one-node machine); ``"off"``;
        or the node(s) to use.
    chunk_bytes : int or str, optional
        Most bytes per ``cudaHostRegister`` (default: :func:`chunk_bytes`,
        64 GiB, or ``CUPY_SWAP_PIN_CHUNK_BYTES``).
    background : bool
        False: pin now and return when done (a failure raises).  True: return
        at once; a thread pins chunk after chunk (``handle.wait(timeout)``).
    progress : callable, optional
        Called with a :class:`Progress` after each chunk (in the registering
        thread).

    Returns
    -------
    PinHandle
        ``handle.array`` is the pool, shape ``shape``.

    Raises
    ------
    PinError
        ``background=False`` and a chunk could not be pinned.
    """
    size = _check_common(device, chunk_bytes, background, progress)
    shape, dtype = _shape_dtype(shape, dtype)
    device = _current_device() if device is None else device
    placement = numa.placement_for([device], shared=False, numa=numa_policy)
    nbytes = math.prod(shape) * dtype.itemsize
    try:
        mm = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except OSError as e:
        raise MemoryError(f"shape: a host pool of {nbytes} bytes could not be mapped ({e})") from None
    ptr = ctypes.addressof(ctypes.c_char.from_buffer(mm))
    if hasattr(mmap, "MADV_HUGEPAGE"):  # transparent huge pages where the kernel allows: 512x fewer faults
        try:
            mm.madvise(mmap.MADV_HUGEPAGE)
        except OSError:
            pass
    placement = numa.bind_range(ptr, nbytes, placement)  # before the first touch
    return _pin(mm, ptr, shape, dtype, device, placement, size, background, progress, touch=first_touch)


@translate_unavailable("pin_shared()")
def pin_shared(
    name: str,
    shape,
    dtype="float32",
    *,
    create: bool = False,
    mode: int = 0o600,
    devices=None,
    numa_policy="auto",
    chunk_bytes=None,
    background: bool = False,
    progress=None,
) -> PinHandle:
    """:func:`cupy_swap.shared_pinned`, pinned in chunks (and in the
    background if asked); the creator interleaves the pages over the NUMA
    nodes of ``devices`` (the GPUs of the processes that share it; default:
    every GPU) before they are first touched.  Arguments and errors as
    :func:`cupy_swap.shared_pinned` and :func:`pin_pool`."""
    size = _check_common(None, chunk_bytes, background, progress)
    shape, dtype = _shape_dtype(shape, dtype)
    device = _current_device()
    if devices is not None:
        try:
            devices = list(devices)
        except TypeError:
            devices = [devices]
        if not devices or any(isinstance(d, bool) or not isinstance(d, int) or d < 0 for d in devices):
            raise ValueError(f"devices: expected None or GPU indices >= 0, got {devices!r}")
    if create:
        if devices is None:
            devices = list(range(memory._runtime().getDeviceCount()))
        placement = numa.placement_for(list(devices), shared=True, numa=numa_policy)
        with numa.thread_policy(placement) as placement:  # the fallocate touches the pages
            mm, nbytes = shared.open_segment(name, shape, dtype, True, mode)
    else:
        placement = numa.Placement("none", (), "opened: placed by its creator")
        mm, nbytes = shared.open_segment(name, shape, dtype, False, mode)
    ptr = ctypes.addressof(ctypes.c_char.from_buffer(mm)) + shared.HEADER_BYTES
    try:
        return _pin(mm, ptr, shape, dtype, device, placement, size, background, progress, name)
    except BaseException:
        if create:
            shared.unlink_shared(name, missing_ok=True)
        raise


@translate_unavailable("pin_array()")
def pin_array(
    array: np.ndarray, *, device=None, chunk_bytes=None, background: bool = False, progress=None
) -> PinHandle:
    """Pin existing C-contiguous NumPy memory in chunks (as
    :func:`cupy_swap.register_host`, for pools of any size).  The pages are
    where the caller's allocation put them.  The memory stays pinned (and
    ``array`` alive) as long as the handle lives; once it is dropped, the
    chunks are unpinned after the GPU work queued by then has completed."""
    size = _check_common(device, chunk_bytes, background, progress)
    if not isinstance(array, np.ndarray):
        raise TypeError(f"array: expected a numpy.ndarray, got {type(array).__name__}")
    if not array.flags.c_contiguous or array.ndim == 0 or array.nbytes == 0:
        raise ValueError(
            f"array: expected a non-empty C-contiguous array with a block axis, got shape {array.shape}, "
            f"strides {array.strides}"
        )
    ptr = array.ctypes.data
    if memory._registry.find(ptr, 1) is not None or registry.find(ptr, ptr + array.nbytes) is not None:
        raise ValueError(
            f"array: expected memory not yet pinned, got a range at {ptr:#x} cupy_swap already pinned"
        )
    device = _current_device() if device is None else device
    placement = numa.Placement("none", (), "existing memory: pages stay where they were allocated")
    return _pin(
        None, ptr, array.shape, array.dtype, device, placement, size, background, progress, keep=array
    )
