"""bench --gpus's timing harness on the CPU (tools/node.py), in virtual
time: stand-in workers whose steps take known times on a clock the harness
reads (``node.time``), and a barrier that lets every thread go at the
latest arrival's time, as a real one does.  The span runs from the first
start to the last end, each GPU's figure from its own start to its own end;
no test sleeps or reads the wall clock."""

import queue
import threading
import types

import numpy as np
import pytest

from cupy_swap.tools import node

POLL_S = 0.001  # virtual time one done() poll takes


class _Clock:
    """A virtual ``time`` module: one clock per thread, which moves only when
    a stand-in waits (``sleep``, ``advance_to``)."""

    def __init__(self):
        self._local = threading.local()

    def perf_counter(self) -> float:
        return getattr(self._local, "now", 0.0)

    monotonic = perf_counter

    def advance_to(self, t: float) -> None:
        self._local.now = max(self.perf_counter(), t)

    def sleep(self, seconds: float) -> None:
        self.advance_to(self.perf_counter() + seconds)


class _Barrier(threading.Barrier):
    """A real barrier whose threads all leave at the virtual time of the last
    one to arrive."""

    def __init__(self, clock: _Clock, parties: int, timeout=None):
        super().__init__(parties, action=self._leave_at_the_latest, timeout=timeout)
        self._clock, self._arrivals, self._leave = clock, [], 0.0

    def wait(self, timeout=None):
        self._arrivals.append(self._clock.perf_counter())
        index = super().wait(timeout)
        self._clock.advance_to(self._leave)
        return index

    def _leave_at_the_latest(self):  # run by the last thread in, before any leaves
        self._leave, self._arrivals = max(self._arrivals), []


@pytest.fixture
def clock(monkeypatch):
    """The harness on a :class:`_Clock`, its barriers :class:`_Barrier`."""
    clock = _Clock()
    fake_time = types.SimpleNamespace(
        perf_counter=clock.perf_counter, monotonic=clock.monotonic, sleep=clock.sleep
    )
    fake_threading = types.SimpleNamespace(**vars(threading))
    fake_threading.Barrier = lambda parties, timeout=None: _Barrier(clock, parties, timeout)
    monkeypatch.setattr(node, "time", fake_time)
    monkeypatch.setattr(node, "threading", fake_threading)
    return clock


class _Slow:
    """A stand-in GPU whose step takes ``seconds`` of virtual time: issuing
    returns at once, sync waits out the rest, each done() poll takes POLL_S."""

    def __init__(self, clock, seconds):
        self.clock, self.seconds, self.started, self.calls = clock, seconds, None, []

    def swap(self, direction):
        self.calls.append(("swap", direction))
        self.started = self.clock.perf_counter()

    memcpy = swap

    def sync(self):
        self.clock.advance_to(self.started + self.seconds)

    def done(self):
        if self.clock.perf_counter() >= self.started + self.seconds:
            return True
        self.clock.sleep(POLL_S)
        return False


class _Broken(_Slow):
    def swap(self, direction):
        raise ValueError("block_mapping: a bad one")


def test_timing_takes_first_start_to_last_end_and_each_workers_own():
    steps = [[(0.0, 1.0), (10.0, 11.0)], [(0.5, 2.0), (10.0, 10.5)]]
    t = node._timing(steps)
    assert t["span"] == pytest.approx(1.5)  # steps span 2.0 and 1.0: median 1.5
    assert t["per_gpu"] == pytest.approx([1.0, 1.0])


@pytest.mark.parametrize("timer", [node._time_threads, node._time_one_thread])
@pytest.mark.parametrize("slow_first", [False, True])
def test_a_slow_gpu_sets_the_span_and_keeps_its_own_figure(clock, timer, slow_first):
    works = [_Slow(clock, 0.002), _Slow(clock, 0.020)]
    if slow_first:  # one thread must not charge the fast GPU for waiting on the slow one
        works.reverse()
    t = timer(works, "swap", "in", 5)
    fast, slow = (t["per_gpu"][1], t["per_gpu"][0]) if slow_first else tuple(t["per_gpu"])
    # A thread sees its own GPU's end; one thread sees each GPU done at its next poll.
    tol = 2 * POLL_S if timer is node._time_one_thread else 1e-9
    assert t["span"] == pytest.approx(0.020, abs=tol)
    assert fast == pytest.approx(0.002, abs=tol)
    assert slow == pytest.approx(0.020, abs=tol)
    assert all(w.calls == [("swap", "in")] * 5 for w in works)


def test_a_failing_thread_stops_the_others_and_its_error_comes_out(clock):
    works = [_Slow(clock, 0.001), _Broken(clock, 0.001), _Slow(clock, 0.001)]
    with pytest.raises(ValueError, match="a bad one"):
        node._time_threads(works, "swap", "in", 50)
    assert all(len(w.calls) <= 1 for w in works)  # the others stopped at the broken barrier


def test_pool_rows_are_disjoint_per_gpu_and_drawn_again_alike():
    rows = [node.pool_rows(i, 10, 3)[:2] for i in range(3)]
    everything = np.concatenate([np.concatenate(r) for r in rows])
    assert sorted(everything.tolist()) == list(range(60))
    again = node.pool_rows(1, 10, 3)
    assert np.array_equal(again[0], rows[1][0]) and np.array_equal(again[1], rows[1][1])


class _Proc:
    def __init__(self, exitcode):
        self.exitcode = exitcode


class _Queue:
    """A worker queue in virtual time: an empty get() waits out its timeout."""

    def __init__(self, clock, messages):
        self.clock, self.messages = clock, list(messages)

    def get(self, timeout):
        if self.messages:
            return self.messages.pop(0)
        self.clock.sleep(timeout)
        raise queue.Empty

    def get_nowait(self):
        if self.messages:
            return self.messages.pop(0)
        raise queue.Empty


def test_a_worker_that_dies_without_a_word_is_an_error_at_once(clock):
    q = _Queue(clock, [("ok", 0, {}, (True, ""))])
    with pytest.raises(RuntimeError, match=r"ended without reporting \(exit codes \[0, -9\]\)"):
        node._collect([_Proc(0), _Proc(-9)], q, timeout_s=60)
    assert clock.monotonic() < 10  # seconds of (virtual) waiting, not the 60 s timeout


def test_a_silent_worker_is_an_error_at_the_timeout(clock):
    q = _Queue(clock, [("ok", 0, {}, (True, ""))])
    with pytest.raises(RuntimeError, match=r"ended without reporting \(no answer in 60 s\)"):
        node._collect([_Proc(0), _Proc(None)], q, timeout_s=60)
    assert clock.monotonic() >= 60


def test_every_worker_reporting_is_collected():
    q = queue.Queue()
    for i in range(3):
        q.put(("ok", i, {}, (True, "")))
    assert [g[1] for g in node._collect([_Proc(None)] * 3, q, timeout_s=5)] == [0, 1, 2]
