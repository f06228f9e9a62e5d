"""Outcomes: every swap checked inside its copy launch has exactly one
verdict, told to its own caller, never lost and never false.

**Invariant.**  A checked swap holds a :class:`Ticket`: one status record,
reserved for it alone from :meth:`StatusBoard.take` until the host read the
verdict its launch wrote there (``seq`` last, ``kernels_cu/block_swap.cu``),
so no other check overwrites it and it is never reused unread.  A failure
is raised by the swap's event's ``synchronize()`` (every time: the event
*is* that swap), else once by the next call of its :class:`Channel` from
the thread that made it (a prepared op's channel; for ``swap()``, that of
the arrays' cache key, which outlives the op cache: :mod:`cupy_swap.op_cache`),
naming the swap (its event's ``seq``) and saying that call launched
nothing.  An event that completed with no verdict in its record raises a
lost verdict (``RuntimeError``), never success.

**Cost.**  A failing launch also writes its number into the board's alarm
word: a call whose channel has tickets out reads that one word, and records
are collected (one NumPy pass) only when it moved or every record is
reserved; then :meth:`StatusBoard.take` waits for the first to land,
polling pinned memory (no driver call).  A swap that raised abandons its
ticket: the record is free at once if its launch never went out, else once
that launch wrote it.
"""

from __future__ import annotations

import threading
import time

import numpy as np

from . import abi, memory

SLOTS = 4096
_KIND, _ROW, _VALUE, _ALARM = 1, 2, 3, 4  # SwapStatus words (seq is word 0)
_WAIT_START, _WAIT_MAX = 20e-6, 1e-3  # seconds between looks at a full board


class Channel:
    """Where the failures of one op's (or one pair of arrays') checked swaps
    wait for the next call: ``open`` tickets not read yet, and ``failed``
    ones read and not raised (guarded by the board's lock)."""

    __slots__ = ("__weakref__", "open", "failed", "owners")

    def __init__(self):
        self.open = 0
        self.failed: list[Ticket] = []
        self.owners: list = []  # weak references that forget a swap() channel (op_cache)

    def raise_pending(self, board: StatusBoard) -> None:
        """Raise the first failure of this thread's swaps that no event has
        raised (once), before the calling swap launches anything."""
        board.collect_if_alarmed()
        if not self.failed:
            return
        me = threading.current_thread()
        with board.lock:
            ticket = None
            for t in list(self.failed):
                if t.thread is me:
                    ticket = t
                    break
                if not t.thread.is_alive():
                    board.mark_raised(t)  # its thread ended: only its event can still tell it
            if ticket is None:
                return
            board.mark_raised(ticket)
        raise mapping_error(ticket, earlier=True)


class Ticket:
    """One checked swap's claim on a status record."""

    __slots__ = ("board", "index", "seq", "address", "channel", "layout", "thread", "verdict", "raised")

    def __init__(self, board: StatusBoard, index: int, seq: int, channel: Channel | None, layout):
        self.board, self.index, self.seq, self.channel, self.layout = board, index, seq, channel, layout
        self.address = board.addresses[index]
        self.thread = threading.current_thread()
        self.verdict: tuple | None = None  # (kind, row, value) once read
        self.raised = False

    def raise_on_event(self) -> None:
        """The swap's event completed: raise its failure (every time), or a
        lost verdict when its record does not hold one."""
        board = self.board
        with board.lock:
            verdict = board.settle(self)
            if verdict is None:
                raise RuntimeError(
                    f"swap #{self.seq}: its launch completed without writing the verdict of its mapping check "
                    f"(lost verdict); treat the swap as failed"
                )
            if verdict[0]:
                board.mark_raised(self)
        if verdict[0]:
            raise mapping_error(self)

    def abandon(self, launched: bool) -> None:
        """The swap raised: nobody is told this ticket's verdict.  Its
        record is free at once when the launch never went out, else once
        the launch wrote it."""
        board = self.board
        with board.lock:
            if self.channel is not None and self.verdict is None:
                self.channel.open -= 1
            self.channel = None
            if not launched and self.verdict is None:
                self.verdict = (0, 0, 0)  # never read: nothing was launched
                board.give_back(self.index)


class StatusBoard:
    """The status records of one swapper's checked launches and their
    tickets, allocated with GPU ``device`` current: ``slots`` records and
    the alarm word, in mapped pinned memory, or in ``records`` at device
    address ``base`` (tests play the kernel's part: ``tests/fakes.py``).
    ``base`` is 0 where host memory cannot be mapped: then no launch can
    report, and every mapping is checked on the host.  ``waits`` counts the
    times :meth:`take` waited for a record."""

    def __init__(self, device: int, slots: int = SLOTS, *, records: np.ndarray | None = None, base: int = 0):
        if records is None:
            records = memory.zeros_pinned_for_gpu((slots + 1, abi.STATUS_WORDS), np.int64, device)
            base = memory.host_alias(records.ctypes.data, records.nbytes)
        self.slots, self.records, self.base = slots, records, base
        # The last row's first word is the alarm; every record points its launch there.
        records[:slots, _ALARM] = base + 8 * abi.STATUS_WORDS * slots if base else 0
        self._item = records.item
        self._alarm_seen = 0
        self.addresses = [base + 8 * abi.STATUS_WORDS * i for i in range(slots)]
        self._expected = [0] * slots  # the seq each reserved record waits for; 0: free
        self._tickets: list[Ticket | None] = [None] * slots
        self._free = list(range(slots - 1, -1, -1))
        self._failing: set[Channel] = set()  # channels holding failures nobody raised (kept alive)
        self._seq = 0
        self.lock = threading.Lock()
        self.waits = 0

    def take(self, channel: Channel | None, layout) -> Ticket:
        """A ticket for the next checked launch (waits while every record
        is reserved by a check that has not run)."""
        with self.lock:
            if not self._free:
                self._wait_for_a_record()
            index = self._free.pop()
            self._seq += 1
            ticket = Ticket(self, index, self._seq, channel, layout)
            self._expected[index] = ticket.seq
            self._tickets[index] = ticket
            if channel is not None:
                channel.open += 1
        return ticket

    def _wait_for_a_record(self) -> None:
        """Under the lock: collect until a record is free, sleeping between
        looks without the lock (other threads' events read meanwhile)."""
        pause = _WAIT_START
        while True:
            self._collect()
            if self._free:
                return
            self.waits += 1
            self.lock.release()
            try:
                time.sleep(pause)
            finally:
                self.lock.acquire()
            pause = min(2 * pause, _WAIT_MAX)

    def settle(self, ticket: Ticket) -> tuple | None:
        """Under the lock: ``ticket``'s verdict, reading its record (then
        free) once the check has run; None before."""
        if ticket.verdict is None:
            index = ticket.index
            if self._item(index, 0) != ticket.seq or self._expected[index] != ticket.seq:
                return None
            ticket.verdict = (self._item(index, _KIND), self._item(index, _ROW), self._item(index, _VALUE))
            self.give_back(index)
            channel = ticket.channel
            if channel is not None:
                channel.open -= 1
                if ticket.verdict[0] and not ticket.raised:
                    channel.failed.append(ticket)
                    self._failing.add(channel)
        return ticket.verdict

    def give_back(self, index: int) -> None:
        """Under the lock: record ``index`` may be taken again."""
        self._expected[index] = 0
        self._tickets[index] = None
        self._free.append(index)

    def mark_raised(self, ticket: Ticket) -> None:
        """Under the lock: ``ticket``'s failure has been raised to its caller."""
        ticket.raised = True
        channel = ticket.channel
        if channel is not None and ticket in channel.failed:
            channel.failed.remove(ticket)
            if not channel.failed:
                self._failing.discard(channel)

    def collect_if_alarmed(self) -> None:
        """Read every landed record if a launch reported a failure since the
        last look (one read of the alarm word otherwise)."""
        alarm = self._item(self.slots, 0)
        if alarm != self._alarm_seen:
            with self.lock:
                self._alarm_seen = alarm
                self._collect()

    def _collect(self) -> None:
        """Under the lock: settle every ticket whose check has run."""
        expected = np.array(self._expected, np.int64)
        landed = np.flatnonzero((self.records[: self.slots, 0] == expected) & (expected != 0))
        for index in landed.tolist():
            self.settle(self._tickets[index])


def mapping_error(ticket: Ticket, earlier: bool = False) -> Exception:
    """The exception of a failed check, naming the swap, the row and the
    part; ``earlier``: raised by a later call of the same channel.  The
    exception's ``swap_seq`` is the swap's number (its event's ``seq``)."""
    kind, row, value = ticket.verdict
    layout = ticket.layout
    if kind == 3:
        error, what = (
            ValueError,
            f"expected distinct destination blocks, got block {value} again in row {row}",
        )
    elif kind == 4:
        error, what = ValueError, f"expected a row count the launch can read, got {value}"
    else:
        side, limit, name = (
            ("source", layout.src_limit, layout.src_limit_name)
            if kind == 1
            else ("destination", layout.dst_limit, layout.dst_limit_name)
        )
        error = IndexError
        what = (
            f"{side} block index {value} in row {row} is out of range for {name} with {limit} blocks "
            f"(expected 0 <= index < {limit})"
        )
    if earlier:
        text = (
            f"block_mapping of an earlier swap (swap #{ticket.seq}, whose event nobody synchronized): {what}; "
            f"its copy launch checked it and copied nothing; this call was not launched"
        )
    else:
        text = f"block_mapping of swap #{ticket.seq}: {what} (checked by the copy launch; nothing was copied)"
    exc = error(text)
    exc.swap_seq = ticket.seq
    return exc
