"""The outcome rule (``cupy_swap/cuda/outcomes.py``) on the CPU: a real
status board over NumPy memory, launches stood in by ``board.land`` (what
the kernel writes), ops by tests/fakes.py.  Each test names the review
finding of issue 32 it would have caught."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import cupy_swap.prepared as prepared
from cupy_swap.core.layout import layout_from_parts
from cupy_swap.core.parts import as_parts
from cupy_swap.op_cache import OpCache
from cupy_swap.prepared import PreparedSwap

from .fakes import FakeSwapper, host_board, land

pytest.importorskip("cupy", reason="wait_handle tells CuPy events apart")


@pytest.fixture(autouse=True)
def not_capturing(monkeypatch):
    monkeypatch.setattr(prepared, "stream_is_capturing", lambda handle: False)


def _op(fake_gpu, board, channel=None) -> PreparedSwap:
    host = np.zeros((64, 64), np.uint8)
    gpu = fake_gpu.parts(np.zeros((64, 64), np.uint8), "dst")
    layout = layout_from_parts(as_parts(host, "src"), gpu)
    return PreparedSwap(FakeSwapper([], board=board), layout, (host,), outcomes=channel)


BAD = [(1, 10), (2, 10)]  # block 10 as destination twice
GOOD = [(1, 10), (2, 11)]


def test_a_record_is_never_reused_while_its_verdict_is_unread(fake_gpu):
    """Finding 1: a swap queued behind long work kept its record number
    (seq % 4096); later swaps wrapped round and a late check rewrote the
    record a bad swap shared with it, so the bad swap read as success."""
    board = host_board(slots=4)
    op = _op(fake_gpu, board)
    late = op(GOOD, check="launch")  # its check has not run: its record stays reserved
    for _ in range(50):  # many more swaps than records: they cycle through the other three
        land(board, op(GOOD, check="launch").seq)
    bad = op(BAD, check="launch")
    assert bad.check.address != late.check.address
    land(board, late.seq)  # the late check runs now: it writes its own record only
    land(board, bad.seq, 3, 1, 10)
    late.check.raise_on_event()
    with pytest.raises(ValueError, match=f"swap #{bad.seq}: .*block 10 again in row 1"):
        bad.check.raise_on_event()


def test_a_verdict_never_read_is_not_lost_and_a_lost_one_is_never_success(fake_gpu):
    """Finding 2: after 4096 later swaps a verdict never read read as
    success.  Now it stays until read; an event that completed without its
    verdict raises a lost verdict."""
    board = host_board(slots=4)
    op, other = _op(fake_gpu, board), _op(fake_gpu, board)
    first = op(BAD, check="launch")
    land(board, first.seq, 3, 1, 10)
    for _ in range(20):  # another op's swaps: records collected and reused, the failure kept
        land(board, other(GOOD, check="launch").seq)
    with pytest.raises(ValueError, match=f"earlier swap \\(swap #{first.seq}"):
        op(GOOD, check="launch")
    never = op(GOOD, check="launch")
    with pytest.raises(RuntimeError, match=f"swap #{never.seq}: .*lost verdict"):
        never.check.raise_on_event()  # its event "completed" and its record holds no verdict


def test_each_failure_is_raised_once_whoever_asks_first(fake_gpu):
    """Finding 3: 'reported' was a high-water mark, so raising the second
    failure (its event) swallowed the first for good."""
    board = host_board()
    op = _op(fake_gpu, board)
    one, two = op(BAD, check="launch"), op(BAD, check="launch")
    land(board, one.seq, 3, 1, 10)
    land(board, two.seq, 3, 1, 10)
    with pytest.raises(ValueError, match=f"swap #{two.seq}"):
        two.check.raise_on_event()
    with pytest.raises(ValueError, match=f"earlier swap \\(swap #{one.seq}"):
        op(GOOD)  # the first is still told, by the next call
    op(GOOD)  # and only once; the second was told by its event, so never again here


def test_a_failure_is_told_to_the_thread_that_made_the_swap(fake_gpu):
    """Finding 5 (threads): with an op shared by threads, thread A got
    thread B's failure as if its own mapping were bad."""
    import concurrent.futures

    board = host_board()
    op = _op(fake_gpu, board)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as thread_b:  # one thread, both calls
        bad = thread_b.submit(op, BAD, check="launch").result()
        land(board, bad.seq, 3, 1, 10)
        op(GOOD)  # thread A: not its failure
        with pytest.raises(ValueError) as info:
            thread_b.submit(op, GOOD).result()
    assert info.value.swap_seq == bad.seq


def test_the_error_of_a_later_call_names_the_earlier_swap(fake_gpu):
    """Finding 5: the next call raised an earlier swap's failure as if its
    own valid one-row mapping were bad, with no word of an earlier swap."""
    board = host_board()
    op = _op(fake_gpu, board)
    bad = op([(1, 99)] + [(i, i) for i in range(20)], check="launch")
    land(board, bad.seq, 2, 0, 99)
    with pytest.raises(IndexError) as info:
        op([(3, 4)])
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
    board = host_board()
    cache = OpCache()
    keep = np.zeros(4)  # the arrays of the key, alive
    op = _op(fake_gpu, board, cache.channel("key", keep, keep))
    bad = op(BAD, check="launch")
    del op  # evicted, cleared or rebuilt: the ticket and the board keep the channel
    land(board, bad.seq, 3, 1, 10)
    again = _op(fake_gpu, board, cache.channel("key", keep, keep))
    with pytest.raises(ValueError, match=f"swap #{bad.seq}"):
        again(GOOD)


def test_a_full_board_waits_for_the_first_record_to_land(fake_gpu):
    """The queueing rule for records: with every record reserved by a check
    that has not run, a checked swap waits for the first to land."""
    board = host_board(slots=2)
    op = _op(fake_gpu, board)
    first, second = op(GOOD, check="launch"), op(GOOD, check="launch")
    got = []
    t = threading.Thread(target=lambda: got.append(op(GOOD, check="launch")))
    t.start()
    while board.waits == 0 and t.is_alive():  # a condition, not a clock: it is waiting
        threading.Event().wait(0.001)
    land(board, second.seq)  # the second lands first: its record is the one taken
    t.join()
    assert got[0].check.address == second.check.address and first.check.verdict is None


def test_an_abandoned_ticket_tells_nobody(fake_gpu):
    board = host_board()
    op = _op(fake_gpu, board)
    ticket = board.take(op._outcomes, op._decided.layout)
    ticket.abandon(launched=True)  # queued after all: its record comes back once written
    land(board, ticket.seq, 3, 1, 10)
    board.collect_if_alarmed()
    op(GOOD, check="host")  # the swap raised: its caller was told that, not this
    assert op._outcomes.open == 0 and ticket.index in board._free


def test_a_swap_whose_launch_raised_gives_its_record_back(fake_gpu):
    """Review of issue 32: a checked swap whose launch raised (a kernel that
    cannot load, an interrupt) kept its record for good; after as many as
    the board holds, every checked swap waited for ever."""
    board = host_board(slots=2)
    op = _op(fake_gpu, board)

    def refuses(*args):
        raise RuntimeError("cuModuleLoadData failed")

    op._decided.kernel.launch_slot = refuses
    for _ in range(5):
        with pytest.raises(RuntimeError, match="cuModuleLoadData"):
            op([(i, i) for i in range(20)], check="launch")
    assert len(board._free) == 2 and op._outcomes.open == 0
