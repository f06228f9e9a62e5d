"""Failures of a swap captured into the caller's CUDA graph.

**Invariant.**  Only a replay whose check failed writes: its ``f``-th failure
goes into record ``f % size`` of a pinned ring (``f`` in word 4, the
replay's number in word 0, written last), then ``f`` into the word after the
ring (the failure count).  Good replays write nothing, so any number of them
between two reads pushes no failure out.  The host reads failures in order,
each once; failures overwritten before they were read (more than ``size``
since the last read) are reported as lost, never dropped.  Reading costs no
driver call and never waits.
"""

from __future__ import annotations

import numpy as np

from ..cuda import abi
from ..cuda.outcomes import describe


class ReplayVerdicts:
    """The ring of ``size`` records in ``words`` (shape ``(size + 1,
    STATUS_WORDS)``, int64, pinned; word 0 of the last row counts the
    failures), read through :meth:`failures`.  ``read``: the failures read."""

    def __init__(self, size: int, words: np.ndarray):
        self.size, self.words, self.read = size, words, 0

    def failures(self, layout) -> list[Exception]:
        """The failures of the replays finished since the last call, oldest
        first (each once).  Call it after a replay finished (after its
        stream was synchronized or its completion word seen)."""
        words, size = self.words, self.size
        count = int(words[size, 0])
        if count <= self.read:
            return []
        first, out = self.read + 1, []
        lost = count - size  # failures first..lost: their records hold later ones
        if lost >= first:
            out.append(_lost(first, lost, size))
            first = lost + 1
        for f in range(first, count + 1):
            record = words[f % size]
            replay = int(record[0])
            kind, row, value = int(record[1]), int(record[2]), int(record[3])
            # The kernel zeroes word 0 before it rewrites a record and writes
            # it last: f and the same replay before and after the fields
            # mean they are failure f's.
            if int(record[4]) != f or not replay or int(record[0]) != replay:
                out.append(_lost(f, f, size))  # a later failure is being written over it
                continue
            error, what = describe(kind, row, value, layout)
            exc = error(
                f"replay #{replay} of a captured swap: {what} (checked in the replay; nothing was copied)"
            )
            exc.replay = replay
            out.append(exc)
        self.read = count
        return out


def _lost(first: int, last: int, size: int) -> RuntimeError:
    exc = RuntimeError(
        f"failures #{first}..#{last} of a captured swap were overwritten before they were read (a ring of "
        f"{size} records keeps the newest); call failures() more often or capture with a larger ring"
    )
    exc.replay = None
    return exc


def ring_words(size: int) -> tuple[int, int]:
    """``(rows, words per row)`` of a ring of ``size`` records and its count."""
    return size + 1, abi.STATUS_WORDS
