"""Verdicts of a swap captured into the caller's CUDA graph, one per replay.

**Invariant.**  Replay ``k`` (numbered from 1 by the kernel itself) writes its
verdict into record ``k % size`` of a pinned ring (``seq`` last) and, when
its check failed, ``k`` into the ring's alarm word.  The host reads the
records in replay order, each replay once: a failure is reported once; a
replay whose record was overwritten before the host read it is never taken
for a success: it is reported as unread, with the alarm word saying whether
a failure was among them.  Reading costs no driver call and never waits.
"""

from __future__ import annotations

import numpy as np

from . import abi
from .outcomes import describe


class ReplayVerdicts:
    """The ring of ``size`` records in ``words`` (shape ``(size + 1,
    STATUS_WORDS)``, int64, pinned; word 0 of the last row is the alarm),
    read through :meth:`failures`.  ``read``: the last replay read."""

    def __init__(self, size: int, words: np.ndarray):
        self.size, self.words, self.read = size, words, 0

    def failures(self, layout) -> list[Exception]:
        """The failures of the replays finished since the last call, oldest
        first (each replay's once).  Only replays that finished are read:
        call it after a replay, or after waiting for its completion word."""
        words, size = self.words, self.size
        top = int(words[:size, 0].max())  # the newest finished replay (replays run one after another)
        if top <= self.read:
            return []
        first, out = self.read + 1, []
        overwritten = top - size  # replays first..overwritten: their records hold later replays
        if overwritten >= first:
            alarm = int(words[size, 0])
            failed = f"; replay {alarm} failed" if first <= alarm <= overwritten else ""
            out.append(_unread(first, overwritten, size, failed))
            first = overwritten + 1
        for k in range(first, top + 1):
            record = words[k % size]
            seq = int(record[0])
            kind, row, value = int(record[1]), int(record[2]), int(record[3])
            # The kernel zeroes seq before it rewrites a record and writes it
            # last: the same k before and after the fields means they are k's.
            if seq != k or int(record[0]) != k:  # overwritten meanwhile: a later replay ran
                out.append(_unread(k, k, size, ""))
            elif kind:
                error, what = describe(kind, row, value, layout)
                exc = error(
                    f"replay #{k} of a captured swap: {what} (checked in the replay; nothing was copied)"
                )
                exc.replay = k
                out.append(exc)
        self.read = top
        return out


def _unread(first: int, last: int, size: int, failed: str) -> RuntimeError:
    exc = RuntimeError(
        f"replays #{first}..#{last} of a captured swap: their verdicts were overwritten before they were read "
        f"(a ring of {size} records){failed}; read failures() more often or capture with a larger ring"
    )
    exc.replay = first
    return exc


def ring_words(size: int) -> tuple[int, int]:
    """``(rows, words per row)`` of a ring of ``size`` records and its alarm."""
    return size + 1, abi.STATUS_WORDS
