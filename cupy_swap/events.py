"""The handle a swap returns: a ``cupy.cuda.Event`` recorded after the copy
that can also report the swap's device time."""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["swap_event_class", "wait_handle", "Wait"]

_cls: list = []


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
        """

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
    """One ``wait_for`` entry, ready to enqueue: the event to wait on, the
    object that keeps it alive until then, and whether the stream it was
    recorded on is capturing a graph (waiting on it joins the capture)."""

    event_ptr: int
    keepalive: object
    capturing: bool


# Raw handles of the legacy and per-thread default streams: they act on
# whatever device is current, so for ``wait_for`` they are the caller's.
_DEFAULT_STREAM_HANDLES = (0, 1, 2)


def wait_handle(item, device: int | None = None, caller_device: int | None = None) -> Wait:
    """Turn one ``wait_for`` entry into an event to wait on.

    Events are waited on as they are (a stream may wait for an event of
    another GPU).  Streams get an event recorded on them now, on the GPU the
    stream belongs to: its own for CuPy and torch stream objects; the
    caller's (``caller_device``) for the default streams (CuPy's
    ``Stream.null`` and ``Stream.ptds``, raw handles 0, 1, 2); the
    swapper's (``device``) for other raw handles, as for ``stream=``.
    """
    import cupy

    if isinstance(item, cupy.cuda.Event):
        return Wait(item.ptr, None, False)
    handle = getattr(item, "cuda_event", None)  # torch.cuda.Event
    if isinstance(handle, int):
        return Wait(handle, None, False)
    from .driver import stream_is_capturing
    from .interop import on_device, stream_device, stream_handle

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
    with on_device(owner if owner is not None else cupy.cuda.runtime.getDevice()):
        ev = cupy.cuda.Event(disable_timing=True)  # events are recorded on their own device's streams
        try:
            cupy.cuda.runtime.eventRecord(ev.ptr, stream)
        except cupy.cuda.runtime.CUDARuntimeError as e:
            raise ValueError(
                f"wait_for: could not record an event on stream handle {stream:#x} of GPU {owner} ({e}); "
                f"pass a stream of another GPU as its CuPy or torch object, or an event recorded on it"
            ) from None
        capturing = stream_is_capturing(stream)
    return Wait(ev.ptr, ev, capturing)
