"""Streams and events: ``stream=`` and ``wait_for=`` arguments as raw handles,
capture status, and the ``SwapEvent`` a swap returns (recycled through
:class:`EventPool`)."""

from __future__ import annotations

import collections
import contextlib
import sys
import threading
import weakref
from typing import NamedTuple

from . import capture

_cls: list = []


def __getattr__(name: str):
    if name == "SwapEvent":  # built on first use: it subclasses CuPy's Event
        return swap_event_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def swap_event_class():
    """``SwapEvent``, a subclass of ``cupy.cuda.Event`` (built on first use
    so importing cupy_swap does not import CuPy)."""
    if _cls:
        return _cls[0]
    import cupy

    class SwapEvent(cupy.cuda.Event):
        """Recorded on the swap's stream after its copies.

        ``synchronize()`` waits, ``done`` polls, and the event can be waited on
        by other streams like any CuPy event.  With ``timing=True`` the swap
        also recorded a start event, and :meth:`device_time` gives the seconds
        between the two on the device.

        Attributes
        ----------
        path : str
            ``"kernel"``, ``"dma"`` or ``"none"`` (empty mapping).
        nbytes : int
            Bytes the swap moves.
        start : cupy.cuda.Event or None
            Recorded before the copies when timing was asked for.
        check : SlotRing, Failure or None
            For a swap whose launch checked its rows, where its verdict is
            found (:mod:`cupy_swap.cuda.outcomes`); ``slot`` is its ring slot.
        seq : int or None
            That swap's number, which its errors name.
        """

        def synchronize(self) -> None:
            """Wait for the swap; when its launch checked the rows, raise the
            error it found (IndexError or ValueError: nothing was copied)."""
            with capture.relaxed():  # legal while another thread captures
                super().synchronize()
            if self.check is not None:
                self.check.raise_on_event(self)

        @property
        def done(self) -> bool:
            """True once the swap has completed (asked in relaxed capture
            mode: legal while another thread captures)."""
            return capture.event_done(self)

        def device_time(self) -> float:
            """Seconds of device time from the swap's start to its end (waits
            for the swap to finish)."""
            if self.start is None:
                raise ValueError(
                    "device_time: this swap was not timed; pass timing=True to swap() "
                    "or create the BlockSwapper with timing=True"
                )
            self.synchronize()
            return cupy.cuda.get_elapsed_time(self.start, self) * 1e-3

        def gbps(self) -> float:
            """Bytes moved over device time, in GB/s (1e9 B/s)."""
            return self.nbytes / self.device_time() / 1e9

    _cls.append(SwapEvent)
    return SwapEvent


class Wait(NamedTuple):
    """One ``wait_for`` entry, ready to enqueue: the event (0: nothing to wait
    for) and what keeps it alive.  (Whether the wait joins a capture is asked
    of the swap's own stream once its waits are enqueued.)"""

    event_ptr: int
    keepalive: object


# An unrecorded torch event (``cuda_event`` 0 until its first record()): torch
# waits for nothing on it, where cudaStreamWaitEvent(0) would fail.
NO_WAIT = Wait(0, None)


# Raw handles of the legacy and per-thread default streams: they act on
# whatever device is current, so for ``wait_for`` they are the caller's.
_DEFAULT_STREAM_HANDLES = (0, 1, 2)


_wait_events = threading.local()


def _thread_wait_event(device: int):
    """This thread's one event for stream waits on ``device``, made once:
    creating an event waits behind a release's device-wide wait (950 ms
    while a release waited 1 s, NOTES 77), re-recording one does not, and a
    wait enqueued earlier keeps the record it saw."""
    events = _wait_events.__dict__.setdefault("by_device", {})
    ev = events.get(device)
    if ev is None:
        ev = events[device] = capture.new_event()
    return ev


def wait_handle(item, device: int | None = None, caller_device: int | None = None) -> Wait:
    """Turn one ``wait_for`` entry into a :class:`Wait`.

    Events are waited on as they are (an unrecorded torch event is
    :data:`NO_WAIT`).  Streams get this thread's wait event recorded on them
    now (enqueue its wait before the next :func:`wait_handle`), on the GPU
    they belong to: a stream object's own, the caller's (``caller_device``)
    for the default streams (handles 0, 1, 2), the swapper's (``device``)
    for other raw handles.
    """
    import cupy

    if isinstance(item, cupy.cuda.Event):
        return Wait(item.ptr, None)
    handle = getattr(item, "cuda_event", None)  # torch.cuda.Event
    if isinstance(handle, int):
        return Wait(handle, None) if handle else NO_WAIT
    try:
        stream = stream_handle(item)
    except TypeError:
        raise TypeError(
            f"wait_for: expected events or streams (CuPy or torch) or raw stream handles, "
            f"got {type(item).__name__}"
        ) from None
    owner = stream_device(item)
    if owner is None:
        default = stream in _DEFAULT_STREAM_HANDLES
        owner = caller_device if default and caller_device is not None else device

    gpu = owner if owner is not None else cupy.cuda.runtime.getDevice()
    with on_device(gpu):
        ev = _thread_wait_event(gpu)  # events are recorded on their own device's streams
        try:
            cupy.cuda.runtime.eventRecord(ev.ptr, stream)
        except cupy.cuda.runtime.CUDARuntimeError as e:
            raise ValueError(
                f"wait_for: could not record an event on stream handle {stream:#x} of GPU {owner} ({e}); "
                f"pass a stream of another GPU as its CuPy or torch object, or an event recorded on it"
            ) from None
    return Wait(ev.ptr, ev)


def torch_stream_getter(device: int):
    """A function returning torch's current stream handle on ``device``
    (torch's raw accessor where it has one: the faster)."""
    import torch

    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return lambda: raw(device)
    return lambda: torch.cuda.current_stream(device).cuda_stream


def stream_handle(stream) -> int:
    """Raw ``cudaStream_t`` of a CuPy stream, a torch stream or an int handle;
    None means CuPy's current stream."""
    if stream is None:
        import cupy

        return cupy.cuda.get_current_stream().ptr
    if isinstance(stream, int):
        return stream
    ptr = getattr(stream, "ptr", None)  # cupy.cuda.Stream / ExternalStream
    if ptr is not None:
        return int(ptr)
    handle = getattr(stream, "cuda_stream", None)  # torch.cuda.Stream
    if handle is not None:
        return int(handle)
    raise TypeError(
        f"stream: expected a cupy.cuda.Stream, a torch.cuda.Stream or an int handle, "
        f"got {type(stream).__name__}"
    )


def stream_device(stream) -> int | None:
    """GPU ordinal a CuPy or torch stream object belongs to; None for raw
    handles and None (which follow the current device)."""
    device_id = getattr(stream, "device_id", None)  # cupy.cuda.Stream (-1: the null streams, any device)
    if isinstance(device_id, int):
        return device_id if device_id >= 0 else None
    device = getattr(stream, "device", None)  # torch.cuda.Stream
    index = getattr(device, "index", None)
    return index if isinstance(index, int) else None


def stream_on_device(stream, device: int) -> int:
    """:func:`stream_handle` of a ``stream=`` argument, after checking that a
    stream object belongs to ``device`` (a kernel cannot be launched on a
    stream of another GPU)."""
    handle = stream_handle(stream)
    if stream is not None and not isinstance(stream, int):
        owner = stream_device(stream)
        if owner is not None and owner != device:
            raise ValueError(
                f"stream: expected a stream of GPU {device} (the swapper's device), got one of "
                f"GPU {owner}; use a BlockSwapper(device={owner}) or make the stream on GPU {device}"
            )
    return handle


@contextlib.contextmanager
def on_device(device: int):
    """Make GPU ``device`` current inside the block."""
    from cupy.cuda import runtime

    prev = runtime.getDevice()
    if prev != device:
        runtime.setDevice(device)
    try:
        yield
    finally:
        if prev != device:
            runtime.setDevice(prev)


def enqueue_and_wait(device: int, enqueue) -> None:
    """Run ``enqueue(stream)`` on a private non-blocking stream of GPU
    ``device`` and wait for it: a one-time write (zeroing, a record's
    upload) finished before it returns, never on the legacy stream, whose
    implicit synchronization would break another thread's capture of a
    blocking stream; legal while any stream captures."""
    from cupy.cuda import runtime

    with on_device(device), capture.relaxed():
        stream = runtime.streamCreateWithFlags(1)  # cudaStreamNonBlocking
        try:
            enqueue(stream)
            runtime.streamSynchronize(stream)
        finally:
            runtime.streamDestroy(stream)


def stream_is_capturing(stream: int) -> bool:
    """True while ``stream`` (a raw handle) is capturing a CUDA graph;
    RuntimeError when the driver refuses the query."""
    query = _capture_query or _bind_capture_query()  # every call asks: no import statement per call (0.25 µs)
    try:
        return query[0](stream)
    except query[1] as e:
        raise RuntimeError(
            f"stream: the driver refused the capture query ({e}); the legacy default stream "
            f"cannot be used while another stream captures a graph, pass that stream instead"
        ) from None


_capture_query: tuple = ()  # (cupy's streamIsCapturing, its error), bound at the first ask


def _bind_capture_query() -> tuple:
    global _capture_query
    from cupy.cuda import runtime

    _capture_query = (runtime.streamIsCapturing, runtime.CUDARuntimeError)
    return _capture_query


class EventPool:
    """Swap events, recycled once nobody else holds them: creating an event
    costs about 1.8 us of host time, recording one 0.75 us
    (benchmarks/host_costs.py), and a creation waits behind a release's
    device-wide wait (NOTES 77).  When the oldest of the last ``size`` events
    handed out is referenced by the pool alone, it is recorded again instead
    of a new one (a wait enqueued earlier keeps the record it saw); ``ready``
    events are made up front, so a caller holding its last few events never
    makes a call create one.  Events are made on the current GPU."""

    def __init__(self, size: int = 64, ready: int = 4):
        if ready < 1:
            raise ValueError(f"ready: expected at least 1 event made up front, got {ready}")
        self._cls = swap_event_class()
        self._issued: collections.deque = collections.deque()
        with _tracked_lock:
            _pools.add(self)
        self._size = size
        self._refs = sys.getrefcount
        self._free_refs = _unshared_refcount()
        self._issued.extend(self._new(False) for _ in range(ready))

    def take(self, path: str, nbytes: int, timed: bool = False):
        """An unrecorded event for a swap that takes ``path`` and moves
        ``nbytes``; timed swaps get a new one.  The oldest is reused when
        nobody else holds it; one still held (by a ring slot, for as many of
        its ring's launches as it has slots, or by its caller) keeps its
        place, and the next few are looked at."""
        event = self._issued[0]  # (never empty: ``ready`` events are made up front)
        if self._refs(event) == self._free_refs and not timed:
            self._issued.rotate(-1)  # oldest -> newest
        else:
            event = self._other(timed)
        event.path, event.nbytes, event.check, event.seq = path, nbytes, None, None
        return event

    def untracked(self, path: str, nbytes: int, timed: bool = False):
        """A new event that no release waits for: for a record inside a
        capture (waiting for an event recorded in a capture invalidates the
        capture; its graph's launches are waited for as any work is)."""
        event = self._new(timed)
        event.path, event.nbytes = path, nbytes
        return event

    def _other(self, timed: bool):
        issued = self._issued
        if not timed:
            event = self._next_free(issued)  # the oldest is held: one of the next few
            if event is not None:
                return event
        event = self._new(timed)
        if timed:
            with _tracked_lock:
                _loose.add(event)
        else:
            if len(issued) >= self._size:
                with _tracked_lock:
                    _loose.add(issued.popleft())  # its caller may still hold it, its swap queued
            issued.append(event)
        return event

    def _next_free(self, issued):
        for i in range(1, min(_LOOKS, len(issued))):
            event = issued[i]
            if self._refs(event) == self._free_refs:
                issued.remove(event)  # -> newest; the held ones before it keep their age
                issued.append(event)  # (by identity: another thread may have moved the deque)
                return event
        return None

    def _new(self, timed: bool):
        with capture.relaxed():  # legal while another thread captures in global mode
            event = self._cls(disable_timing=not timed)
        event.start = event.check = event.seq = None
        return event


_LOOKS = 4  # events EventPool.take looks at before it makes one
_pools: weakref.WeakSet = weakref.WeakSet()  # every EventPool of this process
_loose: weakref.WeakSet = weakref.WeakSet()  # events handed out that no pool lists (timed, pushed out)
_tracked_lock = threading.Lock()  # guards the two sets' adds and their copy (a WeakSet is iterated in Python)


def wait_for_issued_events() -> None:
    """Before memory is unpinned (after :func:`slots.wait_for_taken_slots`,
    which registers both): wait for every swap event this process
    handed out, so the release of a pool waits for the swaps over it on
    CUDA's documented event wait and not only on ``cudaHostUnregister``'s
    undocumented one (which did not always hold under compute-sanitizer:
    NOTES 84).  An event recorded into a capture has no launch to wait for
    here; an error is left to the GPU wait that follows, which raises it."""
    from cupy.cuda import runtime

    with _tracked_lock:
        pools, events = list(_pools), list(_loose)
    events += [e for pool in pools for e in list(pool._issued)]
    with capture.relaxed():  # legal while another thread captures
        for event in events:
            try:
                runtime.eventSynchronize(event.ptr)
            except runtime.CUDARuntimeError:
                pass


def event_pool_size(ring_size: int) -> int:
    """Events a swapper with ``ring_size`` slots in each of its two rings
    pools: a slot holds its launch's event until a call takes the slot
    again, that is for ``ring_size`` calls that use its ring, so with fewer
    pooled events than the rings and the caller hold, calls make new ones
    (NOTES 82: one a call with SGLang's 128 slots).  Sized so that no warm
    call makes one while at least one call in four uses a ring."""
    return max(64, 4 * ring_size + 16)


def _unshared_refcount() -> int:
    """``sys.getrefcount`` of an object only a deque holds, in
    :meth:`EventPool.take`'s code shape: measured, as interpreters differ."""
    issued = collections.deque([object()])
    event = issued[0]
    return sys.getrefcount(event)
