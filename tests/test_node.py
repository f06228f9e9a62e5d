"""bench --gpus's timing harness on the CPU (tools/node.py), with stand-in
workers whose steps take known times: the span runs from the first start to
the last end, each GPU's figure from its own start to its own end."""

import time

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


def test_timing_takes_first_start_to_last_end_and_each_workers_own():
    steps = [[(0.0, 1.0), (10.0, 11.0)], [(0.5, 2.0), (10.0, 10.5)]]
    t = node._timing(steps)
    assert t["span"] == pytest.approx(1.5)  # steps span 2.0 and 1.0: median 1.5
    assert t["per_gpu"] == pytest.approx([1.0, 1.0])


@pytest.mark.parametrize("timer", [node._time_threads, node._time_one_thread])
def test_a_slow_gpu_sets_the_span_and_keeps_its_own_figure(timer):
    works = [_Slow(0.002), _Slow(0.010)]
    t = timer(works, "swap", "in", 5)
    assert 0.009 < t["span"] < 0.05
    assert t["per_gpu"][0] < t["per_gpu"][1]
    assert all(w.calls == [("swap", "in")] * 5 for w in works)
