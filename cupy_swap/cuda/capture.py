"""Capture: one rule for the driver calls that can run while some thread
captures a CUDA graph.

**Invariant.**  Every driver call made outside a launch that can run while
any thread captures in global mode (``torch.cuda.graph``'s default) --
creating, querying or synchronizing an event, allocating or freeing pinned
or device memory, synchronizing a stream, building a graph -- runs inside
:func:`relaxed` (this thread's capture interaction mode *relaxed*), or is
not made then.  In global mode such a call invalidates the other thread's
capture, or fails with ``cudaErrorStreamCaptureUnsupported``; in relaxed
mode the driver allows it.  The releaser thread runs relaxed for good
(:mod:`.release`).  ``tests/test_capture_rule.py`` enforces the rule over
every call site of the package.

Launches, stream waits and event records on the caller's own stream are
not such calls: they join (or are refused by) the caller's own capture.
"""

from __future__ import annotations

import contextlib
import ctypes

__all__ = ["relaxed", "relax", "restore", "event_done", "new_event", "RELAXED"]

RELAXED = 2  # CUstreamCaptureMode


def relax() -> int | None:
    """Make this thread's capture interaction mode relaxed; returns the mode
    to give :func:`restore` (the hot path's form of :func:`relaxed`)."""
    return exchange(RELAXED)


def restore(saved: int | None) -> None:
    if saved is not None:
        exchange(saved)


@contextlib.contextmanager
def relaxed():
    """This thread's capture interaction mode relaxed inside the block."""
    saved = exchange(RELAXED)
    try:
        yield
    finally:
        if saved is not None:
            exchange(saved)


def exchange(mode: int) -> int | None:
    """Set this thread's capture interaction mode; the previous one (None
    where the driver cannot be reached: then nothing can be captured)."""
    from .driver import libcuda

    lib = libcuda()
    fn = getattr(lib, "cuThreadExchangeStreamCaptureMode", None) if lib is not None else None
    if fn is None:
        return None
    value = ctypes.c_int(mode)
    if fn(ctypes.byref(value)) != 0:
        return None
    return value.value


def event_done(event) -> bool:
    """``event.done`` (``cudaEventQuery``), asked in relaxed mode."""
    saved = exchange(RELAXED)
    try:
        return event.done
    finally:
        if saved is not None:
            exchange(saved)


def new_event(timing: bool = False):
    """A ``cupy.cuda.Event`` (``cudaEventCreate``), created in relaxed mode."""
    import cupy

    with relaxed():
        return cupy.cuda.Event(disable_timing=not timing)
