"""Mappings that already live on the GPU (a CuPy array or a torch CUDA
tensor of int64 ``(N, 2)`` rows, as SGLang and LMCache keep them): swapped
with no host synchronization, checked on the GPU.

Per call, on the swap's stream: a check kernel validates the rows (indices
in range, no destination block twice) and writes its verdict into a status
slot in pinned memory; the copy kernel reads the slot first and copies only
if the check passed.  So a bad mapping writes no byte, and its error
reaches the caller

* from the returned event's ``synchronize()``, and
* from the next call of the same op, if the check has run by then.

An op keeps :data:`SLOTS` status slots; a slot is reused only after the
event of the swap that last used it has completed (the verdict is then
moved onto that event), like the descriptor ring.
"""

from __future__ import annotations

import sys
import threading
from typing import NamedTuple

import numpy as np

from . import abi, memory

__all__ = ["DeviceMapping", "device_mapping", "GpuChecks", "SLOTS"]

SLOTS = 16
_HOST_KINDS = (list, tuple, np.ndarray)
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
    if type(obj) in _HOST_KINDS:
        return None
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


class Ticket:
    """What a swap's event needs to report its check: the slot and the
    swap's number, or the verdict once the slot was reused."""

    __slots__ = ("checks", "index", "seq", "verdict")

    def __init__(self, checks: GpuChecks, index: int, seq: int):
        self.checks, self.index, self.seq, self.verdict = checks, index, seq, None

    def raise_if_failed(self) -> None:
        """Raise the check's error (call after the swap's event completed)."""
        verdict = self.verdict or self.checks.read(self.index, self.seq)
        if verdict is not None and verdict[0]:
            raise self.checks.error(verdict)


class GpuChecks:
    """The status slots and kernel arguments of one op's GPU-mapping swaps.

    Parameters
    ----------
    launcher : Launcher
    layout : Layout
        Resolved, with mapped host memory and no parts that may meet.
    """

    def __init__(self, launcher, layout):
        parts = len(layout.src)
        tier = next(p for p in abi.BYREF_PARTS if p >= parts)
        name = abi.byref_kernel(layout.width, tier)
        from . import kernels

        if not kernels.has_function(launcher.device, name):
            raise ValueError(
                f"block_mapping: a mapping on the GPU with {parts} parts needs CUDA 12.1 or later (kernel "
                f"parameters over 4 KiB); pass the rows on the host or use at most {abi.BYREF_PARTS[0]} parts"
            )
        self._launcher, self.layout = launcher, layout
        self._copy = abi.ByRefArgs(tier, layout.table, layout.units_per_pair, launcher.function(name))
        self._check = abi.CheckArgs(layout.src_limit, layout.dst_limit)
        self._check_fn = launcher.function(abi.CHECK_KERNEL)
        self.status = memory.zeros_pinned((SLOTS, abi.STATUS_WORDS), np.int64)
        self._alias = memory.host_alias(self.status.ctypes.data, self.status.nbytes)
        self._slots = [_Slot() for _ in range(SLOTS)]
        self._seq = 0
        self._reported = 0  # the last seq whose failure a later call raised
        self._lock = threading.Lock()
        from cupy.cuda import runtime

        self._wait = runtime.eventSynchronize

    def read(self, index: int, seq: int) -> tuple | None:
        """``(kind, row, other, value)`` of swap ``seq`` if its check ran."""
        item = self.status.item
        if item(index, 0) != seq:
            return None
        return (item(index, 1), item(index, 2), item(index, 3), item(index, 4))

    def error(self, verdict: tuple) -> Exception:
        kind, row, other, value = verdict
        layout, where = self.layout, "checked on the GPU; nothing was copied"
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

    def launch(self, mapping: DeviceMapping, stream: int, event, record) -> Ticket:
        """Enqueue the check and the copy of ``mapping`` on ``stream`` and
        record ``event`` behind them (``record(event_ptr, stream)``).

        Raises
        ------
        IndexError, ValueError
            The check of an earlier swap of this op failed (raised once).
        """
        lau = self._launcher
        with self._lock:
            self._raise_earlier_failure()
            self._seq += 1
            seq, index = self._seq, self._seq % SLOTS
            slot = self._slots[index]
            if slot.event is not None:  # the slot's last swap must be done before its status is rewritten
                self._wait(slot.event.ptr)
                slot.ticket.verdict = self.read(index, slot.seq)
            status = self._alias + 8 * abi.STATUS_WORDS * index
            units = mapping.n * self.layout.units_per_pair
            grid, threads = lau.shape(units)
            check_threads = abi.MAX_THREADS if mapping.n > 256 else 256
            steps = (
                (self._check_fn, 1, check_threads, self._check.set(mapping.ptr, mapping.n, status, seq)),
                (self._copy.fn, grid, threads, self._copy.set(mapping.n, mapping.ptr, status, seq)),
            )
            with lau.inline_lock:  # one graph: the check, then the copy
                lau.launch_steps(steps, (self._check_fn, self._copy.fn, stream), stream, False)
            record(event.ptr, stream)
            slot.seq, slot.event, slot.keep = seq, event, mapping.keep
            slot.ticket = Ticket(self, index, seq)
            return slot.ticket

    def _raise_earlier_failure(self) -> None:
        """Raise, once, the failure of the previous swap if its check ran."""
        seq = self._seq
        if seq > self._reported:
            verdict = self.read(seq % SLOTS, seq)
            if verdict is not None and verdict[0]:
                self._reported = seq
                raise self.error(verdict)
