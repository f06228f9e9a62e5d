"""Host pools at production size: allocated (or opened), placed on the GPU's
NUMA node, and pinned in chunks, in the background if asked.

**Invariant.**  Every argument is checked before anything is allocated or
registered.  A pool this module allocates (``pin_pool``, ``pin_shared``) is
owned by one buffer object that NumPy arrays keep alive; once every array
and handle over it is gone, the releaser thread unpublishes it, waits for the
work queued on every GPU the process uses (:mod:`cupy_swap.cuda.release`),
unregisters its pinned chunks and only then unmaps it.  ``pin_array`` pins
memory the caller owns for as long as its handle lives: dropping the handle
retires the pool at once (:mod:`.pools`: an op over it raises at its next
call, never launches over it) and unpins it on the releaser thread.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import functools
import math
import mmap
import os
import weakref

import numpy as np

from ..cuda import capture, memory, release
from ..cuda.availability import translate_unavailable
from ..cuda.pools import PINNED, PoolRecord, registry
from . import numa, shared
from .chunks import plan_chunks
from .handle import PinHandle
from .settings import chunk_bytes as chunk_setting
from .settings import parse_bytes

_TOUCH_THREADS = max(1, min(8, (os.cpu_count() or 2) // 2))
_TOUCH_SLICE = 256 << 20
_REPIN_WAIT_S = 60.0  # pin_array of memory whose dropped handle is still being unpinned


_MADV_POPULATE_WRITE = 23  # Linux 5.14: fault pages in writable without writing them
_libc = ctypes.CDLL(None, use_errno=True)


def _populate(start: int, nbytes: int) -> bool:
    """``madvise(MADV_POPULATE_WRITE)`` over the pages of ``[start, start +
    nbytes)`` (dropping the GIL); False where the kernel lacks it."""
    lo = start - start % mmap.PAGESIZE
    return _libc.madvise(ctypes.c_void_p(lo), ctypes.c_size_t(start + nbytes - lo), _MADV_POPULATE_WRITE) == 0


def first_touch(start: int, nbytes: int) -> None:
    """Fault in the pages of ``[start, start + nbytes)`` with a few threads,
    leaving every byte as it is (the caller may be filling a pool that pins
    in the background), so the chunk's ``cudaHostRegister`` that follows
    holds the driver only to pin present pages (H200 host: 0.40 s/GiB
    untouched, 0.036 pre-touched, benchmarks/HOSTPOOLS.md).  The NUMA policy
    bound before applies.  Where the kernel cannot populate (before Linux
    5.14), nothing is touched and the registration faults the pages in."""
    slices = [(a, min(_TOUCH_SLICE, start + nbytes - a)) for a in range(start, start + nbytes, _TOUCH_SLICE)]
    if not _populate(*slices[0]):
        return
    if len(slices) == 1 or _TOUCH_THREADS == 1:
        for a, n in slices[1:]:
            _populate(a, n)
        return
    with concurrent.futures.ThreadPoolExecutor(_TOUCH_THREADS, thread_name_prefix="cupy_swap-touch") as pool:
        list(pool.map(lambda s: _populate(*s), slices[1:]))


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
        record.owner = weakref.ref(self)
        self._finalizer = release.finalizer(self, _retire, record, keep, device, what)


def _retire(record: PoolRecord, keep, device: int, what: str) -> None:
    """When the owner is dropped (a finalizer, in whatever thread dropped it:
    no lock, no CUDA call): retire the pool, so no span of it resolves
    again (the generation bump makes ops resolve again), then queue its
    release."""
    record.retired = True
    memory._generation[0] += 1
    release.defer(functools.partial(_release_pool, record, keep, device), None, what)


def _release_pool(record: PoolRecord, keep, device: int) -> None:
    """On the releaser thread, after :func:`_retire`: wait for every GPU in
    use, unpin each pinned chunk, unpublish, then unmap (never before: CUDA
    would keep a registered range with nothing behind it)."""
    with capture.relaxed():  # the releaser is relaxed for good; said here for the capture rule's test
        pinned = [c for c, s in zip(record.chunks, record.states) if s == PINNED]
        for c in pinned:
            memory._registry.remove(c.start)  # its chunks' own ranges (is_pinned of a view)
        try:
            if pinned:
                memory.wait_for_gpus_in_use()
                memory._runtime().setDevice(device)
            for c in pinned:
                memory._runtime().hostUnregister(c.start)
        except BaseException:
            release.keep_for_process(keep)  # a GPU may still use the pages, or CUDA holds them: never unmap
            raise  # stays published, retired: never resolved, never pinned over
        registry.remove(record.base, record)
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
    registry.add(record.base, record.end, record)
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
    ``array`` alive) as long as the handle lives.  Once it is dropped, an op
    over the array raises a clear ``ValueError`` at its next call (it never
    launches over it), and the chunks are unpinned after the GPU work queued
    by then has completed.  A captured swap over the array keeps it pinned
    for the life of the process, as it keeps its other arrays."""
    size = _check_common(device, chunk_bytes, background, progress)
    if not isinstance(array, np.ndarray):
        raise TypeError(f"array: expected a numpy.ndarray, got {type(array).__name__}")
    if not array.flags.c_contiguous or array.ndim == 0 or array.nbytes == 0:
        raise ValueError(
            f"array: expected a non-empty C-contiguous array with a block axis, got shape {array.shape}, "
            f"strides {array.strides}"
        )
    ptr = array.ctypes.data
    pool = registry.overlapping(ptr, ptr + array.nbytes)
    if pool is not None and pool.retired:  # an earlier handle was dropped: let its unpinning finish
        release.drain(timeout=_REPIN_WAIT_S)
        pool = registry.overlapping(ptr, ptr + array.nbytes)
        if pool is not None:
            raise ValueError(
                f"array: expected memory not yet pinned, got the {pool.what} at {ptr:#x} whose earlier handle "
                f"was dropped and whose unpinning did not finish within {_REPIN_WAIT_S:.0f} s (it waits for "
                f"the GPUs' queued work; a failed one is in cupy_swap.cuda.release.failures)"
            )
    if memory._registry.holding(ptr, ptr + 1) is not None or pool is not None:
        raise ValueError(
            f"array: expected memory not yet pinned, got a range at {ptr:#x} cupy_swap already pinned"
        )
    device = _current_device() if device is None else device
    placement = numa.Placement("none", (), "existing memory: pages stay where they were allocated")
    return _pin(
        None, ptr, array.shape, array.dtype, device, placement, size, background, progress, keep=array
    )
