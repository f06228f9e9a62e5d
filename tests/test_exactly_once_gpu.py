"""Exactly one outcome per swap, told to its own caller, under contention
(NOTES 70's suggestion for the GPU): eight threads share one op and a ring
of two slots, each on its own stream; a fifth of the swaps have a bad row;
each swap's event is synchronized by its own thread, handed to another
thread, or never synchronized.  Every bad swap is raised (by its event, or
once by its own thread's next call), no good swap ever is, and no thread is
told another's failure; a swapper closed while threads swap breaks nothing.
"""

import queue
import re
import threading

import numpy as np
import pytest

import cupy_swap as cs

from .gpu_helpers import rand_fill, require_gpu

pytestmark = pytest.mark.gpu

cp = require_gpu()

THREADS, CALLS, ROWS, BLOCKS = 8, 60, 8, 512


def _seq(e) -> int:
    seq = getattr(e, "swap_seq", None)
    if seq is None:
        seq = int(re.search(r"swap #(\d+)", str(e)).group(1))
    return seq


def test_every_bad_swap_is_raised_to_its_own_caller_and_no_good_one_is():
    sw = cs.BlockSwapper(max_blocks=ROWS, ring_size=2)
    host = cs.empty_pinned((BLOCKS, 256), np.uint8)
    rand_fill(host, np.random.default_rng(0))
    gpu = cp.zeros((BLOCKS, 256), cp.uint8)
    cp.cuda.Device().synchronize()
    op = sw.prepare(host, gpu)
    handed: queue.Queue = queue.Queue()
    lock = threading.Lock()
    bad_seqs, good_seqs = set(), set()
    mine: dict = {}  # seq -> the thread that made it
    hows: dict = {}  # seq -> own, other or never: who synchronizes its event
    by_event: list = []  # (seq, the thread that synchronized)
    by_call: list = []  # (seq, the thread whose call raised it)
    errors: list = []

    def synchronizer():
        while True:
            ev = handed.get()
            if ev is None:
                return
            try:
                ev.synchronize()
            except (ValueError, IndexError) as e:
                with lock:
                    by_event.append((_seq(e), "synchronizer"))

    def worker(k):
        rng = np.random.default_rng(100 + k)
        stream = cp.cuda.Stream(non_blocking=True)
        try:
            for _ in range(CALLS):
                m = np.stack(
                    [rng.choice(BLOCKS, ROWS, replace=False), rng.choice(BLOCKS, ROWS, replace=False)], 1
                )
                bad = rng.random() < 0.2
                if bad:
                    m[ROWS - 1, 1] = m[0, 1]  # a destination twice
                try:
                    ev = op(m, stream=stream, mode="kernel", check="launch")
                except (ValueError, IndexError) as e:  # an earlier failure of this thread: not launched
                    with lock:
                        by_call.append((_seq(e), k))
                    continue
                with lock:
                    (bad_seqs if bad else good_seqs).add(ev.seq)
                    mine[ev.seq] = k
                how = str(rng.choice(["own", "other", "never"]))
                with lock:
                    hows[ev.seq] = how
                if how == "own":
                    try:
                        ev.synchronize()
                    except (ValueError, IndexError) as e:
                        with lock:
                            by_event.append((_seq(e), k))
                elif how == "other":
                    handed.put(ev)
            stream.synchronize()
            for _ in range(2 * CALLS):  # the failures still waiting for this thread's next call
                try:
                    op(
                        np.array([[0, k]], np.int64), stream=stream, mode="kernel", check="launch"
                    ).synchronize()
                    break
                except (ValueError, IndexError) as e:
                    with lock:
                        by_call.append((_seq(e), k))
        except Exception as e:  # reported below
            errors.append((k, repr(e)))

    sync_thread = threading.Thread(target=synchronizer, daemon=True)
    sync_thread.start()
    workers = [threading.Thread(target=worker, args=(k,), daemon=True) for k in range(THREADS)]
    for t in workers:
        t.start()
    for t in workers:
        t.join(120)
    handed.put(None)
    sync_thread.join(60)
    assert errors == []
    assert not any(t.is_alive() for t in workers) and not sync_thread.is_alive()
    assert len(bad_seqs) >= 40 and len(good_seqs) >= 150
    raised_by_event = {s for s, _ in by_event}
    raised_by_call = [s for s, _ in by_call]
    assert not (raised_by_event | set(raised_by_call)) & good_seqs  # never false
    assert all(mine[s] == k for s, k in by_call)  # never someone else's
    assert all(mine[s] == k for s, k in by_event if k != "synchronizer")
    assert len(raised_by_call) == len(set(raised_by_call))  # a call raises each once
    assert raised_by_event | set(raised_by_call) == bad_seqs  # never lost
    for seq in bad_seqs:
        if hows[seq] == "own":  # its event raised it before the thread's next call: no call raises it too
            assert seq in raised_by_event and seq not in raised_by_call, seq
        elif hows[seq] == "never":  # only the thread's next call can tell it
            assert seq in raised_by_call and seq not in raised_by_event, seq
        else:  # "other": the synchronizer's event, and its thread's call if that came first
            assert seq in raised_by_event, seq


def test_closing_a_swapper_while_threads_swap_raises_cleanly():
    """close() racing calls that are taking slots (NOTES 70, first finding):
    each call either completes bit-exact or raises that the swapper is
    closed; nothing a queued kernel writes is freed under it."""
    sw = cs.BlockSwapper(max_blocks=ROWS, ring_size=2)
    host = cs.empty_pinned((BLOCKS, 256), np.uint8)
    rand_fill(host, np.random.default_rng(1))
    gpus = [cp.zeros((BLOCKS, 256), cp.uint8) for _ in range(4)]
    cp.cuda.Device().synchronize()
    ops = [sw.prepare(host, g) for g in gpus]
    started, errors, done = threading.Barrier(5, timeout=60), [], []

    def worker(k):
        rng = np.random.default_rng(k)
        stream = cp.cuda.Stream(non_blocking=True)
        started.wait()
        try:
            while True:
                m = np.stack(
                    [rng.choice(BLOCKS, ROWS, replace=False), rng.choice(BLOCKS, ROWS, replace=False)], 1
                )
                try:
                    ev = ops[k](m, stream=stream, mode="kernel")
                except RuntimeError as e:
                    if "closed" in str(e):
                        return
                    raise
                ev.synchronize()
                got = cp.asnumpy(gpus[k][m[:, 1]])
                if not np.array_equal(got, host[m[:, 0]]):
                    errors.append((k, "bytes"))
                done.append(k)
        except Exception as e:  # reported below
            errors.append((k, repr(e)))

    threads = [threading.Thread(target=worker, args=(k,), daemon=True) for k in range(4)]
    for t in threads:
        t.start()
    started.wait()
    while len(done) < 40 and not errors and all(t.is_alive() for t in threads):
        threading.Event().wait(0.001)  # until the workers have swapped a while (a count, not a clock)
    sw.close()
    for t in threads:
        t.join(60)
    assert errors == [] and not any(t.is_alive() for t in threads)
