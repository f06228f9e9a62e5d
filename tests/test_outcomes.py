"""The outcome rule (``cupy_swap/cuda/outcomes.py``, ``cuda/slots.py``) on
the CPU: a real slot ring over NumPy memory, launches stood in by the fake
kernel of tests/fakes.py (it checks rows as the kernel does and writes the
slot's record; ``held`` launches complete when a test calls ``land``).
Each test names the review finding of issue 32 it would have caught."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import cupy_swap.prepared as prepared
from cupy_swap.core.layout import layout_from_parts
from cupy_swap.core.parts import as_parts
from cupy_swap.op_cache import OpCache
from cupy_swap.prepared import PreparedSwap

from .fakes import FakeSwapper, fake_ring, land

pytest.importorskip("cupy", reason="wait_handle tells CuPy events apart")


@pytest.fixture(autouse=True)
def not_capturing(monkeypatch):
    monkeypatch.setattr(prepared, "stream_is_capturing", lambda handle: False)


def _op(fake_gpu, sw, channel=None) -> PreparedSwap:
    host = np.zeros((64, 64), np.uint8)
    gpu = fake_gpu.parts(np.zeros((64, 64), np.uint8), "dst")
    layout = layout_from_parts(as_parts(host, "src"), gpu)
    return PreparedSwap(sw, layout, (host,), outcomes=channel)


def _sync(event) -> None:
    """What ``SwapEvent.synchronize()`` does once the swap completed."""
    if event.check is not None:
        event.check.raise_on_event(event)


BAD = [(1, 10), (2, 10)]  # block 10 as destination twice
GOOD = [(1, 10), (2, 11)]


def test_a_slot_is_never_reused_while_its_verdict_is_unread(fake_gpu):
    """Finding 1: a swap queued behind long work kept its record number
    (seq % 4096); later swaps wrapped round and a late check rewrote the
    record a bad swap shared with it, so the bad swap read as success.  Now
    a record is its slot's, and the slot waits for its launch."""
    sw = FakeSwapper([])
    op = _op(fake_gpu, sw)
    sw.kernel.held = True
    late = op(GOOD)  # its check has not run: its slot stays taken
    sw.kernel.held = False
    for _ in range(50):  # many more swaps than slots: they cycle through the other three
        _sync(op(GOOD))
    bad = op(BAD)
    assert bad.slot != late.slot
    land(sw._launcher.slots, late.seq)  # the late check runs now: it writes its own record only
    _sync(late)
    with pytest.raises(ValueError, match=f"swap #{bad.seq}: .*block 10 again in row 1"):
        _sync(bad)
    with pytest.raises(ValueError, match=f"swap #{bad.seq}"):
        _sync(bad)  # every time: the event is that swap


def test_a_verdict_never_read_is_not_lost_and_a_lost_one_is_never_success(fake_gpu):
    """Finding 2: after 4096 later swaps a verdict never read read as
    success.  Now a slot's verdict is read before the slot is taken again;
    a launch that ended without writing its verdict is a lost verdict, from
    its event and, if nobody asked it, from the next call."""
    sw = FakeSwapper([])
    op, other = _op(fake_gpu, sw), _op(fake_gpu, sw)
    first = op(BAD)
    for _ in range(20):  # another op's swaps take the slots again, the failure kept
        other(GOOD)
    with pytest.raises(ValueError, match=f"earlier swap \\(swap #{first.seq}"):
        op(GOOD)
    ring = sw._launcher.slots
    sw.kernel.held = True
    never = op(GOOD)
    land(ring, never.seq, verdict=False)  # its launch "completed" and its record holds no verdict
    with pytest.raises(RuntimeError, match=f"swap #{never.seq}: .*lost verdict"):
        _sync(never)
    unasked = op(GOOD)
    land(ring, unasked.seq, verdict=False)
    sw.kernel.held = False
    for _ in range(8):
        other(GOOD)  # its slot is taken again: read there, told to its op's next call
    with pytest.raises(RuntimeError, match=f"swap #{unasked.seq}: .*lost verdict.*not launched"):
        op(GOOD)


def test_each_failure_is_raised_once_whoever_asks_first(fake_gpu):
    """Finding 3: 'reported' was a high-water mark, so raising the second
    failure (its event) swallowed the first for good."""
    sw = FakeSwapper([])
    op = _op(fake_gpu, sw)
    one, two = op(BAD), None
    with pytest.raises(ValueError, match=f"earlier swap \\(swap #{one.seq}"):
        two = op(BAD)  # the alarm moved: the first is told by the next call
    two = op(BAD)
    with pytest.raises(ValueError, match=f"swap #{two.seq}"):
        _sync(two)
    op(GOOD)  # the second was told by its event, so never again here
    with pytest.raises(ValueError, match=f"swap #{one.seq}"):
        _sync(one)  # and the first's event still says so


def test_a_failure_is_told_as_soon_as_its_verdict_landed(fake_gpu):
    """The alarm moves when CTA 0 wrote the verdict, before the launch's last
    CTA writes the done word: the next call reads the verdict then."""
    sw = FakeSwapper([])
    op = _op(fake_gpu, sw)
    sw.kernel.held = True
    bad = op(BAD)
    land(sw._launcher.slots, bad.seq, 3, 1, 10, done=False)
    with pytest.raises(ValueError, match=f"earlier swap \\(swap #{bad.seq}.*block 10 again in row 1"):
        op(GOOD)
    with pytest.raises(ValueError, match=f"swap #{bad.seq}"):
        _sync(bad)


def test_a_failed_call_never_erases_the_verdict_of_the_swap_that_took_its_slot(fake_gpu):
    """Review of issue 38: a call whose event record failed after its launch
    cleared the slot's owner; another thread had taken the slot meanwhile and
    launched a bad swap, which then read as success."""
    sw = FakeSwapper([], ring_size=1)
    op_a, op_b = _op(fake_gpu, sw), _op(fake_gpu, sw)
    got = {}

    def record(ptr, stream):  # A's record: B takes the (finished) slot first, then A's record fails
        sw._record = lambda ptr, stream: None
        t = threading.Thread(target=lambda: got.__setitem__("b", op_b(BAD)))
        t.start()
        t.join()
        raise RuntimeError("cudaEventRecord failed")

    sw._record = record
    with pytest.raises(RuntimeError, match="cudaEventRecord failed"):
        op_a(GOOD)
    with pytest.raises(ValueError, match=f"swap #{got['b'].seq}: .*block 10 again"):
        _sync(got["b"])


def test_a_verdict_that_lands_before_its_call_marked_the_slot_is_found(fake_gpu):
    """Review of issue 38: a bad swap's kernel wrote its verdict and the
    alarm before its call marked the slot launched; another thread's call
    used up the alarm and skipped the slot, so the next call of the bad
    swap's thread went ahead."""
    sw = FakeSwapper([])
    op_a, op_b = _op(fake_gpu, sw), _op(fake_gpu, sw)
    kernel = sw.kernel
    real = kernel.launch_slot

    def launch_slot(i, stream):  # A's launch lands, and before A marks the slot: B calls
        kernel.launch_slot = real
        real(i, stream)
        t = threading.Thread(target=lambda: op_b(GOOD))
        t.start()
        t.join()

    kernel.launch_slot = launch_slot
    bad = op_a(BAD)
    with pytest.raises(ValueError, match=f"earlier swap \\(swap #{bad.seq}"):
        op_a(GOOD)


def test_a_failure_is_told_to_the_thread_that_made_the_swap(fake_gpu):
    """Finding 5 (threads): with an op shared by threads, thread A got
    thread B's failure as if its own mapping were bad."""
    import concurrent.futures

    sw = FakeSwapper([])
    op = _op(fake_gpu, sw)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as thread_b:  # one thread, both calls
        bad = thread_b.submit(op, BAD).result()
        op(GOOD)  # thread A: not its failure
        with pytest.raises(ValueError) as info:
            thread_b.submit(op, GOOD).result()
    assert info.value.swap_seq == bad.seq


def test_the_error_of_a_later_call_names_the_earlier_swap(fake_gpu):
    """Finding 5: the next call raised an earlier swap's failure as if its
    own valid one-row mapping were bad, with no word of an earlier swap."""
    sw = FakeSwapper([])
    op = _op(fake_gpu, sw)
    bad = op([(1, 99)] + [(i, i) for i in range(20)])
    with pytest.raises(IndexError) as info:
        op([(3, 4), (5, 6)])
    text = str(info.value)
    assert f"earlier swap (swap #{bad.seq}" in text and "this call was not launched" in text
    assert "destination block index 99 in row 0" in text and info.value.swap_seq == bad.seq


def test_the_channel_of_a_key_outlives_evictions_and_clears():
    """Finding 4: a rebuilt cached op came with new verdicts, so swap()
    callers lost a failed check after register_host() or 64 other layouts."""
    cache = OpCache(size=2)
    src, dst = np.zeros(4), np.zeros(4)
    channel = cache.channel(("a",), src, dst)
    cache.clear()
    for k in range(5):
        cache.put((k,), object(), np.zeros(1), np.zeros(1))
    assert cache.channel(("a",), src, dst) is channel


def test_the_channel_of_a_key_dies_with_its_arrays():
    """Review of issue 32: a key is (id, address, ...) of the owners, so new
    memory at a reused id and address inherited an old unraised failure."""
    cache = OpCache()
    src, dst = np.zeros(4), np.zeros(4)
    channel = cache.channel(("a",), src, dst)
    del src
    assert cache.channel(("a",), dst, dst) is not channel


def test_a_failure_outlives_every_op_of_its_channel(fake_gpu):
    sw = FakeSwapper([])
    cache = OpCache()
    keep = np.zeros(4)  # the arrays of the key, alive
    op = _op(fake_gpu, sw, cache.channel("key", keep, keep))
    sw.kernel.held = True
    bad = op(BAD)
    del op  # evicted, cleared or rebuilt: the ring keeps the channel
    land(sw._launcher.slots, bad.seq, 3, 1, 10)
    sw.kernel.held = False
    again = _op(fake_gpu, sw, cache.channel("key", keep, keep))
    with pytest.raises(ValueError, match=f"swap #{bad.seq}"):
        again(GOOD)


def test_a_full_ring_waits_for_the_first_slot_to_finish(fake_gpu):
    """The queueing rule: with every slot's launch still queued, a swap
    waits for the first to finish, and reads its verdict before reusing it."""
    sw = FakeSwapper([], ring_size=2)
    op = _op(fake_gpu, sw)
    ring = sw._launcher.slots
    sw.kernel.held = True
    first, second = op(BAD), op(GOOD)
    assert second.slot != first.slot
    got = []
    t = threading.Thread(target=lambda: got.append(op(GOOD)))
    t.start()
    while ring.waits == 0 and t.is_alive():  # a condition, not a clock: it is waiting
        threading.Event().wait(0.001)
    land(ring, first.seq, 3, 1, 10)  # the first finishes: its slot is the one taken
    t.join()
    assert got[0].slot == first.slot and op._outcomes.failed[0].seq == first.seq
    with pytest.raises(ValueError, match=f"swap #{first.seq}"):
        _sync(first)


def test_a_swap_whose_call_failed_after_its_launch_tells_nobody(fake_gpu):
    sw = FakeSwapper([])
    op = _op(fake_gpu, sw)

    def refuses(ptr, stream):
        raise RuntimeError("cudaEventRecord failed")

    sw._record = refuses
    with pytest.raises(RuntimeError, match="cudaEventRecord"):
        op(BAD)
    sw._record = lambda ptr, stream: None
    op(GOOD)
    op(GOOD)  # the failed call's bad rows are not told: its caller was told the call failed
    assert op._outcomes.failed == []


def test_a_swap_whose_launch_raised_gives_its_slot_back(fake_gpu):
    """Review of issue 32: a checked swap whose launch raised (a kernel that
    cannot load, an interrupt) kept its record for good; after as many as
    the board held, every checked swap waited for ever."""
    sw = FakeSwapper([], ring_size=2)
    op = _op(fake_gpu, sw)

    def refuses(*args):
        raise RuntimeError("cuModuleLoadData failed")

    real = sw.kernel.launch_slot
    sw.kernel.launch_slot = refuses
    for _ in range(5):
        with pytest.raises(RuntimeError, match="cuModuleLoadData"):
            op([(i, i) for i in range(20)])
    sw.kernel.launch_slot = real
    assert sw._launcher.slots.busy() == 0
    _sync(op(GOOD))


def test_a_ring_closed_while_a_call_takes_a_slot_waits_for_that_slot():
    """Second review of issue 38: close() ran between a look's closed check
    and its take; the releaser's gate found every slot free and freed the
    ring's counters while the call went on to launch over its slot."""
    ring = fake_ring(2)
    _, _, (_, gate, _), _ = ring._finalizer.peek()
    ring._finalizer.detach()  # this test plays close() and the releaser itself
    released = threading.Event()
    releaser = threading.Thread(target=lambda: (gate(), released.set()), daemon=True)

    class Closing:
        """close() runs right after the look read ``alive``: the releaser's
        gate runs then (given 0.2 s), while the look goes on to take a slot."""

        reads = 0

        @property
        def alive(self):
            self.reads += 1
            if self.reads == 1:
                releaser.start()
                releaser.join(0.2)
                return True
            return False

    ring._finalizer = Closing()
    i = ring.take()
    assert not released.is_set()  # the gate waits for the slot a call holds
    ring.give_back(i)
    assert released.wait(5)
    with pytest.raises(RuntimeError, match="closed"):
        ring.take()


def test_an_event_that_read_its_failure_is_the_only_one_to_raise_it(fake_gpu):
    """Second review of issue 38: another thread synchronized a bad swap's
    event; between its read of the verdict and its raise (two holds of the
    lock), the swap's own thread called again and was refused for it too,
    told that nobody synchronized the event: one failure raised twice."""
    sw = FakeSwapper([])
    op = _op(fake_gpu, sw)
    ring = sw._launcher.slots
    sw.kernel.held = True
    bad = op(BAD)
    sw.kernel.held = False
    land(ring, bad.seq, 3, 1, 10)
    real = ring._lock
    read, called = threading.Event(), threading.Event()

    class Lock:
        """The ring's lock; thread B's first release lets thread A call."""

        def __enter__(self):
            real.acquire()

        def __exit__(self, *exc):
            real.release()
            if threading.current_thread() is b and not read.is_set():
                read.set()
                called.wait(5)

    ring.lock = ring._lock = Lock()
    raised = []

    def sync():
        try:
            _sync(bad)
        except ValueError as e:
            raised.append(("event", e.swap_seq))

    b = threading.Thread(target=sync)
    b.start()
    assert read.wait(5)
    try:
        op(GOOD)
    except ValueError as e:
        raised.append(("call", e.swap_seq))
    called.set()
    b.join(5)
    assert raised == [("event", bad.seq)]


def test_a_thread_threading_did_not_start_never_gets_an_earlier_ones_failure(fake_gpu):
    """Second review of issue 38: a failure named its thread by
    ``threading.current_thread()``, which for threads started by C code is
    one stand-in per thread id, kept after the thread ends: the next such
    thread with the same id got the dead one's failure as its own, and the
    dead one never read as ended."""
    import _thread

    sw = FakeSwapper([])
    op = _op(fake_gpu, sw)
    got: list = []

    def in_a_c_thread(fn):
        done = threading.Event()

        def run():
            try:
                got.append((threading.current_thread(), fn()))
            except Exception as e:
                got.append((threading.current_thread(), e))
            done.set()

        _thread.start_new_thread(run, ())
        assert done.wait(5)
        threading.Event().wait(0.05)  # the thread is gone
        return got[-1]

    first, bad = in_a_c_thread(lambda: op(BAD))
    second, outcome = in_a_c_thread(lambda: op(GOOD))
    if first is not second:
        pytest.skip("this platform gave the second thread another id")
    assert not isinstance(outcome, Exception)  # not its failure
    op(GOOD)  # the main thread's call: the dead thread's failure is dropped from the channel ...
    assert op._outcomes.failed == []
    with pytest.raises(ValueError, match=f"swap #{bad.seq}"):
        _sync(bad)  # ... its event still tells it


def test_a_failed_record_never_gives_back_a_slot_another_call_holds(fake_gpu):
    """Review of session 56: A's launch finished and B took the slot again
    (held, launching) when A's event record raised; A's failure handling
    read the slot's shared state, saw it taken and gave it back, so B lost
    its verdict and a third call could write the slot under B's launch.  A
    call now knows itself whether it launched."""
    from cupy_swap.cuda import slots

    sw = FakeSwapper([], ring_size=1)
    op_a, op_b = _op(fake_gpu, sw), _op(fake_gpu, sw)
    ring, kernel = sw._launcher.slots, sw.kernel
    real_launch = kernel.launch_slot
    b_launching, b_go, got = threading.Event(), threading.Event(), {}

    def b_launch(i, stream):  # B holds the slot, launching, until the test lets it go
        b_launching.set()
        assert b_go.wait(30)
        real_launch(i, stream)

    def a_record(ptr, stream):  # A launched; B takes the finished slot, then A's record fails
        sw._record = lambda ptr, stream: None
        kernel.launch_slot = b_launch
        got["thread"] = t = threading.Thread(target=lambda: got.__setitem__("b", op_b(BAD)))
        t.start()
        assert b_launching.wait(30)
        raise RuntimeError("cudaEventRecord failed")

    sw._record = a_record
    with pytest.raises(RuntimeError, match="cudaEventRecord failed"):
        op_a(GOOD)
    assert ring.pending[0] == slots._TAKEN  # still B's
    kernel.launch_slot = real_launch
    b_go.set()
    got["thread"].join(30)
    with pytest.raises(ValueError, match=f"swap #{got['b'].seq}: .*block 10 again"):
        _sync(got["b"])  # B's verdict reached B
