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
    def __init__(self, path=None, nbytes=None):
        self.ptr, self.start, self.check, self.seq = 0xE0, None, None, None
        self.path, self.nbytes = path, nbytes


class FakeKernel:
    """A bound kernel that records its launches and plays the kernel's part
    of a slot launch: ``("kernel", flat rows, stream, capturing, status,
    seq)`` (status and seq 0 when unchecked), ``("rows", n, ...)`` for a
    mapping on the GPU.  A slot launch completes at once, checking host rows
    as the kernel does (the verdict into the slot's record, ``seq`` last,
    the alarm on a failure, then the done word), unless ``held``: then it
    completes when a test calls :func:`land`."""

    def __init__(self, calls: list, ring: SlotRing):
        self.calls, self.ring = calls, ring
        self.layout, self.held = None, False

    def bind(self, layout):
        self.layout = layout
        return self

    def launch_slot(self, i, stream):
        c = self.ring.controls[i]
        n, status, seq = c[N_PAIRS], c[STATUS], c[SEQ]
        if c[SRC_INDEX]:
            self.calls.append(("rows", n, stream, False, status, seq))
            verdict = (0, 0, 0)
        else:
            flat = self.ring.words[i, abi.CONTROL_WORDS : abi.CONTROL_WORDS + 2 * n].tolist()
            self.calls.append(("kernel", flat, stream, False, status, seq if status else 0))
            verdict = _fake_check(flat, self.layout)
        if not self.held:
            complete(self.ring, i, seq, *(verdict if status else (0, 0, 0)), checked=bool(status))
        else:
            _HELD.append((self.ring, i, seq))

    def launch_captured(self, pairs, n, stream):
        flat = list(pairs) if type(pairs) is list else pairs.reshape(-1).tolist()
        self.calls.append(("kernel", flat, stream, True, 0, 0))


_HELD: list = []  # (ring, slot, seq) of launches tests held


def finish_held() -> None:
    """Complete every held launch a test left running (a dropped ring's
    release waits for its launches, as on a GPU)."""
    while _HELD:
        ring, i, seq = _HELD.pop()
        if ring.pending[i] == seq and ring.words[i, DONE] != seq:
            complete(ring, i, seq)


def _fake_check(flat: list, layout) -> tuple:
    """The kernel's check of rows ``[s0, d0, ...]``: ``(kind, row, value)``
    of the first bad row (1 source out of range, 2 destination out of range,
    3 a destination again), ``(0, 0, 0)`` when every row is good."""
    src_limit = layout.src_limit if layout is not None else 1 << 62
    dst_limit = layout.dst_limit if layout is not None else 1 << 62
    seen: set = set()
    for row in range(len(flat) // 2):
        s, d = flat[2 * row], flat[2 * row + 1]
        if not 0 <= s < src_limit:
            return 1, row, s
        if not 0 <= d < dst_limit:
            return 2, row, d
        if d in seen:
            return 3, row, d
        seen.add(d)
    return 0, 0, 0


def fake_ring(size: int = 4, capacity: int = 64) -> SlotRing:
    """A real slot ring over NumPy memory claiming device address 0x9000."""
    words = np.zeros((size + 1, SlotRing.row_words(capacity)), np.int64)
    return SlotRing(0, size, capacity, words=words, base=0x9000)


def complete(
    ring: SlotRing, i: int, seq: int, kind=0, row=0, value=0, checked=True, verdict=True, done=True
) -> None:
    """What slot ``i``'s launch ``seq`` writes when it ends: its verdict
    (``seq`` last; none with ``verdict=False``: a lost one), the alarm on a
    failure, then the done word (not with ``done=False``: other CTAs run on)."""
    w = ring.words
    at = ring._status
    if checked and verdict:
        w[i, at + 1 : at + 4] = kind, row, value
        w[i, at] = seq
        if kind:
            w[ring.size, 0] = seq
    if done:
        w[i, DONE] = seq


def land(ring: SlotRing, seq: int, kind=0, row=0, value=0, verdict: bool = True, done: bool = True) -> None:
    """Complete the held launch ``seq`` (see :func:`complete`)."""
    i = ring.pending.index(seq)
    complete(ring, i, seq, kind, row, value, verdict=verdict, done=done)


class FakeSwapper:
    """What ``PreparedSwap`` reads of a swapper; ``calls`` records the waits,
    capture queries, launches, copies and event records of each call."""

    def __init__(self, calls: list, slots_ok: bool = True, mapped: bool = True, ring_size: int = 4):
        self.calls = calls
        self.device, self.max_blocks, self.mode, self.timing = 0, 64, "auto", False
        self.policy, self.last_path, self._closed = Policy(), None, False
        ring = fake_ring(ring_size, capacity=self.max_blocks)
        if not mapped:  # no launch can report: every mapping is checked on the host
            ring.mapped = False
        self.kernel = kernel = FakeKernel(calls, ring)
        self._launcher = types.SimpleNamespace(
            bind=kernel.bind,
            slots=ring,
            slots_ok=slots_ok,
            check_rows_max=8192,
        )
        self._dma = types.SimpleNamespace(
            copy=lambda layout, pairs, stream, capturing, merge=True, run=None: calls.append(("dma", stream))
        )
        self._events = types.SimpleNamespace(
            take=lambda path, nbytes, timed=False: FakeEvent(path, nbytes),
            untracked=lambda path, nbytes, timed=False: FakeEvent(path, nbytes),
        )
        self._current_stream = lambda: types.SimpleNamespace(ptr=77)
        self._get_device = lambda: 0
        self._record = lambda ptr, stream: calls.append(("record", ptr, stream))
        self._wait_event = lambda stream, event, flags: calls.append(("wait", stream, event))


STAGED_HANDLE = 7  # the caller's stream in staged_stand_in


def staged_stand_in(monkeypatch, fake_gpu):
    """A staging ``Stager`` over stand-ins, every CUDA call recorded:
    ``(run, calls, stager)``.  ``run(direction, mapping)`` enqueues one
    staged swap of 32 KiB blocks (a host pool and a GPU cache of 2,500
    blocks each) on stream :data:`STAGED_HANDLE` and returns its plan;
    ``calls`` is every step, in order: ``("record", event, stream)``,
    ``("wait", stream, event)``, ``("copy", stream, count)``, ``("launch",
    stream, CTAs)``.  ``monkeypatch``: pytest's (or ``pytest.MonkeyPatch()``)."""
    import itertools
    import sys
    from pathlib import Path

    import cupy
    from cupy.cuda import runtime

    from cupy_swap.core.layout import layout_from_parts
    from cupy_swap.cuda import capture, release
    from cupy_swap.staged import stager as stager_module
    from cupy_swap.staged.plan import staged_plan

    root = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root / "benchmarks" / "probes"))
    try:
        import host_path_cpu as probe
    finally:
        sys.path.remove(str(root / "benchmarks" / "probes"))
    calls: list = []
    streams = itertools.count(100)

    class _Stream:
        def __init__(self, *args, **kwargs):
            self.ptr = next(streams)

        def synchronize(self):
            pass

    class _Device:
        def __init__(self, *args):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    class _Copier:
        def issue(self, dsts, srcs, sizes, stream, kind, capturing=False):
            calls.append(("copy", stream, len(sizes)))
            return len(sizes)

    monkeypatch.setattr(runtime, "eventRecord", lambda e, s: calls.append(("record", e, s)))
    monkeypatch.setattr(runtime, "streamWaitEvent", lambda s, e, f: calls.append(("wait", s, e)))
    monkeypatch.setattr(release, "device_malloc", lambda n, d: 0x7F00_0000_0000)
    monkeypatch.setattr(release, "device_free", lambda p, d: None)
    events = itertools.count(1)

    class _Event:
        def __init__(self, *args, **kwargs):
            self.ptr = next(events)

        def synchronize(self):
            pass

    monkeypatch.setattr(capture, "new_event", _Event)
    monkeypatch.setattr(cupy.cuda, "Stream", _Stream)
    monkeypatch.setattr(cupy.cuda, "Device", _Device)
    launcher = probe._Launcher()
    kernel_launch = launcher._launch

    def launch(*args):
        calls.append(("launch", args[8], args[1]))  # cuLaunchKernel's stream and grid
        kernel_launch(*args)

    launcher._launch = launch
    n, block = 2500, 32 << 10
    host = as_parts([np.zeros((n, block), np.uint8)], "host")
    gpu = [fake_gpu.part(np.zeros((n, block), np.uint8), "gpu")]
    stager = stager_module.Stager(0, 64 << 20)

    layouts: dict = {}  # one per direction, made once as an op makes it

    def run(direction, mapping):
        layout = layouts.get(direction)
        if layout is None:
            src, dst = (host, gpu) if direction == "in" else (gpu, host)
            layout = layouts[direction] = layout_from_parts(src, dst)
            layout.src_addrs, layout.dst_addrs = [p.ptr for p in src], [p.ptr for p in dst]
        plan = staged_plan(layout, mapping, Policy())
        stager.enqueue(layout, plan, STAGED_HANDLE, launcher, _Copier())
        return plan

    return run, calls, stager
