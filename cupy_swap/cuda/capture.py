"""Capture: one rule for the driver calls that can run while some thread
captures a CUDA graph.

**Invariant.**  Every driver call made outside a launch that can run while
any thread captures in global mode (``torch.cuda.graph``'s default) --
event create, query or synchronize, pinned or device allocation or free,
stream synchronize, graph build, module load -- runs inside :func:`relaxed`
(this thread's capture mode *relaxed*, which the driver allows; in global
mode the call invalidates the other capture or fails), or is not made then.
The releaser thread is relaxed for good (:mod:`.release`).  Launches,
waits and records on the caller's own stream join (or are refused by) its
own capture.  ``tests/test_capture_rule.py`` enforces the rule.
"""

from __future__ import annotations

import contextlib
import ctypes

RELAXED = 2  # CUstreamCaptureMode


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
    with relaxed():
        return event.done


def new_event(timing: bool = False):
    """A ``cupy.cuda.Event`` (``cudaEventCreate``), created in relaxed mode."""
    import cupy

    with relaxed():
        return cupy.cuda.Event(disable_timing=not timing)
