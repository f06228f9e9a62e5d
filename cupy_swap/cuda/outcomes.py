"""Outcomes: every swap checked inside its copy launch has exactly one
verdict, told to its own caller, never lost and never false.

**Invariant.**  A checked swap's verdict lives in the status record of the
ring slot it was launched from (:mod:`.slots`): the kernel writes it there
(``seq`` last, ``kernels_cu/block_swap.cu``) before the slot's done word, and
the slot is not taken again before the host has read it.  It is read once,
under the ring's lock, by whichever comes first: the slot being taken again,
the swap's event's ``synchronize()``, or a call that saw the ring's alarm
word move (a failing launch writes its number there).  A failure read there
becomes a :class:`Failure`: raised by the swap's event's ``synchronize()``
(every time: the event *is* that swap), else once by the next call of its
:class:`Channel` from the thread that made it (a prepared op's channel; for
``swap()``, that of the arrays' cache key, which outlives the op cache:
:mod:`cupy_swap.op_cache`), naming the swap (its event's ``seq``) and saying
that call launched nothing.  A finished launch whose record does not hold
its number is a lost verdict (``RuntimeError``), never success.

**Cost.**  A checked call stores who launched it beside its slot (no object,
no second lock); a call reads one alarm word; a verdict is read only when
its slot is taken again, its event is synchronized or the alarm moved.
"""

from __future__ import annotations

import threading
import weakref

LOST = -1  # the kind of a verdict that never landed (the record does not hold the launch's number)


class _Caller:
    """What names one thread to its failures: an object of that thread's
    own, dropped when it ends (``threading.current_thread()`` is, for a
    thread that C code started, one stand-in per thread id, kept after the
    thread ends and handed to the next thread with its id)."""

    __slots__ = ("__weakref__",)


class _Here(threading.local):
    """Per thread: ``ref``, the thread's name for its failures (a weak
    reference to a :class:`_Caller` of its own, dead once the thread ended),
    made on the thread's first look."""

    def __init__(self):
        self.caller = _Caller()
        self.ref = weakref.ref(self.caller)


here = _Here()  # here.ref: the calling thread's name for its failures


class Channel:
    """Where the failures of one op's (or one pair of arrays') checked swaps
    wait for the next call: ``failed`` ones read and not raised (guarded by
    the ring's lock)."""

    __slots__ = ("__weakref__", "failed", "owners")

    def __init__(self):
        self.failed: list[Failure] = []
        self.owners: list = []  # weak references that forget a swap() channel (op_cache)

    def raise_pending(self, ring) -> None:
        """Raise the first failure of this thread's swaps that no event has
        raised (once), before the calling swap launches anything."""
        ring.collect_if_alarmed()
        if not self.failed:
            return
        me = here.ref
        with ring.lock:
            failure = None
            for f in list(self.failed):
                if f.thread is me:
                    failure = f
                    break
                if f.thread() is None:
                    f.mark_raised()  # its thread ended: only its event can still tell it
            if failure is None:
                return
            failure.mark_raised()
        raise mapping_error(failure, earlier=True)


class Failure:
    """A checked swap whose launch found a bad row (or whose verdict never
    landed): ``verdict`` is ``(kind, row, value)``; ``thread``: its
    thread's :func:`caller`."""

    __slots__ = ("ring", "seq", "verdict", "channel", "layout", "thread", "raised")

    def __init__(self, ring, seq: int, verdict: tuple, owner: tuple):
        self.ring, self.seq, self.verdict = ring, seq, verdict
        self.channel, self.layout, self.thread = owner
        self.raised = False

    def raise_on_event(self, event=None) -> None:
        """The swap's event completed: raise its failure (every time)."""
        with self.ring.lock:
            self.mark_raised()
        raise mapping_error(self)

    def mark_raised(self) -> None:
        """Under the ring's lock: raised to its caller; its channel forgets it."""
        self.raised = True
        channel = self.channel
        if channel is not None and self in channel.failed:
            channel.failed.remove(self)
            if not channel.failed:
                self.ring.failing.discard(channel)


def mapping_error(failure: Failure, earlier: bool = False) -> Exception:
    """The exception of a failed check, naming the swap, the row and the
    part; ``earlier``: raised by a later call of the same channel.  The
    exception's ``swap_seq`` is the swap's number (its event's ``seq``)."""
    kind, row, value = failure.verdict
    layout = failure.layout
    if kind == LOST:
        exc = RuntimeError(
            f"swap #{failure.seq}: its launch completed without writing the verdict of its mapping check "
            f"(lost verdict); treat the swap as failed" + ("; this call was not launched" if earlier else "")
        )
        exc.swap_seq = failure.seq
        return exc
    error, what = describe(kind, row, value, layout)
    if earlier:
        text = (
            f"block_mapping of an earlier swap (swap #{failure.seq}, whose event nobody synchronized): {what}; "
            f"its copy launch checked it and copied nothing; this call was not launched"
        )
    else:
        text = (
            f"block_mapping of swap #{failure.seq}: {what} (checked by the copy launch; nothing was copied)"
        )
    exc = error(text)
    exc.swap_seq = failure.seq
    return exc


def describe(kind: int, row: int, value: int, layout) -> tuple[type, str]:
    """``(exception class, what was wrong)`` of a failed launch check's
    verdict ``(kind, row, value)`` over ``layout``."""
    if kind == 3:
        return ValueError, f"expected distinct destination blocks, got block {value} again in row {row}"
    if kind == 4:
        return ValueError, f"expected a row count the launch can read, got {value}"
    side, limit, name = (
        ("source", layout.src_limit, layout.src_limit_name)
        if kind == 1
        else ("destination", layout.dst_limit, layout.dst_limit_name)
    )
    return IndexError, (
        f"{side} block index {value} in row {row} is out of range for {name} with {limit} blocks "
        f"(expected 0 <= index < {limit})"
    )
