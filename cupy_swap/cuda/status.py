"""Where copy launches report the check of their rows.

A swapper owns one :class:`StatusBoard`: :data:`SLOTS` status records in
mapped pinned memory, allocated once with the swapper.  Every swap checked
inside its launch takes the next number ``seq`` and passes the device
address of record ``seq % SLOTS``; CTA 0 writes the verdict there, ``seq``
last (see ``kernels_cu/swap_abi.cuh``).  The host reads a record without
synchronizing: if it holds ``seq``, that swap's check has run.  A record is
overwritten only by the swap :data:`SLOTS` numbers later, so the verdict of
a swap stays readable until that many later swaps of the swapper have run
their checks.

Errors reach the caller from the swap's event (``synchronize()``), and from
the next call of the same op once the check has run (:class:`Verdicts`).
"""

from __future__ import annotations

import collections
import itertools
import threading

import numpy as np

from . import abi, memory

__all__ = ["StatusBoard", "Verdicts", "SLOTS", "mapping_error"]

SLOTS = 4096
_KIND, _ROW, _VALUE = 1, 2, 3


class StatusBoard:
    """The status records of one swapper's launches.

    Parameters
    ----------
    device : int
        The swapper's GPU (the records are allocated with it current).
    slots : int
        Records (tests make few to see them reused).

    Attributes
    ----------
    base : int
        Device address of record 0, or 0 where host memory cannot be mapped
        into the GPU's address space: then no launch can report, and every
        mapping is checked on the host.
    """

    def __init__(self, device: int, slots: int = SLOTS):
        self.slots = slots
        self.records = memory.zeros_pinned_for_gpu((slots, abi.STATUS_WORDS), np.int64, device)
        self.base = memory.host_alias(self.records.ctypes.data, self.records.nbytes)
        self._numbers = itertools.count(1)  # next() is atomic under the GIL
        self._item = self.records.item

    def take(self) -> tuple[int, int]:
        """``(status address, seq)`` for the next checked launch."""
        seq = next(self._numbers)
        return self.base + 8 * abi.STATUS_WORDS * (seq % self.slots), seq

    def verdict(self, seq: int) -> tuple | None:
        """``(kind, row, value)`` of swap ``seq`` once its check has run;
        None before, and once the record was overwritten (kind -1)."""
        at = seq % self.slots
        held = self._item(at, 0)
        if held < seq:
            return None
        if held > seq:
            return (-1, 0, 0)
        return (self._item(at, _KIND), self._item(at, _ROW), self._item(at, _VALUE))


def mapping_error(verdict: tuple, layout) -> Exception:
    """The exception of a failed check, naming the row and the part."""
    kind, row, value = verdict
    where = "checked by the copy launch; nothing was copied"
    if kind == 3:
        return ValueError(
            f"block_mapping: expected distinct destination blocks, got block {value} again in row {row} "
            f"({where})"
        )
    side, limit, name = (
        ("source", layout.src_limit, layout.src_limit_name)
        if kind == 1
        else ("destination", layout.dst_limit, layout.dst_limit_name)
    )
    return IndexError(
        f"block_mapping: {side} block index {value} in row {row} is out of range for {name} with "
        f"{limit} blocks (expected 0 <= index < {limit}; {where})"
    )


class Verdicts:
    """The checked launches of one op whose verdict the host has not read:
    each call of the op first reads those whose check has run, oldest first,
    and raises the first failure no event has raised yet.

    Parameters
    ----------
    board : StatusBoard
    layout : Layout
        For messages.
    """

    __slots__ = ("board", "layout", "unread", "reported", "lock")

    def __init__(self, board: StatusBoard, layout):
        self.board, self.layout = board, layout
        self.unread: collections.deque = collections.deque()
        self.reported = 0  # highest seq whose failure was raised
        self.lock = threading.Lock()  # ops are shared by threads: one reader at a time

    def read(self) -> None:
        """Raise the first failure among the checks that have run (once).
        A check whose record was overwritten (:data:`SLOTS` later launches
        of the swapper) is dropped; so is the oldest unread one once as
        many are waiting, so a record that never comes cannot stall it."""
        verdict = self.board.verdict
        with self.lock:
            unread = self.unread
            while len(unread) > self.board.slots:
                unread.popleft()
            while unread:
                seq = unread[0]
                v = verdict(seq)
                if v is None:
                    return  # not run yet: the later ones most likely neither
                unread.popleft()
                if v[0] > 0 and seq > self.reported:
                    self.reported = seq
                    raise mapping_error(v, self.layout)

    def raise_for(self, seq: int) -> None:
        """Raise swap ``seq``'s failure (its event completed), every time."""
        v = self.board.verdict(seq)
        if v is not None and v[0] > 0:
            self.reported = max(self.reported, seq)
            raise mapping_error(v, self.layout)
