"""The slot ring: where a kernel swap's rows wait for its launch.

**Invariant.**  A slot (pinned words: a ``SwapControl`` record, then room for
``capacity`` rows) is written only by the one call that took it, and taken
again only after the kernel of its last launch wrote that launch's number
into the record's ``done`` word (the kernel's last CTA, after every CTA
stopped reading the slot: ``kernels_cu/block_swap.cu``).  So a free slot is
told by one read of pinned memory: no event query, no driver call, nothing
that could touch another thread's capture.  A call that took a slot and
launched nothing gives it back at once (:meth:`SlotRing.give_back`).

**Queueing.**  :meth:`SlotRing.take` returns the first free slot from the
ring's next; only when every slot waits for its kernel does it wait, for
the first to free, polling those words.

**Lifetime.**  The ring's memory goes back (on the releaser thread) once
every launched slot's kernel has finished.
"""

from __future__ import annotations

import ctypes
import functools
import itertools
import threading
import time

import numpy as np

from . import abi, memory, release

# SwapControl words (kernels_cu/swap_abi.cuh).
N_PAIRS, STATUS, SEQ, DONE, SRC_INDEX, DST_INDEX, INDEX_STEP = range(7)
_TAKEN = -(1 << 62)  # pending value of a slot a call holds and has not launched
_POLL_FIRST, _POLL_MAX = 5e-6, 100e-6  # seconds between looks at a full ring


class SlotRing:
    """``size`` slots of ``capacity`` rows for GPU ``device``.

    Attributes
    ----------
    words : numpy.ndarray of int64, shape (size, CONTROL_WORDS + 2 * capacity)
        Pinned; row ``i`` is slot ``i``: its control record, then its rows
        ``(src, dst)`` at words ``CONTROL_WORDS + 2 r``, ``+ 1``.
    aliases : list of int
        Device address of each slot (the kernel reads it there).
    arrivals : list of int
        Device address of each slot's count of finished CTAs (zeroed; the
        last CTA of a launch sets it back to 0).
    mapped : bool
        False where pinned memory cannot be mapped into the GPU's address
        space: then no slot can be read by a kernel.
    waits : int
        Times a call found every slot busy.
    """

    def __init__(
        self, device: int, size: int, capacity: int, *, words: np.ndarray | None = None, base: int = 0
    ):
        self.size, self.capacity = size, capacity
        counters = 0
        if words is None:  # else tests play the kernel's part over NumPy memory at device address ``base``
            words = memory.zeros_pinned_for_gpu((size, abi.CONTROL_WORDS + 2 * capacity), np.int64, device)
            base = memory.host_alias(words.ctypes.data, words.nbytes)
            counters = _zeroed_counters(device, size)
        self.words = words
        # Per slot, what a call writes: its control words and its rows, as
        # ctypes arrays (Python ints are stored faster through them than
        # NumPy converts them) and as a (capacity, 2) view for NumPy rows.
        self.controls = [(ctypes.c_int64 * abi.CONTROL_WORDS).from_buffer(words[i]) for i in range(size)]
        self.rows_c = [
            (ctypes.c_int64 * (2 * capacity)).from_buffer(words[i], 8 * abi.CONTROL_WORDS)
            for i in range(size)
        ]
        self.rows = [words[i, abi.CONTROL_WORDS :].reshape(capacity, 2) for i in range(size)]
        self._flat = words.reshape(-1)  # .item on flat indices: the cheapest read
        self._row_words = words.shape[1]
        self.mapped = bool(base)
        self.aliases = [base + i * 8 * self._row_words if base else 0 for i in range(size)]
        self.arrivals = [counters + 4 * i if counters else 0 for i in range(size)]
        self._pending = [0] * size  # the done value each slot waits for; 0: free
        self._next = 0
        self._lock = threading.Lock()
        self._unchecked = itertools.count(-1, -1)  # numbers of unchecked launches (checked: the ticket's)
        self.waits = 0
        free = functools.partial(_free_counters, counters, device, words)
        gate = functools.partial(_wait_all, self._pending, self._flat, self._row_words)
        self._finalizer = release.when_dropped(self, free, gate, f"slot ring of GPU {device}")

    def take(self) -> int:
        """A free slot's index, held by the caller until it calls
        :meth:`launched` or :meth:`give_back`."""
        i = self._look()
        if i >= 0:
            return i
        self.waits += 1
        pause = _POLL_FIRST
        while True:
            time.sleep(pause)
            i = self._look()
            if i >= 0:
                return i
            pause = min(2 * pause, _POLL_MAX)

    def _look(self) -> int:
        pending, item, row = self._pending, self._flat.item, self._row_words
        with self._lock:
            if not self._finalizer.alive:
                raise RuntimeError("swap: the BlockSwapper that made this object is closed")
            first = self._next
            size = self.size
            for k in range(size):
                i = first + k
                if i >= size:
                    i -= size
                want = pending[i]
                if want == 0 or (want != _TAKEN and item(i * row + DONE) == want):
                    pending[i] = _TAKEN
                    self._next = i + 1 if i + 1 < size else 0
                    return i
        return -1

    def unchecked_seq(self) -> int:
        """A number for a launch with no status record (negative: never a
        ticket's)."""
        return next(self._unchecked)

    def launched(self, i: int, seq: int) -> None:
        """Slot ``i`` was launched as swap ``seq``: free once its kernel says so."""
        self._pending[i] = seq

    def give_back(self, i: int) -> None:
        """Slot ``i`` was taken and nothing that reads it was launched."""
        self._pending[i] = 0

    def busy(self) -> int:
        """Slots whose kernel has not finished (or that a call holds)."""
        with self._lock:
            return sum(
                1
                for i, want in enumerate(self._pending)
                if want and (want == _TAKEN or self._flat.item(i * self._row_words + DONE) != want)
            )

    def close(self) -> None:
        """Hand the ring to the releaser (freed after the launches that read it)."""
        self._finalizer()


def _wait_all(pending: list, flat: np.ndarray, row_words: int) -> None:
    """The releaser's gate: every launched slot's kernel has finished (a
    slot a call still holds is waited for until it launched or gave it back)."""
    for i in range(len(pending)):
        while True:
            want = pending[i]
            if want == 0 or (want != _TAKEN and flat.item(i * row_words + DONE) == want):
                break
            time.sleep(1e-3)


def _zeroed_counters(device: int, size: int) -> int:
    """Device memory for ``size`` CTA counts, zeroed (the kernel keeps them 0
    between launches)."""
    from cupy.cuda import runtime

    from .streams import on_device

    counters = release.device_malloc(4 * size, device)
    with on_device(device):
        runtime.memset(counters, 0, 4 * size)
    return counters


def _free_counters(counters: int, device: int, words: np.ndarray) -> None:
    if counters:
        release.device_free(counters, device)
    del words  # the pinned words go with the last reference, held until here
