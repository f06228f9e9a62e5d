"""bench --gpus's timing harness on the CPU (tools/node.py), with stand-in
workers whose steps take known times: the span runs from the first start to
the last end, each GPU's figure from its own start to its own end."""

import time

import numpy as np
import pytest

from cupy_swap.tools import node


class _Slow:
    """A stand-in GPU whose step takes ``seconds`` (issue returns at once,
    sync waits out the rest)."""

    def __init__(self, seconds):
        self.seconds, self.started, self.calls = seconds, None, []

    def swap(self, direction):
        self.calls.append(("swap", direction))
        self.started = time.perf_counter()

    memcpy = swap

    def sync(self):
        left = self.seconds - (time.perf_counter() - self.started)
        if left > 0:
            time.sleep(left)

    def done(self):
        return time.perf_counter() - self.started >= self.seconds


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
def test_a_slow_gpu_sets_the_span_and_keeps_its_own_figure(timer, slow_first):
    works = [_Slow(0.002), _Slow(0.020)]
    if slow_first:  # one thread must not charge the fast GPU for waiting on the slow one
        works.reverse()
    t = timer(works, "swap", "in", 5)
    fast, slow = (t["per_gpu"][1], t["per_gpu"][0]) if slow_first else tuple(t["per_gpu"])
    assert 0.019 < t["span"] < 0.1
    assert fast < 0.012 < slow
    assert all(w.calls == [("swap", "in")] * 5 for w in works)


def test_a_failing_thread_stops_the_others_and_its_error_comes_out():
    works = [_Slow(0.001), _Broken(0.001), _Slow(0.001)]
    with pytest.raises(ValueError, match="a bad one"):
        node._time_threads(works, "swap", "in", 50)


def test_pool_rows_are_disjoint_per_gpu_and_drawn_again_alike():
    rows = [node.pool_rows(i, 10, 3)[:2] for i in range(3)]
    everything = np.concatenate([np.concatenate(r) for r in rows])
    assert sorted(everything.tolist()) == list(range(60))
    again = node.pool_rows(1, 10, 3)
    assert np.array_equal(again[0], rows[1][0]) and np.array_equal(again[1], rows[1][1])


class _Proc:
    def __init__(self, exitcode):
        self.exitcode = exitcode


def test_a_worker_that_dies_without_a_word_is_an_error_at_once():
    import queue

    q = queue.Queue()
    q.put(("ok", 0, {}, (True, "")))
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=r"ended without reporting \(exit codes \[0, -9\]\)"):
        node._collect([_Proc(0), _Proc(-9)], q, timeout_s=60)
    assert time.monotonic() - t0 < 10


def test_every_worker_reporting_is_collected():
    import queue

    q = queue.Queue()
    for i in range(3):
        q.put(("ok", i, {}, (True, "")))
    assert [g[1] for g in node._collect([_Proc(None)] * 3, q, timeout_s=5)] == [0, 1, 2]
