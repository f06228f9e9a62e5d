"""Issue 49 ("Trust 4") on the GPU: a dropped ``pin_array`` handle makes
the next call raise instead of faulting the GPU; background pinning keeps
what the caller wrote meanwhile; a call queued behind a held producer
returns while the producer still holds its stream, whatever ``wait_for``
is, with earlier swaps' arrays dropped just before (their release runs on
the releaser thread while the producer holds the GPU).

The producer is a :class:`Gate` (held until the host opens it), so "the call
returned before the producer finished" is a fact read off the gate, never a
time window."""

from __future__ import annotations

import gc
import mmap
import sys
import threading
import time
import traceback

import numpy as np
import pytest

from .gpu_helpers import Gate, require_gpu

cp = require_gpu()

import cupy_swap as cs  # noqa: E402
from cupy_swap.cuda import release  # noqa: E402

BLOCK = (16, 8, 128)  # 32 KiB of fp16


def _page_aligned(shape, dtype=np.float16):
    n = int(np.prod(shape)) * np.dtype(dtype).itemsize
    return np.frombuffer(mmap.mmap(-1, n), dtype).reshape(shape)


@pytest.mark.parametrize("how", ["prepared", "swap"])
def test_a_dropped_pin_array_handle_raises_at_the_next_call_never_launches(how):
    host = _page_aligned((64, *BLOCK))
    host[:] = np.random.default_rng(1).standard_normal(host.shape).astype(np.float16)
    gpu = cp.zeros((64, *BLOCK), cp.float16)
    sw = cs.BlockSwapper(max_blocks=64)
    h = cs.pin_array(host, chunk_bytes="1M")  # several chunks
    call = sw.prepare(host, gpu) if how == "prepared" else (lambda rows: sw.swap(host, gpu, rows))
    call([[3, 0], [40, 1]]).synchronize()
    assert np.array_equal(cp.asnumpy(gpu[:2]).view(np.uint16), host[[3, 40]].view(np.uint16))
    del h  # the caller's mistake: the handle was the pin
    # Retired and not yet unpinned, or already unpinned by the releaser (under load it can be quick):
    # either way a clear error, never a launch (the CPU test holds the retired window open).
    refused = (
        r"src: expected (pinned host memory, .*pin handle was dropped|page-locked \(pinned\) host memory)"
    )
    for _ in range(2):  # every call after the drop, not only the first
        with pytest.raises(ValueError, match=refused):
            call([[5, 2]])
    assert release.drain(timeout=60)
    with pytest.raises(ValueError, match="src: expected page-locked"):  # unpinned now: plainly pageable
        call([[5, 2]])
    cp.cuda.Device().synchronize()  # the context is alive: no launch went over the old alias
    h = cs.pin_array(host)  # noqa: F841 - the handle keeps it pinned
    call([[5, 2]]).synchronize()
    assert np.array_equal(cp.asnumpy(gpu[2]).view(np.uint16), host[5].view(np.uint16))


def test_background_pinning_keeps_the_rows_the_caller_wrote_meanwhile():
    go, paused = threading.Event(), threading.Event()

    def hold_after_first(p):  # the registering thread waits here after chunk 0
        if p.chunks_done == 1:
            paused.set()
            assert go.wait(timeout=120)

    h = cs.pin_pool((4096, *BLOCK), np.float16, chunk_bytes="32M", background=True, progress=hold_after_first)
    want = np.random.default_rng(2).standard_normal((4096, *BLOCK)).astype(np.float16)
    try:
        assert paused.wait(timeout=120) and h.usable_rows == 1024
        h.array[:] = want  # loading the cache from disk while the rest pins
    finally:
        go.set()
    assert h.wait(timeout=300) is True
    assert np.array_equal(h.array.view(np.uint16), want.view(np.uint16))
    sw = cs.BlockSwapper(max_blocks=16)
    gpu = cp.zeros((16, *BLOCK), cp.float16)
    rows = np.array([0, 1023, 1024, 2047, 4095])
    sw.swap(h.array, gpu, np.stack([rows, np.arange(5)], 1)).synchronize()
    assert np.array_equal(cp.asnumpy(gpu[:5]).view(np.uint16), want[rows].view(np.uint16))


def _torch():
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


WAITS = ["stream", "cupy event", "torch event"]


class _Waits:
    """One ``wait_for`` of each kind on ``producer``, its events made once
    (a creation may wait behind a release: NOTES 77) and recorded by
    :meth:`after` once the producer's work is queued."""

    def __init__(self, kind, producer):
        self.kind, self.producer = kind, producer
        if kind == "cupy event":
            self.event = cp.cuda.Event(disable_timing=True)
        elif kind == "torch event":
            torch = _torch()
            if torch is None:
                pytest.skip("needs PyTorch with CUDA")
            self.event = torch.cuda.Event()
            self.torch_stream = torch.cuda.ExternalStream(producer.ptr)

    def after(self):
        if self.kind == "stream":
            return self.producer
        if self.kind == "cupy event":
            self.event.record(self.producer)
        else:
            self.event.record(self.torch_stream)
        return self.event


def _stack_of(thread_id: int) -> str:
    frame = sys._current_frames().get(thread_id)
    return "".join(traceback.format_stack(frame)[-6:]) if frame is not None else "(gone)"


@pytest.mark.parametrize("direction", ["in", "out"])
@pytest.mark.parametrize("kind", WAITS)
def test_a_call_never_waits_on_the_host_for_a_producer_it_only_orders_after(kind, direction):
    """Finding 6: a call given ``wait_for=`` a held producer returned only
    after the producer finished, depending on what ran before.  The cause
    (NOTES 77): while a release of pinned memory waits for the GPU
    (``cudaFreeHost``, ``cudaHostUnregister``: device-wide), creating an
    event anywhere and recording one on a stream it waits for both wait
    too; the call used to create an event per stream in ``wait_for``, and a
    swap event when the caller held the last one.  Each round swaps and
    drops arrays (their releases done), then holds the producer and calls:
    the call itself must neither create an event nor wait; 20 rounds."""
    sw = cs.BlockSwapper(max_blocks=64)
    host, gpu = cs.zeros_pinned((64, *BLOCK), np.float16), cp.zeros((64, *BLOCK), cp.float16)
    op = sw.prepare(host, gpu) if direction == "in" else sw.prepare(gpu, host)
    producer, copier = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    waits = _Waits(kind, producer)
    rows = np.array([[1, 2], [3, 4], [5, 6]])
    op(rows, stream=copier).synchronize()
    main = threading.get_ident()
    flag = cs.zeros_pinned(1, np.int32)  # one gate flag for every round: no release of it meanwhile
    for round_ in range(20):
        dropped_host = cs.zeros_pinned((8, *BLOCK), np.float16)
        dropped_gpu = cp.zeros((8, *BLOCK), cp.float16)
        sw.swap(dropped_host, dropped_gpu, [[0, 1]], stream=copier)  # a cached op over them, too
        del dropped_host, dropped_gpu
        gc.collect()
        assert release.drain(timeout=60)  # released: a release's device-wide wait would hold records
        t = [time.perf_counter()]
        gate = Gate(producer, limit_s=10, flag=flag)
        t.append(time.perf_counter())
        wait = waits.after()
        t.append(time.perf_counter())
        seen: list = []
        timer = threading.Timer(1.0, lambda seen=seen: seen.append(_stack_of(main)))
        timer.start()
        try:
            ev = op(rows, stream=copier, wait_for=wait)
            t.append(time.perf_counter())
            held = gate.closed
        finally:
            timer.cancel()
            gate.open()
        ev.synchronize()
        assert held, (
            f"round {round_}: the call returned only after the producer finished (ms from the gate's "
            f"start: {[round((x - t[0]) * 1e3, 1) for x in t[1:]]}: gate made, waits, call); "
            f"after 1 s it was at:\n{seen[0] if seen else '(not sampled)'}"
        )
    assert release.drain(timeout=60)
