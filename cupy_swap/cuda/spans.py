"""The one registry mechanism of pinned host memory: a sorted, thread-safe
set of non-overlapping byte spans ``[start, end)``, each with its record.
Two instances use it: the ranges cupy_swap pinned (:mod:`.memory`) and
the host pools pinned in chunks (:mod:`.pools`, whose chunks are also
ranges of the first)."""

from __future__ import annotations

import bisect
import threading


class Spans:
    """Non-overlapping spans, each with a record, sorted by start."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._starts: list[int] = []
        self._spans: list[tuple[int, object]] = []  # (end, record), as _starts

    def add(self, start: int, end: int, record) -> None:
        with self._lock:
            i = bisect.bisect_right(self._starts, start)
            self._starts.insert(i, start)
            self._spans.insert(i, (end, record))

    def remove(self, start: int, record=None):
        """Remove the span at ``start`` (only if it holds ``record``, when
        given) and return its record; None when there is none."""
        with self._lock:
            i = bisect.bisect_left(self._starts, start)
            if i < len(self._starts) and self._starts[i] == start:
                if record is None or self._spans[i][1] is record:
                    del self._starts[i]
                    return self._spans.pop(i)[1]
        return None

    def holding(self, lo: int, hi: int):
        """The record of the span holding all of ``[lo, hi)``, or None."""
        with self._lock:
            i = bisect.bisect_right(self._starts, lo) - 1
            if i >= 0 and hi <= self._spans[i][0]:
                return self._spans[i][1]
        return None

    def overlapping(self, lo: int, hi: int):
        """The record of a span that shares a byte with ``[lo, hi)``, or None."""
        with self._lock:
            i = bisect.bisect_right(self._starts, max(lo, hi - 1)) - 1
            while i >= 0:
                end, record = self._spans[i]
                if self._starts[i] < hi and lo < end:
                    return record
                if end <= lo:
                    return None
                i -= 1
        return None

    def __len__(self) -> int:
        return len(self._starts)
