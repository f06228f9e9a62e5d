"""The fast-path closure of a prepared op (cupy_swap/prepared.py) against the
general path, on the CPU: a stand-in swapper records every launch, copy and
event record each path makes, and for every layout and mapping the two must
record the same thing (or the fast path must hand the call over), and
refuse the same bad input.  The general path is the one the GPU tests cover
call by call."""

import dataclasses

import numpy as np
import pytest

from cupy_swap.core.layout import layout_from_parts
from cupy_swap.core.parts import DEVICE, as_parts
from cupy_swap.core.route import Policy
from cupy_swap.cuda import memory
from cupy_swap.cuda.streams import Wait
from cupy_swap.prepared import PreparedSwap

cupy = pytest.importorskip("cupy", reason="the fast path binds cupy.cuda.runtime.memcpyAsync")

_ALIVE = []


class _Recorder:
    def __init__(self):
        self.calls = []


class _Kernel:
    def __init__(self, rec, max_pairs):
        self.rec, self.max_pairs = rec, max_pairs

    def launch(self, pairs, n, stream):
        if n > self.max_pairs:
            return False
        flat = pairs if type(pairs) is list else pairs.reshape(-1).tolist()
        self.rec.calls.append(("inline", tuple(flat), n, stream))
        return True


class _Launcher:
    def __init__(self, rec, max_pairs):
        self.rec, self.max_pairs = rec, max_pairs

    def bind(self, layout):
        return _Kernel(self.rec, self.max_pairs)

    def launch_descriptor(self, layout, pairs, stream, capturing, held):
        flat = pairs if type(pairs) is list else pairs.reshape(-1).tolist()
        self.rec.calls.append(("descriptor", tuple(flat), stream))

    def release(self, held, event, stream):
        pass


class _Copier:
    def __init__(self, rec):
        self.rec = rec

    def copy(self, layout, pairs, stream, capturing):
        from cupy_swap.core.copies import copy_list, pair_copies

        if type(pairs) is list and len(pairs) == 2:
            copies = pair_copies(layout, pairs[0], pairs[1])
        else:
            m = np.array(pairs, np.int64).reshape(-1, 2) if type(pairs) is list else pairs
            copies = [x.tolist() for x in copy_list(layout, m)]
        for d, s, z in zip(*copies):
            self.rec.calls.append(("memcpy", d, s, z, stream))


class _Stager:
    staging_bytes = 64 << 20

    def __init__(self, rec, fails=False):
        import threading

        self.rec, self.fails, self.lock = rec, fails, threading.Lock()

    def ensure(self):
        if self.fails:
            raise cupy.cuda.memory.OutOfMemoryError(self.staging_bytes, 0)

    def enqueue(self, layout, plan, stream, held, launcher, dma, serial):
        self.rec.calls.append(("staged", tuple(plan.sizes), stream))


class _Event:
    def __init__(self, disable_timing=True):
        self.ptr = id(self)
        self.start = None


class _Pool:
    def take(self, timed):
        return _Event()


class _Stream:
    ptr = 77


class _Swapper:
    """The attributes PreparedSwap reads, with recording stand-ins."""

    def __init__(self, rec, *, mode="auto", max_pairs=1792, policy=None):
        self.rec = rec
        self.device, self.max_blocks, self.mode, self.timing, self._closed = 0, 4096, mode, False, False
        self.policy, self.last_path, self._serial = policy or Policy(), None, iter(range(1000))
        self._stagers = {"in": _Stager(rec), "out": _Stager(rec)}
        self._launcher = _Launcher(rec, max_pairs)
        self._dma = _Copier(rec)
        self._events = _Pool()
        self._current_stream = lambda: _Stream()
        self._get_device = lambda: 0
        self._record = lambda ptr, stream: rec.calls.append(("record", stream))
        self._wait_event = lambda *a: rec.calls.append(("wait",) + a)
        self._new_event = _Event


def _parts(shape, gpu):
    a = np.zeros(shape, np.uint8)
    _ALIVE.append(a)
    parts = as_parts(a, "x")
    return [dataclasses.replace(p, location=DEVICE, device=0) for p in parts] if gpu else parts


def _layout(direction, block, parts=1, blocks=64):
    from cupy_swap.cuda.resolve import resolve_layout

    host = [p for _ in range(parts) for p in _parts((blocks, block), False)]
    gpu = [p for _ in range(parts) for p in _parts((blocks, block), True)]
    other_gpu = [p for _ in range(parts) for p in _parts((blocks, block), True)]
    src, dst = {"in": (host, gpu), "out": (gpu, host), "gpu->gpu": (gpu, other_gpu)}[direction]
    return resolve_layout(layout_from_parts(src, dst), 0)


_current: list = []  # the recorder of the call under test


@pytest.fixture(autouse=True)
def _no_cuda(monkeypatch):
    monkeypatch.setattr(memory, "host_mapping_status", lambda device: (True, ""))
    monkeypatch.setattr(memory, "host_alias", lambda ptr, nbytes: ptr + (1 << 44))
    monkeypatch.setattr("cupy_swap.prepared.stream_is_capturing", lambda stream: False)
    monkeypatch.setattr(
        "cupy_swap.prepared.wait_handle",
        lambda item, device, caller: Wait(1000 + id(item) % 1000, None, False),
    )
    monkeypatch.setattr(
        cupy.cuda.runtime,
        "memcpyAsync",
        lambda d, s, z, kind, stream: _current[-1].calls.append(("memcpy", d, s, z, stream)),
    )


def _both(layout, mapping, **sw_kw):
    """(fast-path record, general-path record) of one call each."""
    out = []
    for fast in (True, False):
        rec = _Recorder()
        _current.append(rec)
        op = PreparedSwap(_Swapper(rec, **sw_kw), layout, None)
        if fast:
            assert op._fast is not None
            ev = op._call(0, mapping, None, None, None, (), None)
        else:
            ev = op._run(0, mapping, None, None, None, (), None)
        out.append((rec.calls, ev.path, ev.nbytes))
    return out


MAPPINGS = [
    [(3, 5)],
    np.array([[3, 5]], np.int32),
    [(1, 2), (7, 9), (4, 4)],
    np.array([[i, 63 - i] for i in range(16)]),
    np.array([[i, (5 * i) % 64] for i in range(40)]),  # NumPy-checked
    [(i, i) for i in range(20)],  # a long list: NumPy path, one run
]


@pytest.mark.parametrize("direction", ["in", "out", "gpu->gpu"])
@pytest.mark.parametrize("block", [64, 4096, 256 << 10, 2 << 20])
@pytest.mark.parametrize("parts", [1, 3])
@pytest.mark.parametrize("which", range(len(MAPPINGS)))
def test_fast_path_issues_what_the_general_path_issues(direction, block, parts, which):
    layout = _layout(direction, block, parts)
    fast, general = _both(layout, MAPPINGS[which])
    assert fast == general


@pytest.mark.parametrize("mode", ["kernel", "dma"])
def test_default_modes(mode):
    layout = _layout("in", 4096)
    fast, general = _both(layout, [(1, 2), (3, 4)], mode=mode)
    assert fast == general


def test_swaps_beyond_the_inline_tiers_take_the_descriptor_ring():
    layout = _layout("out", 4096)
    m = np.array([[i, 63 - i] for i in range(40)])
    fast, general = _both(layout, m, max_pairs=16)
    assert fast == general and fast[0][0][0] == "descriptor"


@pytest.mark.parametrize(
    "bad, error",
    [
        ([(64, 0)], IndexError),
        ([(0, 1), (2, 1)], ValueError),
        ([(-1, 0)], IndexError),
        (np.array([[0.5, 1.0]]), TypeError),
        ([(0, 1, 2)], ValueError),
    ],
)
def test_bad_mappings_refused_alike_and_nothing_issued(bad, error):
    layout = _layout("in", 4096)
    for fast in (True, False):
        rec = _Recorder()
        _current.append(rec)
        op = PreparedSwap(_Swapper(rec), layout, None)
        call = op._call if fast else op._run
        with pytest.raises(error):
            call(0, bad, None, None, None, (), None)
        assert rec.calls == []


def test_empty_mapping_records_an_event_only():
    layout = _layout("in", 4096)
    fast, general = _both(layout, [])
    assert fast == general and fast[1] == "none" and fast[0] == [("record", 77)]


def test_every_path_is_compared():
    """The cases above reach each thing a swap can issue."""
    seen = set()
    for direction in ("in", "out", "gpu->gpu"):
        for block in (64, 4096, 256 << 10, 2 << 20):
            for parts in (1, 3):
                for m in MAPPINGS:
                    calls, path, _ = _both(_layout(direction, block, parts), m)[0]
                    seen |= {c[0] for c in calls} | {path}
    assert {"inline", "memcpy", "staged", "kernel", "dma"} <= seen


@pytest.mark.parametrize("wait_for", [0, 1, [0], cupy.cuda.Stream.null])
def test_wait_for_the_legacy_stream_handle_is_not_dropped(wait_for):
    """``wait_for=0`` (the legacy default stream's raw handle) is falsy but
    still a stream to wait for."""
    rec = _Recorder()
    _current.append(rec)
    op = PreparedSwap(_Swapper(rec), _layout("in", 4096), None)
    op._call(0, [(1, 2)], None, None, None, wait_for, None)
    assert [c[0] for c in rec.calls].count("wait") == 1


def test_staging_arena_that_cannot_be_allocated():
    """auto falls back to the kernel before anything is enqueued; an explicit
    staged swap says why."""
    layout = _layout("in", 256 << 10, 3)
    m = np.column_stack((np.arange(40), (np.arange(40) * 5) % 64))  # host blocks in one run: staged
    rec = _Recorder()
    _current.append(rec)
    sw = _Swapper(rec)
    sw._stagers = {"in": _Stager(rec, fails=True), "out": _Stager(rec, fails=True)}
    op = PreparedSwap(sw, layout, None)
    ev = op._call(0, m, None, None, None, (), None)
    assert ev.path == "kernel" and rec.calls[0][0] == "inline"
    rec.calls.clear()
    with pytest.raises(ValueError, match="could not allocate its staging arena"):
        op._call(0, m, None, None, "staged", (), None)
    assert rec.calls == []
