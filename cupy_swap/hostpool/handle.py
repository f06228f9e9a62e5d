"""Registering a pool chunk by chunk, in the caller's thread or in a
background thread, behind a :class:`PinHandle`.

**Invariant.**  One driver call pins one chunk (``cudaHostRegister`` through
:func:`cupy_swap.cuda.memory.register_range`, in relaxed capture mode, so a
capture another thread runs stays valid: the capture rule of
:mod:`cupy_swap.cuda.capture`), so no call holds the driver longer than one
chunk's registration.  Chunks register in order; a chunk is published (in the
range registry and as ``PINNED`` in its pool record) only after its call
returned.  The first failure stops the registration, clears the pending CUDA
error in the registering thread and becomes the handle's one error.  The
thread holds the pool's owner until it ends, so the pool is never freed
(unregistered) while a chunk registers.
"""

from __future__ import annotations

import threading
import time
from threading import Event as _Flag
from typing import NamedTuple

from ..cuda import capture, memory
from ..cuda.pools import FAILED, PINNED, PoolRecord
from . import errors


class Progress(NamedTuple):
    """How far a registration got."""

    bytes_done: int
    bytes_total: int
    rows_done: int
    rows_total: int
    chunks_done: int
    chunks_total: int
    seconds: float

    @property
    def fraction(self) -> float:
        return self.bytes_done / self.bytes_total if self.bytes_total else 1.0


class PinHandle:
    """A host pool and its registration, chunk by chunk.

    Attributes
    ----------
    array : numpy.ndarray
        The whole pool, shape ``(rows, ...)``.  Swap only ``array[:usable_rows]``
        until :attr:`done`; a swap on rows not pinned yet is refused.
    placement : Placement
        Where its pages were placed (:mod:`.numa`).
    chunk_seconds : list of float
        Wall time of each chunk's ``cudaHostRegister`` so far (the time the
        driver is held).
    touch_seconds : list of float
        Wall time of each chunk's first touch before it (``pin_pool`` only).
    """

    def __init__(self, array, record: PoolRecord, owner, device: int, placement, progress=None, touch=None):
        self.array, self.placement, self.device = array, placement, device
        self._record, self._owner, self._callback = record, owner, progress
        self._finished = _Flag()  # threading.Event (a CPU flag, not a CUDA event)
        self._cancel = _Flag()
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._started = time.perf_counter()
        self._seconds = 0.0
        self.chunk_seconds: list[float] = []
        self.touch_seconds: list[float] = []  # first touch of each chunk (pin_pool), outside the driver
        self._touch = touch
        self._keep = None  # pin_array: the owner of the caller's pinned memory

    # -- state --------------------------------------------------------------
    @property
    def progress(self) -> Progress:
        """Bytes, rows and chunks pinned so far, and seconds spent."""
        r = self._record
        done = [c for c, s in zip(r.chunks, r.states) if s == PINNED]
        seconds = self._seconds if self._finished.is_set() else time.perf_counter() - self._started
        return Progress(
            sum(c.nbytes for c in done),
            r.end - r.base,
            self.usable_rows,
            r.rows,
            len(done),
            len(r.chunks),
            seconds,
        )

    @property
    def usable_rows(self) -> int:
        """Rows ``[0, usable_rows)`` are pinned and may be swapped."""
        return self._record.usable_rows()

    @property
    def usable(self):
        """``array[:usable_rows]``: the part of the pool swaps may use now."""
        return self.array[: self.usable_rows]

    @property
    def done(self) -> bool:
        """True once the registration ended (all pinned, failed or cancelled)."""
        return self._finished.is_set()

    @property
    def error(self) -> BaseException | None:
        """The registration's error (a :class:`~.errors.PinError`), or None."""
        return self._error

    @property
    def chunks(self) -> list:
        return list(self._record.chunks)

    def chunk_views(self) -> list:
        """One view of the pool per chunk (``array[first_row:end_row]``):
        each lies in one registration, so a swap on it reads the blocks
        through that chunk's own device alias."""
        return [self.array[c.first_row : c.end_row] for c in self._record.chunks]

    def wait(self, timeout: float) -> bool:
        """Wait until the registration ended, at most ``timeout`` seconds.

        Returns
        -------
        bool
            True when every chunk is pinned; False when ``timeout`` passed
            first (or it was cancelled).

        Raises
        ------
        PinError
            The registration failed (the same error each time).
        """
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout >= 0:
            raise ValueError(f"timeout: expected seconds >= 0 (a deadline), got {timeout!r}")
        if not self._finished.wait(timeout):
            return False
        if self._error is not None:
            raise self._error
        return self.usable_rows == self._record.rows

    def cancel(self) -> None:
        """Stop after the chunk being registered (the rest stays unpinned)."""
        self._cancel.set()

    def __repr__(self) -> str:
        p = self.progress
        state = "failed" if self._error else "done" if self._finished.is_set() else "pinning"
        return (
            f"<PinHandle {state}: {p.bytes_done / 2**30:.2f} of {p.bytes_total / 2**30:.2f} GiB, "
            f"{p.chunks_done}/{p.chunks_total} chunks, {self.placement.describe()}>"
        )

    # -- work ---------------------------------------------------------------
    def _start(self, background: bool) -> None:
        if background:
            self._thread = threading.Thread(target=self._run, name="cupy_swap-pin", daemon=True)
            self._thread.start()
        else:
            self._run()

    def _run(self) -> None:
        r = self._record
        runtime = memory._runtime()
        caller_device = None
        try:
            caller_device = runtime.getDevice()
            runtime.setDevice(self.device)  # the context the registrations are made in
            for i, c in enumerate(r.chunks):
                if self._cancel.is_set():
                    break
                if self._touch is not None:  # fault the pages in without holding the driver
                    t0 = time.perf_counter()
                    self._touch(c.start, c.nbytes)
                    self.touch_seconds.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                try:
                    with capture.relaxed():  # one chunk per driver call; another thread's capture stays valid
                        alias = memory.register_range(c.start, c.nbytes, owned=True)
                except Exception as e:  # noqa: BLE001 - becomes the handle's one error
                    errors.clear_pending()
                    r.states[i] = FAILED
                    self._error = errors.registration_error(
                        e, r.what, c.nbytes, r.end - r.base, i, len(r.chunks), r.usable_rows()
                    )
                    break
                self.chunk_seconds.append(time.perf_counter() - t0)
                r.offsets[i] = alias - c.start if alias else None
                r.states[i] = PINNED
                self._report()
            memory._generation[0] += 1  # layouts cached before resolve again
        except BaseException as e:  # noqa: BLE001 - KeyboardInterrupt in the caller's thread included
            self._error = self._error or e
        finally:
            if caller_device is not None and caller_device != self.device:
                runtime.setDevice(caller_device)  # the caller's thread keeps its GPU (foreground pinning)
            self._seconds = time.perf_counter() - self._started
            self._owner = None  # the pool may be freed once its arrays are gone
            self._finished.set()

    def _report(self) -> None:
        if self._callback is None:
            return
        try:
            self._callback(self.progress)
        except Exception as e:  # noqa: BLE001 - a broken callback stops the registration, said once
            self._error = RuntimeError(f"progress: the callback raised {type(e).__name__}: {e}")
            self._cancel.set()
