"""``wait_for=`` entries on the CPU: a torch event that was never recorded
(``cuda_event == 0``: torch creates the CUDA event on its first record) is
nothing to wait for, as in torch, instead of a wait on handle 0 that CUDA
refuses; a recorded one is waited on."""

import numpy as np
import pytest

from cupy_swap.core.layout import layout_from_parts
from cupy_swap.core.parts import as_parts
from cupy_swap.cuda.streams import NO_WAIT, Wait, wait_handle
from cupy_swap.prepared import PreparedSwap

from .fakes import FakeSwapper

pytest.importorskip("cupy", reason="wait_handle tells CuPy events apart")


class _TorchEvent:
    """Stands in for ``torch.cuda.Event``: ``cuda_event`` is 0 until recorded."""

    def __init__(self, cuda_event: int):
        self.cuda_event = cuda_event


def test_unrecorded_torch_event_is_no_wait():
    assert wait_handle(_TorchEvent(0), 0, 0) is NO_WAIT
    assert NO_WAIT.event_ptr == 0


def test_recorded_torch_event_is_waited_on():
    assert wait_handle(_TorchEvent(0xBEEF), 0, 0) == Wait(0xBEEF, None)


def _op(calls: list, fake_gpu) -> PreparedSwap:
    host = np.zeros((8, 64), np.uint8)
    gpu = fake_gpu.parts(np.zeros((8, 64), np.uint8), "dst")
    layout = layout_from_parts(as_parts(host, "src"), gpu)
    return PreparedSwap(FakeSwapper(calls), layout, (host,))


@pytest.mark.parametrize(
    "wait_for, waited",
    [
        (_TorchEvent(0), []),
        ([_TorchEvent(0)], []),
        ([_TorchEvent(0), _TorchEvent(0xBEEF), _TorchEvent(0)], [0xBEEF]),
    ],
    ids=["unrecorded", "unrecorded-in-a-list", "mixed"],
)
def test_swap_skips_unrecorded_torch_events(wait_for, waited, fake_gpu):
    calls: list = []
    event = _op(calls, fake_gpu)([], wait_for=wait_for)
    # Each wait on the swap's stream (77), then the swap's event recorded on it.
    assert calls == [("wait", 77, ptr) for ptr in waited] + [("record", 0xE0, 77)]
    assert event.path == "none"


def test_stream_waits_reuse_one_event_per_thread_and_each_is_enqueued_before_the_next_record(
    fake_gpu, monkeypatch
):
    """Issue 49, finding 6: creating an event waits behind a release's
    device-wide wait (NOTES 77), so a call must not create one per stream in
    ``wait_for``.  One event per thread is recorded on each stream in turn,
    and each stream's wait is enqueued before the next record."""
    import threading

    import cupy

    from cupy_swap.cuda import capture, streams

    created: list = []
    monkeypatch.setattr(
        capture, "new_event", lambda timing=False: created.append(object()) or _Made(len(created))
    )
    order: list = []
    monkeypatch.setattr(
        cupy.cuda.runtime, "eventRecord", lambda ev, stream: order.append(("record", ev, stream))
    )
    monkeypatch.setattr(streams, "stream_device", lambda item: 0)
    monkeypatch.setattr(streams, "on_device", lambda device: _Nothing())
    monkeypatch.setattr(streams, "_wait_events", threading.local())
    calls: list = []
    op = _op(calls, fake_gpu)
    monkeypatch.setattr(
        op._swapper, "_wait_event", lambda stream, ev, flags: order.append(("wait", ev, stream))
    )
    for _ in range(3):
        op([], wait_for=[0x51, 0x52])  # two raw stream handles of the swapper's GPU
    assert len(created) == 1  # made once, recorded again each time
    assert order[:4] == [("record", 1, 0x51), ("wait", 1, 77), ("record", 1, 0x52), ("wait", 1, 77)]
    done: list = []
    t = threading.Thread(target=lambda: done.append(op([], wait_for=[0x51])))
    t.start()
    t.join()
    assert done and len(created) == 2  # another thread: its own event


class _Made:
    def __init__(self, ptr):
        self.ptr = ptr


class _Nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
