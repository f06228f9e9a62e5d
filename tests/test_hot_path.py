"""A prepared op's call on the CPU, with CUDA stood in by tests/fakes.py:
what it checks where, the order of waits and the capture query, the status
record it passes the launch, how later calls and events raise a failed
check, and a rebind under a thread that is inside a call."""

import numpy as np
import pytest

import cupy_swap.prepared as prepared
from cupy_swap.core.layout import layout_from_parts
from cupy_swap.core.parts import as_parts
from cupy_swap.cuda.gpu_mapping import DeviceRows
from cupy_swap.cuda.slots import SlotRing
from cupy_swap.prepared import PreparedSwap

from .fakes import FakeSwapper, land

pytest.importorskip("cupy", reason="wait_handle tells CuPy events apart")


def _op(calls: list, fake_gpu, blocks: int = 8, **kw) -> PreparedSwap:
    host = np.zeros((blocks, 64), np.uint8)
    gpu = fake_gpu.parts(np.zeros((blocks, 64), np.uint8), "dst")
    layout = layout_from_parts(as_parts(host, "src"), gpu)
    return PreparedSwap(FakeSwapper(calls, **kw), layout, (host,))


def _sync(event) -> None:
    """What ``SwapEvent.synchronize()`` does once the swap completed."""
    if event.check is not None:
        event.check.raise_on_event(event)


def _ring(op):
    return op._swapper._launcher.slots


@pytest.fixture
def not_capturing(monkeypatch):
    monkeypatch.setattr(prepared, "stream_is_capturing", lambda handle: False)


def test_the_launch_checks_the_rows_and_gets_a_status_record(fake_gpu, not_capturing):
    calls: list = []
    op = _op(calls, fake_gpu)
    # A repeated destination: the launch finds it, the host does not look.
    event = op([(1, 2), (3, 2)], check="launch")
    assert calls == [("kernel", [1, 2, 3, 2], 77, False, _ring(op).status_at[0], 1), ("record", 0xE0, 77)]
    assert event.seq == 1 and isinstance(event.check, SlotRing) and event.slot == 0
    with pytest.raises(ValueError, match="swap #1: .*block 2 again in row 1"):
        _sync(event)  # the launch found it
    calls.clear()
    op((np.array([5, 6]), np.array([0, 1])), check="launch")  # two 1-D index arrays, as SGLang keeps them
    assert calls[0][:2] == ("kernel", [5, 0, 6, 1])


def test_check_host_raises_before_anything_is_launched(fake_gpu, not_capturing):
    calls: list = []
    op = _op(calls, fake_gpu)
    with pytest.raises(ValueError, match="distinct destination blocks, got block 2 twice"):
        op([(1, 2), (3, 2)], check="host")
    with pytest.raises(IndexError, match="source block index 9 in row 0"):
        op([(9, 0)], check="host")
    with pytest.raises(ValueError, match="check: expected None, 'launch' or 'host', got 'gpu'"):
        op([(1, 2)], check="gpu")
    assert calls == []
    op([(1, 2), (3, 4)], check="host")
    assert calls[0] == ("kernel", [1, 2, 3, 4], 77, False, 0, 0)  # checked: no status record
    calls.clear()
    op([(1, 2), (3, 2)])  # the default at every row count: the launch checks
    assert calls[0][:2] == ("kernel", [1, 2, 3, 2]) and calls[0][4] in _ring(op).status_at


def test_a_tuple_of_two_sequences_is_the_pair_form(fake_gpu, not_capturing):
    """Issue 38: ``([5, 9], [0, 1])`` once copied 5 -> 9 and 0 -> 1 (read as
    two rows); a 2-tuple of 1-D sequences of any type is (src, dst)."""
    calls: list = []
    op = _op(calls, fake_gpu)
    for form in (([5, 6], [0, 1]), ((5, 6), (0, 1)), (np.array([5, 6]), [0, 1])):
        calls.clear()
        op(form)
        assert calls[0][:2] == ("kernel", [5, 0, 6, 1]), form
    with pytest.raises(ValueError, match="2-tuple is .src_indices, dst_indices.; expected 1-D destination"):
        op(([5, 6], [[0, 1]]))
    with pytest.raises(ValueError, match="source and destination indices of one length"):
        op(([5, 6, 7], [0, 1]))


def test_a_failed_launch_check_is_raised_by_the_next_call_once(fake_gpu, not_capturing):
    calls: list = []
    op = _op(calls, fake_gpu)
    op._swapper.kernel.held = True
    bad = op([(1, 2), (3, 2)], check="launch")
    good = op([(1, 2), (3, 4)], check="launch")
    land(_ring(op), 1, 3, 1, 2)  # what the launch wrote: block 2 again in row 1
    land(_ring(op), 2)
    with pytest.raises(ValueError, match=r"earlier swap \(swap #1.*got block 2 again in row 1.*not launched"):
        op([(1, 2)])
    op([(1, 2)])  # raised once: the next call goes ahead
    with pytest.raises(ValueError, match="swap #1: .*block 2 again in row 1"):
        _sync(bad)  # the event of the failed swap raises every time it is asked
    _sync(good)  # the good one never


def test_a_check_not_yet_run_is_left_for_later(fake_gpu, not_capturing):
    calls: list = []
    op = _op(calls, fake_gpu)
    op._swapper.kernel.held = True
    op([(1, 2), (0, 0)], check="launch")
    op([(1, 3), (0, 0)], check="launch")  # the first launch has not written its record yet: nothing to say
    land(_ring(op), 2, 2, 0, 30)  # the second ran first (another stream): its failure is not held up
    with pytest.raises(IndexError, match="swap #2.*destination block index 30 in row 0"):
        op([(1, 4), (0, 0)], check="launch")


def test_a_capture_joined_through_wait_for_is_seen_as_a_capture(fake_gpu, monkeypatch):
    """Defect 1: the capture query once came before the waits, so a swap
    whose stream joined a capture through ``wait_for`` was launched as an
    eager one (a graph launch inside the capture, a ring slot gated by a
    captured event)."""
    calls: list = []
    monkeypatch.setattr(prepared, "stream_is_capturing", lambda handle: any(c[0] == "wait" for c in calls))
    op = _op(calls, fake_gpu)

    class CapturingEvent:  # a torch event recorded on a capturing stream
        cuda_event = 0xBEEF

    op([(1, 2), (3, 4)], wait_for=CapturingEvent(), check="launch")
    assert calls[0] == ("wait", 77, 0xBEEF)
    assert calls[1] == ("kernel", [1, 2, 3, 4], 77, True, 0, 0)  # captured: launched plainly, host-checked
    calls.clear()
    with pytest.raises(ValueError, match="distinct destination blocks"):  # a capture keeps its rows
        op([(1, 2), (3, 2)], wait_for=CapturingEvent(), check="launch")
    assert not any(c[0] == "kernel" for c in calls)


def test_a_rebind_under_a_thread_inside_a_call(fake_gpu, not_capturing, monkeypatch):
    """Defect 5: registering pinned memory while another thread was inside
    a call set the op's check state to None under it (AttributeError), and
    a pending failure was lost.  Now a rebind replaces the decided state as
    a whole; a call keeps the state it read, and verdicts stay on the op."""
    calls: list = []
    op = _op(calls, fake_gpu)
    op._swapper.kernel.held = True
    op([(1, 2), (0, 0)], check="launch")  # seq 1, unread
    old = op._decided
    swapper = op._swapper
    swapper._layout = lambda *held: old.layout

    real_launch = old.kernel.launch_slot

    def rebind_midway(i, stream):  # another thread's register_host() lands inside this call
        op._rebind()
        rows = swapper._launcher.slots.rows[i][:2].reshape(-1).tolist()
        calls.append(("kernel-old-state", rows))
        real_launch(i, stream)

    old.kernel.launch_slot = rebind_midway
    op([(5, 6), (0, 0)], check="launch")
    assert ("kernel-old-state", [5, 6, 0, 0]) in calls and op._decided is not old
    land(_ring(op), 1, 1, 0, 9)
    with pytest.raises(IndexError, match="source block index 9"):  # the pending failure survived
        op([(1, 2)])


def test_a_mapping_on_the_gpu_needs_a_status_record(fake_gpu, not_capturing, monkeypatch):
    """Defect 6: where the status records cannot be mapped (address 0) the
    launch cannot report, so a mapping on the GPU is refused and host rows
    are checked on the host."""
    monkeypatch.setattr(
        prepared, "device_rows", lambda m, device, max_blocks: DeviceRows(0x10, 0x18, 2, 3, m)
    )
    calls: list = []
    op = _op(calls, fake_gpu)
    op(object())
    assert calls[0] == ("rows", 3, 77, False, _ring(op).status_at[0], 1)
    unmapped = _op([], fake_gpu, mapped=False)
    with pytest.raises(ValueError, match="cannot be mapped"):
        unmapped(object())
    monkeypatch.setattr(prepared, "device_rows", lambda m, device, max_blocks: None)
    with pytest.raises(ValueError, match="distinct destination blocks"):
        unmapped([(1, 2), (3, 2)])


def test_one_copy_goes_to_the_copy_engines_and_is_checked_on_the_host(fake_gpu, not_capturing):
    calls: list = []
    op = _op(calls, fake_gpu)
    op([(1, 2)])
    assert calls[0] == ("dma", 77)  # one copy (dma_max_copies=1): the copy engines start sooner
    with pytest.raises(IndexError, match="source block index 8 in row 0"):
        op([(8, 2)])
    assert op([(1, 2)], mode="kernel") and calls[-2][0] == "kernel"  # asked for: the kernel


def test_mode_and_check_fixed_at_prepare_hold_for_every_call(fake_gpu, not_capturing, monkeypatch):
    """Issue 50, item 2: ``prepare(src, dst, mode=..., check=...)`` decides
    the route and the check once; a call's own ``mode=``/``check=`` still
    overrides them for that call."""
    calls: list = []
    host = np.zeros((8, 64), np.uint8)
    layout = layout_from_parts(as_parts(host, "src"), fake_gpu.parts(np.zeros((8, 64), np.uint8), "dst"))

    def op(**kw):
        return PreparedSwap(FakeSwapper(calls), layout, (host,), **kw)

    kernel = op(mode="kernel")  # one copy: auto would take the copy engines
    kernel([(1, 2)])
    assert calls[0][0] == "kernel" and kernel._decided.fast_rows[0] == 0
    calls.clear()
    assert kernel([(1, 2)], mode="dma").path == "dma" and calls[0] == ("dma", 77)
    dma = op(mode="dma")
    assert dma.route == "dma"
    calls.clear()
    assert dma([(1, 2), (3, 4)]).path == "dma" and calls[0][0] == "dma"
    host_checked = op(mode="kernel", check="host")
    assert host_checked._decided.fast_rows == (0, 0, 0)  # the one-screen call never serves it
    calls.clear()
    with pytest.raises(ValueError, match="distinct destination blocks, got block 2 twice"):
        host_checked([(1, 2), (3, 2)])  # raised on the host, nothing launched
    assert calls == []
    host_checked([(1, 2), (3, 4)])
    assert calls[0] == ("kernel", [1, 2, 3, 4], 77, False, 0, 0)  # checked: no status record
    calls.clear()
    event = host_checked([(1, 2), (3, 2)], check="launch")  # the call's own: the launch checks
    assert calls[0][:2] == ("kernel", [1, 2, 3, 2]) and calls[0][4] in _ring(host_checked).status_at
    with pytest.raises(ValueError, match="block 2 again in row 1"):
        _sync(event)  # the launch found it
    _gpu_rows(monkeypatch)
    with pytest.raises(ValueError, match="check: 'host' needs the rows on the host"):
        host_checked(object())
    with pytest.raises(ValueError, match="mode: a mapping on the GPU"):
        dma(object())


def _gpu_rows(monkeypatch, n=3):
    monkeypatch.setattr(
        prepared, "device_rows", lambda m, device, max_blocks: DeviceRows(0x10, 0x18, 2, n, m)
    )


def test_a_mapping_on_the_gpu_takes_the_kernel_whatever_the_route(fake_gpu, not_capturing, monkeypatch):
    """Review finding: a layout routed to the copy engines (blocks of 2 MiB
    and more, or mode="dma") sent rows on the GPU to a path that reads rows
    on the host (AttributeError on None)."""
    _gpu_rows(monkeypatch)
    calls: list = []
    host = np.zeros((8, 2 << 20), np.uint8)
    gpu = fake_gpu.parts(np.zeros((8, 2 << 20), np.uint8), "dst")
    op = PreparedSwap(FakeSwapper(calls), layout_from_parts(as_parts(host, "src"), gpu), (host,))
    assert op.route == "dma"
    rows = object()
    event = op(rows)
    assert (
        calls[0][0] == "rows" and _ring(op)._kept[event.slot] is rows
    )  # the kernel; the rows held by its slot
    with pytest.raises(ValueError, match="check: 'host' needs the rows on the host"):
        op(rows, check="host")


def test_refusals_enqueue_no_wait(fake_gpu, monkeypatch):
    """Review finding: a bad host mapping raised after its wait_for waits
    were enqueued (a stream joined to a capture stayed joined)."""
    monkeypatch.setattr(prepared, "stream_is_capturing", lambda handle: False)
    calls: list = []
    op = _op(calls, fake_gpu)

    class Recorded:
        cuda_event = 0xBEEF

    with pytest.raises(ValueError, match="distinct destination blocks"):
        op([(1, 2), (3, 2)], wait_for=Recorded(), check="host")
    _gpu_rows(monkeypatch)
    with pytest.raises(ValueError, match="mode: a mapping on the GPU"):
        op(object(), wait_for=Recorded(), mode="dma")
    assert calls == []


def test_the_swapper_mode_holds_for_one_copy(fake_gpu, not_capturing):
    """Review finding: BlockSwapper(mode="kernel") sent one-copy swaps to the
    copy engines; only "auto" takes that shortcut."""
    calls: list = []
    host = np.zeros((8, 64), np.uint8)
    gpu = fake_gpu.parts(np.zeros((8, 64), np.uint8), "dst")
    swapper = FakeSwapper(calls)
    swapper.mode = "kernel"
    op = PreparedSwap(swapper, layout_from_parts(as_parts(host, "src"), gpu), (host,))
    op([(1, 2)])
    assert calls[0][0] == "kernel"


def test_auto_sends_one_long_run_to_the_copy_engines(fake_gpu, not_capturing):
    """Issue 34, item 6: a kernel layout's call whose rows are one run in
    both columns (their ends say so), long enough that a part's run reaches
    ``dma_min_copy_bytes``, takes the copy engines; shorter runs, scattered
    rows and an explicit mode keep the kernel."""
    from cupy_swap.core.route import Policy

    calls: list = []
    sw = FakeSwapper(calls)
    sw.policy = Policy(dma_min_copy_bytes=4 * 64, staging_bytes=0)  # runs of 4 blocks of 64 bytes
    host = np.zeros((8, 64), np.uint8)
    layout = layout_from_parts(as_parts(host, "src"), fake_gpu.parts(np.zeros((8, 64), np.uint8), "dst"))
    op = PreparedSwap(sw, layout, (host,))
    assert op.route == "kernel"
    for rows, path in (
        ([(2, 3), (3, 4), (4, 5), (5, 6)], "dma"),  # one run of 4 each side
        ([(2, 3), (3, 4), (4, 5)], "kernel"),  # 3 blocks: short of a full-speed copy
        ([(2, 6), (3, 4), (4, 5), (5, 3)], "kernel"),  # host run, GPU scattered: staging is off
        ([(5, 3), (1, 4), (7, 5), (0, 6)], "kernel"),
        # Issue 38: ends that span 4 blocks on both sides but no single run would
        # be copied block by block; the kernel is faster (and checks the rows).
        ([(2, 3), (4, 5), (3, 4), (5, 6)], "kernel"),
    ):
        assert op(np.array(rows, np.int64)).path == path
    lying = op(np.array([(2, 3), (3, 3), (4, 5), (5, 6)], np.int64))  # the kernel checks it
    assert lying.path == "kernel"
    with pytest.raises(ValueError, match="block 3 again in row 1"):
        _sync(lying)
    assert op(np.array([(2, 3), (3, 4), (4, 5), (5, 6)], np.int64), mode="kernel").path == "kernel"
    with pytest.raises(ValueError, match="distinct destination blocks"):  # the copy engines' host check
        op(np.array([(2, 3), (3, 3), (4, 5), (5, 6)], np.int64), mode="dma")


def test_a_swap_captured_by_a_call_keeps_its_pools_pinned(fake_gpu, monkeypatch):
    """Review finding: a swap captured by ``swap()`` or an op on a capturing
    stream kept its row words but not the pools of its host memory, so
    dropping a ``pin_array`` handle unpinned memory a replay reads.  The
    call now keeps the pools' owners for the process, and refuses a pool
    whose handle was dropped before anything is captured."""
    from cupy_swap.cuda import release

    monkeypatch.setattr(prepared, "stream_is_capturing", lambda handle: True)
    kept: list = []
    monkeypatch.setattr(release, "keep_for_process", kept.append)
    monkeypatch.setattr(prepared.pools, "owners", lambda layout: ["the pool's owner"])
    calls: list = []
    op = _op(calls, fake_gpu)
    op([(1, 2), (3, 4)], mode="kernel")
    assert calls[0][:4] == ("kernel", [1, 2, 3, 4], 77, True) and ["the pool's owner"] in kept

    def retired(layout):
        raise ValueError("src: ... whose pin handle was dropped")

    monkeypatch.setattr(prepared.pools, "owners", retired)
    calls.clear()
    with pytest.raises(ValueError, match="pin handle was dropped"):
        op([(1, 2), (3, 4)], mode="kernel")
    assert [c for c in calls if c[0] == "kernel"] == []  # nothing captured


def test_prepare_refuses_a_bad_mode_or_check_before_looking_at_anything():
    """``prepare(mode=, check=)`` names the argument, what it expected and
    what came, before it resolves the arrays."""
    from cupy_swap.swapper import BlockSwapper

    with pytest.raises(ValueError, match="mode: expected one of 'auto', .*got 'fast'"):
        BlockSwapper.prepare(object(), None, None, mode="fast")
    with pytest.raises(ValueError, match="check: expected None, 'launch' or 'host', got 'gpu'"):
        BlockSwapper.prepare(object(), None, None, check="gpu")


def test_a_calls_own_timing_holds_when_it_also_passes_a_mode(fake_gpu, not_capturing):
    """Review of session 56: on a swapper made with ``timing=True`` a call
    with ``mode=`` and ``timing=False`` ran timed (the op prepared with its
    mode was called without it)."""
    calls: list = []
    op = _op(calls, fake_gpu)
    sw = op._swapper
    sw.timing = True
    asked: list = []
    take = sw._events.take
    sw._events.take = lambda path, nbytes, timed=False: asked.append(timed) or take(path, nbytes, timed)
    op([(1, 2)], mode="kernel", timing=False)
    op([(1, 2)], check="launch", timing=False)
    assert asked == [False, False]


def test_an_empty_swap_on_a_capturing_stream_takes_no_pool_event(fake_gpu, monkeypatch):
    """Review of session 56: an empty mapping on a capturing stream recorded
    a pool event into the capture, and a release waits for every pool
    event, which would break that capture: an empty swap gets an event of
    its own, whatever its stream (it moves nothing a release waits for)."""
    monkeypatch.setattr(prepared, "stream_is_capturing", lambda handle: True)
    calls: list = []
    op = _op(calls, fake_gpu)
    sw = op._swapper
    used: list = []
    take, untracked = sw._events.take, sw._events.untracked
    sw._events.take = lambda *a, **k: used.append("pool") or take(*a, **k)
    sw._events.untracked = lambda *a, **k: used.append("own") or untracked(*a, **k)
    event = op([])
    assert event.path == "none" and used == ["own"]
