"""Stand-ins shared by the CPU tests; ``conftest.py`` hands them out as the
``fake_gpu`` and ``fake_cuda`` fixtures.

* :class:`FakeGpu`: NumPy arrays described as parts that claim to be GPU
  memory, so layouts, routes and launches are checked without a driver.
* :class:`FakeCudaRuntime`: CUDA's runtime as ``cupy_swap.cuda.memory``
  calls it (pinned allocations, registrations, pointer attributes).
* :class:`FakeSwapper`: what a ``PreparedSwap`` reads of its swapper, with
  a kernel and a copier that record what a call enqueues, and a status
  board over NumPy memory (:func:`host_board`)."""

from __future__ import annotations

import dataclasses
import types

import numpy as np

from cupy_swap.core.parts import DEVICE, Part, as_parts
from cupy_swap.core.route import Policy
from cupy_swap.cuda import abi, memory
from cupy_swap.cuda.outcomes import StatusBoard
from cupy_swap.cuda.slots import DONE, N_PAIRS, SEQ, SRC_INDEX, STATUS, SlotRing


def on_gpu(parts: list[Part], device: int = 0) -> list[Part]:
    """The same parts, claiming to be memory of GPU ``device``."""
    return [dataclasses.replace(p, location=DEVICE, device=device) for p in parts]


class FakeGpu:
    """Parts of NumPy arrays that claim to be GPU memory.  Parts hold no
    reference to their arrays: this keeps every array it was given alive
    until :meth:`release` (the end of the test, for the fixture)."""

    def __init__(self):
        self._arrays: list = []

    def keep(self, obj):
        """``obj``, kept alive until :meth:`release`."""
        self._arrays.append(obj)
        return obj

    def parts(self, obj, name: str, convert=None, device: int = 0) -> list[Part]:
        """``as_parts(obj, name, convert)``, on GPU ``device``."""
        return on_gpu(as_parts(self.keep(obj), name, convert), device)

    def part(self, array, name: str, device: int = 0) -> Part:
        """The one part of ``array``, on GPU ``device``."""
        (p,) = self.parts(array, name, device=device)
        return p

    def release(self) -> None:
        self._arrays.clear()


class FakeCudaRuntime:
    """Stands in for CUDA: ``hostAlloc`` hands out page-aligned addresses of
    real bytes (arrays over them may be read), ``hostRegister`` records the
    range; memory allocated and not freed, or registered and not
    unregistered, is page-locked host memory whose device alias is its own
    address; anything else is unregistered memory.  Tests replace methods
    (``fake.hostRegister = ...``) to record or refuse calls."""

    def __init__(self):
        self.memory, self.allocated, self.freed = [], [], []
        self.registered, self.unregistered = [], []

    def hostAlloc(self, nbytes, flags):
        self.memory.append(np.empty(nbytes + 4096, np.uint8))
        start = -(-self.memory[-1].ctypes.data // 4096) * 4096
        self.allocated.append((start, nbytes))
        return start

    def freeHost(self, ptr):
        self.freed.append(ptr)

    def hostRegister(self, ptr, nbytes, flags):
        self.registered.append((ptr, nbytes))

    def hostUnregister(self, ptr):
        self.unregistered.append(ptr)

    def getDevice(self):
        return 0

    def setDevice(self, device):
        pass

    def pointerGetAttributes(self, ptr):
        live = any(p <= ptr < p + n and p not in self.freed for p, n in self.allocated) or any(
            p <= ptr < p + n and p not in self.unregistered for p, n in self.registered
        )
        return types.SimpleNamespace(
            type=memory._MEMORY_TYPE_HOST if live else 0, devicePointer=ptr if live else 0
        )


def case_row(case, mode: str) -> dict:
    """What ``bench.run_case`` returns for ``case``, with made-up figures (for
    command-line tests that stub the measurements)."""
    return {
        **case.describe(),
        "mode": mode,
        "path": "kernel",
        "gbps": 1.0,
        "ceiling_gbps": 2.0,
        "ratio": 0.5,
        "device_ratio": 0.5,
        "latency_s": 1e-3,
        "verified": True,
    }


class FakeEvent:
    def __init__(self):
        self.ptr, self.start, self.check, self.seq = 0xE0, None, None, None


class FakeKernel:
    """A bound kernel that records its launches and, for a slot launch,
    completes at once (writes the slot's done word, as the last CTA does):
    ``("kernel", flat rows, stream, capturing, status, seq)`` (seq 0 when
    unchecked), ``("rows", n, ...)`` for a mapping on the GPU."""

    def __init__(self, calls: list, ring: SlotRing):
        self.calls, self.ring = calls, ring

    def launch_slot(self, i, stream):
        c = self.ring.controls[i]
        n, status, seq = c[N_PAIRS], c[STATUS], c[SEQ]
        if c[SRC_INDEX]:
            self.calls.append(("rows", n, stream, False, status, seq))
        else:
            flat = self.ring.words[i, abi.CONTROL_WORDS : abi.CONTROL_WORDS + 2 * n].tolist()
            self.calls.append(("kernel", flat, stream, False, status, seq if status else 0))
        c[DONE] = seq

    def launch_captured(self, pairs, n, stream):
        flat = list(pairs) if type(pairs) is list else pairs.reshape(-1).tolist()
        self.calls.append(("kernel", flat, stream, True, 0, 0))

    def launch_descriptor(self, pairs, n, stream, held):
        flat = list(pairs) if type(pairs) is list else pairs.reshape(-1).tolist()
        self.calls.append(("descriptor", flat, stream, False, 0, 0))


def fake_ring(size: int = 4, capacity: int = 64) -> SlotRing:
    """A real slot ring over NumPy memory claiming device address 0x9000."""
    words = np.zeros((size, abi.CONTROL_WORDS + 2 * capacity), np.int64)
    return SlotRing(0, size, capacity, words=words, base=0x9000)


def host_board(base: int = 0x5000, slots: int = 64) -> StatusBoard:
    """A real status board over NumPy memory at device address ``base``
    (0: not mapped); tests write what a launch would with :func:`land`."""
    return StatusBoard(0, slots, records=np.zeros((slots + 1, abi.STATUS_WORDS), np.int64), base=base)


def land(board: StatusBoard, seq: int, kind: int = 0, row: int = 0, value: int = 0) -> None:
    """Write swap ``seq``'s verdict into its record as its launch does: the
    verdict, ``seq`` last, then on a failure the alarm word."""
    index = next(i for i, t in enumerate(board._tickets) if t is not None and t.seq == seq)
    board.records[index, 1:4] = kind, row, value
    board.records[index, 0] = seq
    if kind:
        board.records[board.slots, 0] = seq


class FakeSwapper:
    """What ``PreparedSwap`` reads of a swapper; ``calls`` records the waits,
    capture queries, launches, copies and event records of each call."""

    def __init__(self, calls: list, board: StatusBoard | None = None, slots_ok: bool = True):
        self.calls = calls
        self.device, self.max_blocks, self.mode, self.timing = 0, 64, "auto", False
        self.policy, self.last_path, self._closed = Policy(), None, False
        self._status = host_board() if board is None else board
        ring = fake_ring(capacity=self.max_blocks)
        kernel = FakeKernel(calls, ring)
        self._launcher = types.SimpleNamespace(
            bind=lambda layout: kernel,
            slots=ring,
            slots_ok=slots_ok,
            check_rows_max=8192,
            keep_until_done=lambda event, keep: calls.append(("keep", keep)),
        )
        self._dma = types.SimpleNamespace(
            copy=lambda layout, pairs, stream, capturing, merge=True: calls.append(("dma", stream))
        )
        self._events = types.SimpleNamespace(take=lambda timed: FakeEvent())
        self._current_stream = lambda: types.SimpleNamespace(ptr=77)
        self._get_device = lambda: 0
        self._record = lambda ptr, stream: calls.append(("record", ptr, stream))
        self._wait_event = lambda stream, event, flags: calls.append(("wait", stream, event))
