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

import ctypes
import sys
import threading

from . import driver

RELAXED = 2  # CUstreamCaptureMode


class _Relaxed:
    """The block of :func:`relaxed`: a class, not a generator (it sits on
    every ring look: about 1.5 µs cheaper); a block inside another of the
    same thread makes no driver call."""

    __slots__ = ("saved",)

    def __enter__(self) -> None:
        depth = getattr(_thread, "depth", 0)
        _thread.depth = depth + 1
        self.saved = exchange(RELAXED) if depth == 0 else None

    def __exit__(self, *exc) -> None:
        _thread.depth -= 1
        if self.saved is not None:
            exchange(self.saved)


_thread = threading.local()  # depth: relaxed blocks this thread is inside


def relaxed() -> _Relaxed:
    """This thread's capture interaction mode relaxed inside the block."""
    return _Relaxed()


# (library, its cuThreadExchangeStreamCaptureMode): looked up once per
# library object (tests stand one in for ``driver.libcuda``).
_bound: tuple = (None, None)


def exchange(mode: int) -> int | None:
    """Set this thread's capture interaction mode; the previous one (None
    where the driver cannot be reached: then nothing can be captured)."""
    global _bound
    lib = driver.libcuda()
    if lib is not _bound[0]:
        _bound = (lib, getattr(lib, "cuThreadExchangeStreamCaptureMode", None) if lib is not None else None)
    fn = _bound[1]
    if fn is None:
        return None
    value = ctypes.c_int(mode)
    if fn(ctypes.byref(value)) != 0:
        return None
    return value.value


def event_done(event) -> bool:
    """``event.done`` (``cudaEventQuery``), asked in relaxed mode."""
    with relaxed():
        return query_in_block(event)


_cupy_done: list = []  # CuPy's own Event.done getter, found on first use


def query_in_block(event) -> bool:
    """Whether ``event`` completed, asked inside a relaxed block the caller
    holds: a CuPy event (a ``SwapEvent`` too) through CuPy's own ``done``,
    so a ``SwapEvent`` does not relax again (5.1 against 0.3 µs on the
    H200's host: benchmarks/NOTES.md, item 58); anything else by its
    ``done``."""
    cupy = sys.modules.get("cupy")
    if cupy is not None and isinstance(event, cupy.cuda.Event):
        if not _cupy_done:
            _cupy_done.append(cupy.cuda.Event.done.__get__)
        return _cupy_done[0](event)
    return event.done


def new_event(timing: bool = False):
    """A ``cupy.cuda.Event`` (``cudaEventCreate``), created in relaxed mode."""
    import cupy

    with relaxed():
        return cupy.cuda.Event(disable_timing=not timing)
