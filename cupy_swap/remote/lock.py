"""The agent's lock.  Invariant: every method that reads or changes an
agent's state, or calls NIXL, runs holding the agent's one re-entrant lock,
and no wait holds it: a call that must wait for something (a transfer, free
send slots, NIXL letting go of a request) takes the lock for each try and
sleeps (or yields) without it, so another thread's ``wait(timeout)`` or
``poll()`` is never held up by a wait it does not own.

NIXL runs with ``NIXL_THREAD_SYNC_STRICT`` too; the lock is what keeps the
agent's own tables consistent between threads.
"""

from __future__ import annotations

import functools
import time

from .handle import SPIN_S

__all__ = ["locked", "Pauses"]


def locked(method):
    """Run ``method`` holding the agent's lock (``self._lock``, re-entrant)."""

    @functools.wraps(method)
    def run(self, *args, **kwargs):
        with self._lock:
            return method(self, *args, **kwargs)

    return run


class Pauses:
    """The pauses between the tries of a wait, taken without the lock: none
    (a yield of the GIL) for the first :data:`~cupy_swap.remote.handle.SPIN_S`
    seconds, since over TCP bytes move only while someone polls, then 50 us
    doubling to 1 ms, as :meth:`Transfer.wait` does."""

    def __init__(self):
        self.start = time.monotonic()
        self.pause = 0.0

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def sleep(self) -> None:
        time.sleep(self.pause)
        if self.elapsed() > SPIN_S:
            self.pause = min(max(self.pause * 2, 50e-6), 1e-3)
