"""The slot ring: where a kernel swap's rows wait for its launch, and where
its verdict comes back.

**Invariant.**  A slot (pinned words: a ``SwapControl`` record, room for
``capacity`` rows, then the slot's own ``SwapStatus`` record) is written
only by the one call that took it, and taken again only after the kernel of
its last launch wrote that launch's number into the record's ``done`` word
(the kernel's last CTA, after every CTA stopped reading the slot and after
the verdict landed: ``kernels_cu/block_swap.cu``) and the host read that
verdict (:mod:`.outcomes`).  So a free slot is told by one read of pinned
memory: no event query, no driver call, nothing that could touch another
thread's capture.  A call that took a slot and launched nothing gives it
back at once (:meth:`SlotRing.give_back`).

**Queueing.**  :meth:`SlotRing.take` returns the first free slot from the
ring's next; only when every slot waits for its kernel does it wait, for
the first to free, polling those words.

**Lifetime.**  The ring's memory goes back (on the releaser thread) once
every launched slot's kernel has finished and nothing (an event, a failure)
can read it.
"""

from __future__ import annotations

import ctypes
import functools
import itertools
import threading
import time
import weakref

import numpy as np

from . import abi, capture, memory, release, streams
from .outcomes import LOST, Failure, mapping_error

# SwapControl words (kernels_cu/swap_abi.cuh).
N_PAIRS, STATUS, SEQ, DONE, SRC_INDEX, DST_INDEX, INDEX_STEP = range(7)
# SwapStatus words (the kernel's report()): seq last written, verdict, alarm address.
_V_SEQ, _V_KIND, _V_ROW, _V_VALUE, _V_ALARM = range(5)
_TAKEN = -(1 << 62)  # pending value of a slot a call holds and has not launched
_POLL_FIRST, _POLL_MAX = 5e-6, 100e-6  # seconds between looks at a full ring


_live: weakref.WeakSet = weakref.WeakSet()  # every ring of this process
_RETIRE_BATCH = 32  # finished launches' GPU index arrays handed to the releaser at once
_TAKEN_WAIT_S = 10.0  # the most an unpin waits for one taken slot (a launch takes microseconds)


def wait_for_taken_slots() -> None:
    """Before memory is unpinned (after its generation bump): wait until
    every slot a call holds has launched or been given back, so no launch
    that resolved the old aliases comes after the GPU wait (a call that
    takes a slot later sees the new generation and gives it back).  Raises
    RuntimeError past ``_TAKEN_WAIT_S``: the unpin then fails and keeps the
    memory pinned (:func:`memory.wait_for_gpus_in_use`'s failure)."""
    deadline = time.monotonic() + _TAKEN_WAIT_S
    for ring in list(_live):
        pending = ring.pending
        for i in range(len(pending)):
            while pending[i] == _TAKEN:
                if time.monotonic() >= deadline:  # the unpin fails: the memory stays pinned for good
                    raise RuntimeError(
                        f"a swap call held a ring slot for more than {_TAKEN_WAIT_S:g} s while host memory "
                        f"was being unpinned; it may launch over that memory, so it stays pinned"
                    )
                time.sleep(1e-4)


# A held slot launches first, then every swap event is waited for.
memory.before_unpin.extend([wait_for_taken_slots, streams.wait_for_issued_events])


class SlotRing:
    """``size`` slots of ``capacity`` rows for GPU ``device``.

    Attributes
    ----------
    words : numpy.ndarray of int64, shape (size + 1, row_words(capacity))
        Pinned; row ``i < size`` is slot ``i``: its control record, its rows
        ``(src, dst)`` at words ``CONTROL_WORDS + 2 r``, ``+ 1``, then its
        status record; word 0 of the last row is the ring's alarm.
    aliases : list of int
        Device address of each slot (the kernel reads it there).
    status_at : list of int
        Device address of each slot's status record (0 where not mapped).
    arrivals : list of int
        Device address of each slot's count of finished CTAs (zeroed; the
        last CTA of a launch sets it back to 0).
    mapped : bool
        False where pinned memory cannot be mapped into the GPU's address
        space: then no slot can be read by a kernel.
    lock : threading.Lock
        Guards the slots' states, the verdicts read from them and the
        channels' failure lists.
    failing : set of Channel
        Channels holding failures nobody raised (kept alive until raised).
    waits : int
        Times a call found every slot busy.
    """

    @staticmethod
    def row_words(capacity: int) -> int:
        """Words of one slot: control record, ``capacity`` rows, status record."""
        return abi.CONTROL_WORDS + 2 * capacity + abi.STATUS_WORDS

    def __init__(
        self, device: int, size: int, capacity: int, *, words: np.ndarray | None = None, base: int = 0
    ):
        self.size, self.capacity = size, capacity
        row = self.row_words(capacity)
        counters = 0
        if words is None:  # else tests play the kernel's part over NumPy memory at device address ``base``
            words = memory.zeros_pinned_for_gpu((size + 1, row), np.int64, device)
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
        self.rows = [
            words[i, abi.CONTROL_WORDS : abi.CONTROL_WORDS + 2 * capacity].reshape(capacity, 2)
            for i in range(size)
        ]
        self._flat = words.reshape(-1)  # .item on flat indices: the cheapest read
        self._item = self._flat.item
        self._row_words = row
        self._status = abi.CONTROL_WORDS + 2 * capacity  # a slot's status record, from its first word
        # Flat indices of each slot's done word and its verdict's seq and kind.
        self._dones = [i * row + DONE for i in range(size)]
        self._vseqs = [i * row + self._status + _V_SEQ for i in range(size)]
        self._vkinds = [i * row + self._status + _V_KIND for i in range(size)]
        self._alarm = size * row  # flat index of the alarm word
        self.mapped = bool(base)
        self.aliases = [base + i * 8 * row if base else 0 for i in range(size)]
        self.status_at = [base + 8 * (i * row + self._status) if base else 0 for i in range(size)]
        if base:  # every record's alarm field points at the alarm word (written once)
            words[:size, self._status + _V_ALARM] = base + 8 * self._alarm
        self.arrivals = [counters + 4 * i if counters else 0 for i in range(size)]
        self.pending = [0] * size  # the done value each slot waits for; 0: free; _TAKEN: held by a call
        self._owners: list = [None] * size  # (channel, layout, thread) of a checked launch not read yet
        self._seqs = [0] * size  # that launch's number
        self._events: list = [None] * size  # that launch's event
        # The GPU index arrays of each slot's last GPU-rows launch: held until that slot
        # next carries GPU rows (then retired: _retire) or is given back, or the ring is
        # released.
        self._kept: list = [None] * size
        self._retired: list = [[]]  # a box: the finished launches' arrays not yet handed to the releaser
        self._alarm_seen = 0
        self.failing: set = set()
        self._next = 0
        self.lock = self._lock = threading.Lock()
        self._checked = itertools.count(1)  # numbers of checked launches (errors name them)
        self._unchecked = itertools.count(-1, -1)  # numbers of unchecked launches
        self.waits = 0
        free = functools.partial(_free_counters, counters, device, words, [self._kept, self._retired])
        gate = functools.partial(_wait_all, self._lock, self.pending, self._flat, self._row_words)
        self._finalizer = release.when_dropped(self, free, gate, f"slot ring of GPU {device}")
        _live.add(self)

    def take(self) -> int:
        """A free slot's index, held by the caller until it sets
        ``pending[i]`` to its launch's number (launched) or calls
        :meth:`give_back`: the ring's next when free (its last verdict read
        in place when good), else the first free one from there, else the
        first to free (polling its word)."""
        with self._lock:
            i = self._next
            want = self.pending[i]
            if self._finalizer.alive and (want == 0 or want != _TAKEN and self._item(self._dones[i]) == want):
                if self._owners[i] is not None:  # its verdict, before anything rewrites the slot
                    if self._item(self._vseqs[i]) != self._seqs[i] or self._item(self._vkinds[i]):
                        self._read(i)  # a failure or a lost verdict
                    self._owners[i] = self._events[i] = None
                self.pending[i] = _TAKEN
                self._next = i + 1 if i + 1 < self.size else 0
                return i
        return self._take_waiting()

    def _take_waiting(self) -> int:
        """:meth:`take` when the ring's next slot is busy."""
        pending, item, row, pause = self.pending, self._item, self._row_words, 0.0
        while True:
            with self._lock:
                if not self._finalizer.alive:
                    raise RuntimeError("swap: the BlockSwapper that made this object is closed")
                first, size = self._next, self.size
                for k in range(first, first + size):
                    i = k if k < size else k - size
                    want = pending[i]
                    if want == 0 or (want != _TAKEN and item(i * row + DONE) == want):
                        if self._owners[i] is not None:
                            self._read(i)  # its verdict, before anything rewrites the slot
                        pending[i] = _TAKEN
                        self._next = i + 1 if i + 1 < size else 0
                        return i
            if not pause:
                self.waits += 1
            pause = min(2 * pause, _POLL_MAX) if pause else _POLL_FIRST
            time.sleep(pause)

    def write_unchecked(self, i: int, rows, n: int) -> int:
        """Slot ``i`` (taken) before a launch that checks nothing: ``n`` rows
        (a flat list or an ``(n, 2)`` int64 array) the host checked or made;
        the launch's number (negative: never a checked launch's)."""
        seq = next(self._unchecked)
        if type(rows) is list:
            self.rows_c[i][: 2 * n] = rows
        else:
            self.rows[i][:n] = rows
        control = self.controls[i]
        control[SRC_INDEX], control[N_PAIRS], control[STATUS], control[SEQ] = 0, n, 0, seq
        return seq

    def write(self, i: int, rows, n: int, owner: tuple, event) -> int:
        """Slot ``i`` (taken) before its launch: ``n`` host rows (a flat
        list or an ``(n, 2)`` int64 array), its control record for a
        checked launch, and who is told its verdict: ``owner`` ``(channel,
        layout, thread)`` and ``event`` (its ``check``, ``seq`` and ``slot``
        set), known before the launch, so a verdict that lands before its
        call marks the slot launched (``pending``) is found; the launch's number."""
        seq = next(self._checked)
        if type(rows) is list:
            self.rows_c[i][: 2 * n] = rows
        else:
            self.rows[i][:n] = rows
        control = self.controls[i]
        control[SRC_INDEX], control[N_PAIRS], control[STATUS], control[SEQ] = 0, n, self.status_at[i], seq
        event.check, event.seq, event.slot = self, seq, i
        self._seqs[i], self._events[i] = seq, event
        self._owners[i] = owner  # last: a look that sees it sees the rest
        return seq

    def write_gpu(self, i: int, rows, n: int, owner: tuple, event) -> int:
        """:meth:`write` for ``n`` rows on the GPU (a
        :class:`~.gpu_mapping.DeviceRows`): where the launch reads them.
        Their arrays stay held by the slot until it is written again, so
        after its kernel ran (a slot is taken again only then)."""
        seq = self.write(i, [], 0, owner, event)
        control = self.controls[i]
        control[SRC_INDEX], control[DST_INDEX], control[INDEX_STEP] = rows.src, rows.dst, rows.step
        control[N_PAIRS] = n
        old = self._kept[i]  # their launch finished: the slot was taken again (or never launched)
        self._kept[i] = rows.keep
        if old is not None:
            self._retire(old)
        return seq

    def _retire(self, arrays) -> None:
        """Hand a finished launch's GPU index arrays to the releaser thread, a
        batch at a time: the last reference may free GPU memory (an allocator
        without a cache), which a capture on this thread would forbid; a
        relaxed-mode drop here cost two capture-mode exchanges a call."""
        with self._lock:
            retired = self._retired[0]
            retired.append(arrays)
            if len(retired) < _RETIRE_BATCH:
                return
            self._retired[0] = []
        release.defer(retired.clear, None, "GPU index arrays of finished launches")

    def abandon(self, i: int, event, launched: bool) -> None:
        """The call that took slot ``i`` failed: :meth:`give_back` if it
        launched nothing, else :meth:`forget` its swap's verdict (the caller
        says which: once launched, the slot may be another call's)."""
        if launched:
            self.forget(i, event)
        else:
            self.give_back(i)

    def give_back(self, i: int) -> None:
        """Slot ``i`` was taken and nothing that reads it was launched."""
        with self._lock:
            self._owners[i] = self._events[i] = None
            old = [self._kept[i]]  # (their launch finished, or never happened)
            self._kept[i] = None
            self.pending[i] = 0  # last: free for another thread, whose arrays stay
        _drop(old)

    def forget(self, i: int, event) -> None:
        """The call whose swap launched from slot ``i`` with ``event`` failed
        after the launch (the event never reached its caller, who was told
        the call failed): nobody is told its verdict.  Another swap that has
        taken the slot since keeps its own."""
        with self._lock:
            if self._events[i] is event:
                self._owners[i] = self._events[i] = None
            elif isinstance(event.check, Failure):  # read already: its channel must not raise it
                event.check.mark_raised()

    # ------------------------------------------------------------ verdicts
    def _read(self, i: int) -> Failure | None:
        """Under the lock, slot ``i``'s launch finished: read its verdict
        (once) and hand a failure to its channel and its event."""
        owner, event, seq = self._owners[i], self._events[i], self._seqs[i]
        self._owners[i] = self._events[i] = None
        item, at = self._flat.item, i * self._row_words + self._status
        kind = item(at + _V_KIND) if item(at + _V_SEQ) == seq else LOST
        if not kind:
            return None  # a good verdict
        verdict = (LOST, 0, 0) if kind == LOST else (kind, item(at + _V_ROW), item(at + _V_VALUE))
        failure = Failure(self, seq, verdict, owner)
        channel = owner[0]
        if channel is not None:
            channel.failed.append(failure)
            self.failing.add(channel)
        if event is not None and event.seq == seq:
            event.check = failure  # its synchronize() raises it from now on
        return failure

    def raise_on_event(self, event) -> None:
        """``event`` (a checked swap's, launched from ``event.slot``) has
        completed: raise its failure if its verdict says so."""
        with self._lock:
            i = event.slot
            if self._events[i] is event:  # not read yet
                self._read(i)
            check = event.check
            if check is self or check is None:
                return
            # A failure (read now or when its slot was taken again): raised here,
            # marked under the lock that read it, so its channel never raises it too.
            check.mark_raised()
        raise mapping_error(check)

    def alarmed(self) -> bool:
        """A failing launch wrote the alarm word since the last look."""
        return self._flat.item(self._alarm) != self._alarm_seen

    def collect_if_alarmed(self) -> None:
        """Read every finished checked launch's verdict if a launch reported a
        failure since the last look."""
        item = self._flat.item
        alarm = item(self._alarm)
        if alarm == self._alarm_seen:
            return
        with self._lock:
            self._alarm_seen = alarm
            row, status = self._row_words, self._status
            for i in range(self.size):
                if self._owners[i] is None:
                    continue
                want = self._seqs[i]
                # Its verdict landed (seq is written last; maybe before its call
                # marked the slot launched), or its launch ended without one.
                if item(i * row + status + _V_SEQ) == want or (
                    self.pending[i] == want and item(i * row + DONE) == want
                ):
                    self._read(i)

    def busy(self) -> int:
        """Slots whose kernel has not finished (or that a call holds)."""
        with self._lock:
            return sum(
                1
                for i, want in enumerate(self.pending)
                if want and (want == _TAKEN or self._flat.item(i * self._row_words + DONE) != want)
            )

    def close(self) -> None:
        """Hand the ring to the releaser (freed after the launches that read it)."""
        self._finalizer()


def _wait_all(lock, pending: list, flat: np.ndarray, row_words: int) -> None:
    """The releaser's gate: every launched slot's kernel has finished (a
    slot a call still holds is waited for until it launched or gave it back)."""
    with lock:  # a look that read the ring open before close() has marked its slot taken by now
        pass
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

    from .streams import enqueue_and_wait

    counters = release.device_malloc(4 * size, device)
    # Finished before any launch can read them; not on the legacy stream
    # (a synchronous cudaMemset there can break another thread's capture of a
    # blocking stream).
    enqueue_and_wait(device, lambda stream: runtime.memsetAsync(counters, 0, 4 * size, stream))
    return counters


def _drop(box: list) -> None:
    """Empty ``box``, which holds the only reference the ring had to a
    finished launch's GPU index arrays, in relaxed capture mode: the last
    reference may free GPU memory (an allocator without a cache), which
    another thread's global-mode capture would not allow."""
    if box[0] is not None:
        with capture.relaxed():
            box.clear()


def _free_counters(counters: int, device: int, words: np.ndarray, kept: list) -> None:
    if counters:
        release.device_free(counters, device)
    del words, kept  # the pinned words, and GPU rows launches read, go with their last references
