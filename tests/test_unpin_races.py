"""A registration that changes while a call resolves or launches (review of
issue 49's fix): an op keeps the alias generation read *before* its layout
resolved, the one-screen call looks at it again once it holds a slot, and an
unpin waits for the slots calls hold, so no launch over the old aliases is
queued after the unpin's GPU wait."""

from __future__ import annotations

import numpy as np
import pytest

import cupy_swap.prepared as prepared
from cupy_swap.core.layout import layout_from_parts
from cupy_swap.core.parts import as_parts
from cupy_swap.cuda import memory, resolve, slots
from cupy_swap.prepared import PreparedSwap

from .fakes import FakeSwapper, fake_ring, land

pytest.importorskip("cupy", reason="the prepared call's wait handling imports CuPy")


def test_a_layout_keeps_the_generation_read_before_its_addresses(fake_gpu, monkeypatch):
    layout = layout_from_parts(
        fake_gpu.parts(np.zeros((4, 64), np.uint8), "src"), fake_gpu.parts(np.zeros((4, 64), np.uint8), "dst")
    )
    real = resolve._resolve_part

    def changed_meanwhile(*args):  # another thread unregisters while this one resolves
        memory._generation[0] += 1
        return real(*args)

    monkeypatch.setattr(resolve, "_resolve_part", changed_meanwhile)
    before = memory.generation()
    resolve.resolve_layout(layout, 0)
    assert layout.generation == before != memory.generation()  # an op made from it resolves again


def test_a_call_that_took_a_slot_after_a_registration_changed_launches_nothing(fake_gpu, monkeypatch):
    monkeypatch.setattr(prepared, "stream_is_capturing", lambda handle: False)
    calls: list = []
    host = np.zeros((64, 64), np.uint8)
    layout = layout_from_parts(as_parts(host, "src"), fake_gpu.parts(np.zeros((64, 64), np.uint8), "dst"))
    sw = FakeSwapper(calls)
    op = PreparedSwap(sw, layout, (host,))
    ring = sw._launcher.slots
    take = ring.take

    def take_then_unpinned(*args):  # the drop lands between the call's look and its slot
        i = take(*args)
        memory._generation[0] += 1
        return i

    monkeypatch.setattr(ring, "take", take_then_unpinned)
    refused = ValueError("src: expected pinned host memory, got memory whose pin handle was dropped")

    def resolve_again(*arrays):
        raise refused

    sw._layout = resolve_again
    rows = np.column_stack([np.arange(20), np.arange(20) + 30]).astype(np.int64)
    assert op._decided.fast_rows[0] < 20 < op._decided.fast_rows[1]  # the one-screen call's rows
    with pytest.raises(ValueError, match="pin handle was dropped"):
        op(rows)
    assert not [c for c in calls if c[0] == "launch"]
    assert ring.busy() == 0  # the slot went back


def test_an_unpin_waits_for_the_slots_calls_hold(monkeypatch):
    ring = fake_ring(4)
    i = ring.take()  # a call between its look and its launch
    looks: list = []

    def sleep(seconds):  # the unpin's poll: the call launches on the third look
        looks.append(seconds)
        if len(looks) == 3:
            ring.pending[i] = 7

    monkeypatch.setattr(slots.time, "sleep", sleep)
    assert slots.wait_for_taken_slots in memory.before_unpin
    slots.wait_for_taken_slots()
    assert len(looks) == 3 and ring.pending[i] == 7
    land(ring, 7)  # its kernel done: the dropped ring's release has nothing to wait for


def test_an_unpin_fails_rather_than_passing_a_slot_held_past_the_limit(monkeypatch):
    """Review finding: past its limit the wait gave up silently and the
    unpin went on under a call that could still launch over the memory.
    It fails now, and a failed unpin keeps the memory pinned."""
    ring = fake_ring(4)
    i = ring.take()  # a call that never launches nor gives its slot back (within the limit)
    monkeypatch.setattr(slots, "_TAKEN_WAIT_S", 0.0)
    try:
        with pytest.raises(RuntimeError, match="held a ring slot for more than 0 s .* stays pinned"):
            slots.wait_for_taken_slots()
    finally:
        ring.give_back(i)
