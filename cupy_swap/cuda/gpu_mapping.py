"""Mappings that already live on the GPU (a CuPy array or a torch CUDA
tensor of int64 ``(N, 2)`` rows, as SGLang and LMCache keep them): swapped
with no host synchronization, checked on the GPU.

Per call, on the swap's stream: a check kernel validates the rows (indices
in range, no destination block twice) and writes its verdict into a status
slot in pinned memory; the copy kernel reads the slot first and copies only
if the check passed.  So a bad mapping writes no byte, and its error
reaches the caller

* from the returned event's ``synchronize()`` (every time), and
* from the next call of the same op (host or GPU mapping), if the check
  has run by then and the event has not raised it yet.

An op keeps :data:`SLOTS` status slots; a slot is reused only after the
event of the swap that last used it has completed (the verdict is then
moved onto that event), like the descriptor ring.
"""

from __future__ import annotations

import functools
import sys
import threading
import weakref
from typing import NamedTuple

import numpy as np

from . import abi, memory

__all__ = ["DeviceMapping", "device_mapping", "GpuChecks", "SLOTS"]

SLOTS = 16
_INT64 = np.dtype(np.int64)


class DeviceMapping(NamedTuple):
    """A checked-on-the-host view of a GPU mapping: its rows' address, row
    count, and the object that keeps the memory alive."""

    ptr: int
    n: int
    keep: object


def device_mapping(obj, device: int, max_blocks: int) -> DeviceMapping | None:
    """The GPU mapping ``obj`` describes, or None for host mappings.

    Raises
    ------
    TypeError, ValueError
        A GPU array that is not C-contiguous int64 of shape (N, 2) on
        ``device``, or with more than ``max_blocks`` or
        :data:`~.abi.CHECK_MAX_ROWS` rows (checked without reading it).
    """
    cupy = sys.modules.get("cupy")
    if cupy is not None and type(obj) is cupy.ndarray:
        owner, ptr, contiguous = obj.data.device_id, obj.data.ptr, obj.flags.c_contiguous
        int64, shape = obj.dtype == _INT64, obj.shape
    elif getattr(obj, "is_cuda", False):  # torch CUDA tensor
        owner, ptr, contiguous = obj.get_device(), obj.data_ptr(), obj.is_contiguous()
        int64, shape = obj.dtype is sys.modules["torch"].int64, tuple(obj.shape)
    else:
        return None
    if not int64:
        dtype = str(obj.dtype).replace("torch.", "")
        raise TypeError(f"block_mapping: expected int64 rows on the GPU, got {dtype}; convert it first")
    if len(shape) != 2 or shape[1] != 2:
        raise ValueError(f"block_mapping: expected shape (N, 2) of (src_block, dst_block) rows, got {shape}")
    if not contiguous:
        raise ValueError("block_mapping: expected a C-contiguous GPU array; make a contiguous copy first")
    if owner != device:
        raise ValueError(
            f"block_mapping: expected a mapping on GPU {device} (the swapper's), got one on GPU {owner}"
        )
    limit = min(max_blocks, abi.CHECK_MAX_ROWS)
    if shape[0] > limit:
        raise ValueError(
            f"block_mapping: a mapping on the GPU holds at most {limit} rows (max_blocks={max_blocks}; the GPU "
            f"check sorts at most {abi.CHECK_MAX_ROWS}), got {shape[0]}; split the swap or pass the rows on the host"
        )
    return DeviceMapping(ptr, shape[0], obj)


class _Slot:
    __slots__ = ("seq", "event", "ticket", "keep")

    def __init__(self):
        self.seq, self.event, self.ticket, self.keep = 0, None, None, None


class _Verdicts:
    """What an op's swaps and their events share to report checks: the
    status slots, the lock that orders reading a slot against its reuse,
    the last swap whose failure was raised, and the layout for messages.
    Holds nothing that holds it: no reference cycle through the events."""

    __slots__ = ("status", "lock", "reported", "layout")

    def __init__(self, status: np.ndarray, layout):
        self.status, self.lock, self.reported, self.layout = status, threading.Lock(), 0, layout

    def read(self, index: int, seq: int) -> tuple | None:
        """``(kind, row, other, value)`` of swap ``seq`` if its check ran."""
        item = self.status.item
        if item(index, 0) != seq:
            return None
        return (item(index, 1), item(index, 2), item(index, 3), item(index, 4))

    def raise_failure(self, seq: int, verdict: tuple | None, again: bool) -> None:
        """Raise swap ``seq``'s failure (``again``: even if raised before)."""
        if verdict is not None and verdict[0] and (again or seq > self.reported):
            self.reported = max(self.reported, seq)
            raise _error(verdict, self.layout)


def _error(verdict: tuple, layout) -> Exception:
    kind, row, other, value = verdict
    where = "checked on the GPU; nothing was copied"
    if kind == 3:
        return ValueError(
            f"block_mapping: expected distinct destination blocks, got block {value} twice "
            f"(rows {row} and {other}; {where})"
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


class Ticket:
    """What a swap's event needs to report its check: the slot and the
    swap's number, or the verdict once the slot was reused."""

    __slots__ = ("__weakref__", "verdicts", "index", "seq", "verdict")

    def __init__(self, verdicts: _Verdicts, index: int, seq: int):
        self.verdicts, self.index, self.seq, self.verdict = verdicts, index, seq, None

    def raise_if_failed(self) -> None:
        """Raise the check's error, on every call (call after the swap's
        event completed); the op's next call then does not raise it."""
        v = self.verdicts
        with v.lock:  # a reuse of the slot moves the verdict here first
            verdict = self.verdict or v.read(self.index, self.seq)
            v.raise_failure(self.seq, verdict, again=True)


class GpuChecks:
    """The status slots, validated-row buffers and kernel arguments of one
    op's GPU-mapping swaps.

    The check kernel copies the rows it validated into a device buffer of
    the slot, and the copy kernel reads them from there: rows rewritten
    between the two kernels cannot reach the copy unchecked.  That buffer
    (16 bytes a row, ``SLOTS`` x the op's most rows) is allocated on the
    op's first GPU-mapping swap and freed once the swaps that used it have
    completed.

    Parameters
    ----------
    launcher : Launcher
    layout : Layout
        Resolved, with mapped host memory and no parts that may meet.
    max_rows : int
        Most rows one swap may carry.
    """

    def __init__(self, launcher, layout, max_rows: int):
        parts = len(layout.src)
        tier = next(p for p in abi.BYREF_PARTS if p >= parts)
        name = abi.byref_kernel(layout.width, tier)
        from cupy.cuda import runtime

        from . import kernels, release

        if not kernels.has_function(launcher.device, name):
            raise ValueError(
                f"block_mapping: a mapping on the GPU with {parts} parts needs CUDA 12.1 or later (kernel "
                f"parameters over 4 KiB); pass the rows on the host or use at most {abi.BYREF_PARTS[0]} parts"
            )
        self._launcher, self.layout = launcher, layout
        self._copy = abi.ByRefArgs(tier, layout.table, layout.units_per_pair, launcher.function(name))
        self._check = abi.CheckArgs(layout.src_limit, layout.dst_limit)
        self._check_fn = launcher.function(abi.CHECK_KERNEL)
        status = memory.zeros_pinned_for_gpu((SLOTS, abi.STATUS_WORDS), np.int64, launcher.device)
        self._alias = memory.host_alias(status.ctypes.data, status.nbytes)
        self._verdicts = _Verdicts(status, layout)
        self._row_bytes = 16 * max_rows
        self._rows = release.device_malloc(SLOTS * self._row_bytes, launcher.device)
        self._slots = [_Slot() for _ in range(SLOTS)]
        self._seq = 0
        self._lock = threading.Lock()
        self._wait = runtime.eventSynchronize
        free = functools.partial(release.device_free, self._rows, launcher.device)
        gate = functools.partial(_wait_for_slots, self._slots)
        release.when_dropped(self, free, gate, f"GPU-mapping rows on GPU {launcher.device}")

    def raise_earlier_failure(self) -> None:
        """Raise the failure of this op's latest swap if its check has run and
        neither its event nor an earlier call raised it yet."""
        v = self._verdicts
        seq = self._seq
        if seq > v.reported:
            with v.lock:
                v.raise_failure(seq, v.read(seq % SLOTS, seq), again=False)

    def launch(self, mapping: DeviceMapping, stream: int, event, record) -> Ticket:
        """Enqueue the check and the copy of ``mapping`` on ``stream`` and
        record ``event`` behind them (``record(event_ptr, stream)``).

        Raises
        ------
        IndexError, ValueError
            The check of an earlier swap of this op failed (raised once).
        """
        lau, v = self._launcher, self._verdicts
        with self._lock:
            self.raise_earlier_failure()
            seq, index = self._seq + 1, (self._seq + 1) % SLOTS
            slot = self._slots[index]
            if slot.event is not None:  # the slot's last swap must be done before its buffers are rewritten
                self._wait(slot.event.ptr)
                ticket = slot.ticket()
                if ticket is not None:
                    with v.lock:
                        ticket.verdict = v.read(index, slot.seq)
            status = self._alias + 8 * abi.STATUS_WORDS * index
            rows = self._rows + self._row_bytes * index
            grid, threads = lau.shape(mapping.n * self.layout.units_per_pair)
            check_threads = abi.MAX_THREADS if mapping.n > 256 else 256
            steps = (
                (
                    self._check_fn,
                    1,
                    check_threads,
                    self._check.set(mapping.ptr, mapping.n, status, seq, rows),
                ),
                (self._copy.fn, grid, threads, self._copy.set(mapping.n, rows, status, seq)),
            )
            with lau.inline_lock:  # one graph: the check, then the copy
                lau.launch_steps(steps, (self._check_fn, self._copy.fn, stream), stream, False)
            record(event.ptr, stream)
            self._seq = seq
            ticket = Ticket(v, index, seq)
            slot.seq, slot.event, slot.keep, slot.ticket = seq, event, mapping.keep, weakref.ref(ticket)
            return ticket


def _wait_for_slots(slots: list) -> None:
    from cupy.cuda import runtime

    for slot in slots:
        if slot.event is not None:
            runtime.eventSynchronize(slot.event.ptr)  # the plain wait: a failed check is no release failure
