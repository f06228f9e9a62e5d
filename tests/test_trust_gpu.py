"""Issue 32 on the GPU, one test per finding of its review: outcomes (1-5),
capture (6), queueing (7), GraphSwap's default stream (8), empty mappings
(9), the op cache (10).  Work that must stay queued waits behind a
:class:`~tests.gpu_helpers.Gate`, opened by the test: no clock decides."""

import threading

import numpy as np
import pytest

import cupy_swap as cs
from cupy_swap.tools.bench import random_mapping

from .gpu_helpers import CallTimes, Gate, another_thread_capturing, poison, rand_fill, require_gpu

pytestmark = pytest.mark.gpu

cp = require_gpu()

ROWS = 100  # host rows checked in the launch (more than 16: a ring slot)


def _pools(rng, blocks=256, block=64):
    host = cs.empty_pinned((blocks, block), np.uint8)
    gpu = cp.empty((blocks, block), cp.uint8)
    rand_fill(host, rng)
    poison(gpu)
    cp.cuda.Device().synchronize()
    return host, gpu


def _bad(rng, blocks=256):
    m = random_mapping(ROWS, blocks, blocks, rng)
    m[:, 1] = np.arange(ROWS) + 20
    m[1, 1] = m[0, 1] = 10  # block 10 as destination twice
    return m


def test_a_late_check_never_rewrites_another_swaps_verdict(rng):
    """Finding 1: a good swap queued behind long work, then as many checked
    swaps as there are records and a bad one on another stream: the late
    check rewrote the record the bad swap shared with it, and the bad swap
    read as success (block 10 untouched).  (Records are the ring slots' now:
    the late swap's slot waits for it; the others cycle through the rest.)"""
    sw = cs.BlockSwapper(max_blocks=ROWS)
    host, gpu = _pools(rng)
    op = sw.prepare(host, gpu)
    a, b = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    gate = Gate(a)
    calls = CallTimes()
    late = calls(op, random_mapping(ROWS, 256, 256, rng), stream=a)
    for _ in range(64):
        calls(op, random_mapping(ROWS, 256, 256, rng), stream=b)
    bad = calls(op, _bad(rng), stream=b)
    calls(b.synchronize)
    assert gate.closed, (
        f"the gate opened at its limit: a call waited for it ({calls})"
    )  # the late check has not run
    with pytest.raises(ValueError, match=f"swap #{bad.seq}: .*block 10 again in row 1"):
        bad.synchronize()
    gate.open()
    late.synchronize()  # its own verdict: good
    with pytest.raises(ValueError, match=f"swap #{bad.seq}"):
        bad.synchronize()  # still the bad one's, after the late check ran


def test_a_verdict_never_read_is_raised_after_many_later_swaps(rng):
    """Finding 2: after as many later checked swaps as records, a verdict
    never read read as success (now: its slot taken again reads it first)."""
    sw = cs.BlockSwapper(max_blocks=ROWS)
    host, gpu = _pools(rng)
    op, other = sw.prepare(host, gpu), sw.prepare(host, cp.empty_like(gpu))
    bad = op(_bad(rng))
    for _ in range(40):
        other(random_mapping(ROWS, 256, 256, rng)).synchronize()
    with pytest.raises(ValueError, match=rf"earlier swap \(swap #{bad.seq}"):
        op([(0, 0)])


def test_two_failures_are_each_raised_once(rng):
    """Finding 3: raising the second failure (its event) swallowed the first."""
    sw = cs.BlockSwapper(max_blocks=ROWS)
    host, gpu = _pools(rng)
    op = sw.prepare(host, gpu)
    stream = cp.cuda.Stream(non_blocking=True)
    gate = Gate(stream)  # neither check runs before both swaps are made
    one, two = op(_bad(rng), stream=stream), op(_bad(rng), stream=stream)
    gate.open()
    with pytest.raises(ValueError, match=f"swap #{two.seq}"):
        two.synchronize()
    with pytest.raises(ValueError, match=rf"earlier swap \(swap #{one.seq}.*this call was not launched"):
        op([(0, 0)])
    op([(0, 0)]).synchronize()  # each once
    assert (cp.asnumpy(gpu[10]) == 0xA5).all()


@pytest.mark.parametrize("between", ["register_host", "300 layouts"])
def test_swap_raises_a_failure_after_its_cached_op_was_rebuilt(rng, between):
    """Finding 4: after register_host() of another array, or after 64 other
    layouts, the next swap() of the same arrays raised nothing."""
    sw = cs.BlockSwapper(max_blocks=ROWS)
    host, gpu = _pools(rng)
    bad = sw.swap_in(host, gpu, _bad(rng))
    cp.cuda.Device().synchronize()
    if between == "register_host":
        other = np.zeros((4, 64), np.uint8)
        cs.register_host(other)
        cs.unregister_host(other)
    else:
        extra = cp.empty((300, 1, 64), cp.uint8)
        for i in range(300):
            sw.swap_in(host[:1], extra[i], [(0, 0)])
    with pytest.raises(ValueError, match=rf"earlier swap \(swap #{bad.seq}"):
        sw.swap_in(host, gpu, [(0, 1)])
    sw.swap_in(host, gpu, [(0, 1)]).synchronize()


def test_a_thread_is_told_its_own_failure_only(rng):
    """Finding 5: with an op shared by threads, thread A got thread B's failure."""
    import concurrent.futures

    sw = cs.BlockSwapper(max_blocks=ROWS)
    host, gpu = _pools(rng)
    op = sw.prepare(host, gpu)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as thread_b:
        bad = thread_b.submit(op, _bad(rng)).result()
        cp.cuda.Device().synchronize()
        op([(0, 0)]).synchronize()  # this thread: nothing to raise
        with pytest.raises(ValueError, match=f"swap #{bad.seq}") as info:
            thread_b.submit(op, [(0, 0)]).result()
    assert info.value.swap_seq == bad.seq


def test_calls_between_replays_leave_another_threads_capture_valid(rng):
    """Finding 6: a swap with its mapping on the GPU (its kept-mapping
    query), GraphSwap.set_mapping()/launch() and BlockSwapper() broke
    another thread's global-mode capture."""
    host, gpu = _pools(rng)
    sw = cs.BlockSwapper(max_blocks=ROWS)
    gs = sw.graph_swap(host, gpu)
    op = sw.prepare(host, gpu)
    for _ in range(3):  # events to query: earlier GPU-mapping swaps and graph uploads
        op(cp.asarray(random_mapping(ROWS, 256, 256, rng)))
        gs.set_mapping(random_mapping(8, 256, 256, rng))
        gs.launch()
    stream = cp.cuda.Stream(non_blocking=True)
    rows_on_gpu = cp.asarray(random_mapping(ROWS, 256, 256, rng))  # cupy.asarray allocates pinned memory
    cp.cuda.Device().synchronize()
    with another_thread_capturing(sw.device):
        ev = op(rows_on_gpu, stream=stream)
        gs.set_mapping(random_mapping(8, 256, 256, rng), stream=stream)
        gs.launch(stream=stream)
        sw2 = cs.BlockSwapper(max_blocks=ROWS)
        sw2.swap_in(host, gpu, random_mapping(ROWS, 256, 256, rng), stream=stream)
        ev.synchronize()
    stream.synchronize()


def test_a_slot_swap_never_waits_for_another_streams_queued_slot(rng):
    """Finding 7: with one ring-slot swap queued behind long work and 15
    slots free, the next such swap on another stream blocked its thread for
    that work (strict round robin)."""
    sw = cs.BlockSwapper(max_blocks=ROWS)
    host, gpu = _pools(rng)
    op = sw.prepare(host, gpu)
    a, b = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    m = random_mapping(ROWS, 256, 256, rng)
    op(m, stream=b).synchronize()
    gate = Gate(a)
    calls = CallTimes()
    queued = calls(op, m, stream=a)
    for _ in range(40):  # round the ring more than twice
        calls(op, m, stream=b)
    calls(b.synchronize)
    # None of them waited for the gated slot (the loop would never end): a
    # swap that found every slot busy waited for the first of stream b's.
    assert gate.closed and not queued.done, f"the gate opened at its limit: a call waited for it ({calls})"
    gate.open()
    queued.synchronize()
    assert np.array_equal(cp.asnumpy(gpu)[m[:, 1]], host[m[:, 0]])


def test_empty_mappings_are_no_ops_in_every_form(rng):
    """Finding 9: an empty mapping as 1-D index pairs raised TypeError."""
    sw = cs.BlockSwapper(max_blocks=ROWS)
    host, gpu = _pools(rng)
    for m in ([], np.empty((0, 2), np.int64), (np.array([]), np.array([])), ([], []), ((), ())):
        assert sw.swap_in(host, gpu, m).path == "none"
        sw.prepare(host, gpu)(m).synchronize()
        gs = sw.graph_swap(host, gpu)
        gs.set_mapping(m)
        assert gs.num_pairs == 0
        gs.close()
    assert (cp.asnumpy(gpu) == 0xA5).all()


def test_a_per_layer_loop_hits_the_op_cache_after_its_first_pass(rng):
    """Finding 10: insertion-order eviction made a loop over 128 layouts
    (32 layers x K/V x 2 directions) miss on every call."""
    sw = cs.BlockSwapper(max_blocks=8)
    host = [cs.empty_pinned((8, 64), np.uint8) for _ in range(64)]
    gpu = [cp.empty((8, 64), cp.uint8) for _ in range(64)]
    for pass_ in range(2):
        for h, g in zip(host, gpu):
            sw.swap_in(h, g, [(1, 2)])
            sw.swap_out(g, h, [(2, 3)])
        if pass_ == 0:
            ops = {k: e.op for k, e in sw._ops._entries.items()}
    assert len(ops) == 128 and all(sw._ops._entries[k].op is op for k, op in ops.items())
    cp.cuda.Device().synchronize()


def test_graph_swap_launch_defaults_to_torchs_current_stream():
    """Finding 8: GraphSwap.launch() without stream= inside torch.cuda.graph
    went to CuPy's current stream: the graph was empty, replays moved nothing."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs torch with CUDA")
    host = torch.randint(0, 255, (64, 256), dtype=torch.uint8).pin_memory()
    gpu = torch.zeros((64, 256), dtype=torch.uint8, device="cuda")
    sw = cs.BlockSwapper(max_blocks=16)
    gs = sw.graph_swap(host, gpu)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        gs.set_mapping([])
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=side):
            gs.launch()
        for m in ([(1, 2), (3, 4)], [(5, 6)]):
            gs.set_mapping(m)
            graph.replay()
            torch.cuda.current_stream().synchronize()
            for s, d in m:
                assert torch.equal(gpu[d].cpu(), host[s])


def test_swaps_of_threads_sharing_a_swapper_report_only_their_own(rng):
    """Threads with good and bad swaps on one op: each bad swap is raised
    once, to its own thread, by its event or its next call."""
    sw = cs.BlockSwapper(max_blocks=ROWS)
    host, gpu = _pools(rng, blocks=4096)
    op = sw.prepare(host, gpu)
    told: dict = {}
    errors: list = []

    def worker(index):
        r = np.random.default_rng(index)
        mine, raised = [], []
        try:
            for i in range(30):
                stream = cp.cuda.Stream(non_blocking=True)
                m = random_mapping(ROWS, 4096, 4096, r)
                if i % 7 == 3:
                    m[1, 1] = m[0, 1]
                try:
                    ev = op(m, stream=stream)
                    if i % 7 == 3:
                        mine.append(ev.seq)
                except ValueError as e:
                    raised.append(e.swap_seq)
            cp.cuda.Device().synchronize()
            try:
                op([(0, 0)])
            except ValueError as e:
                raised.append(e.swap_seq)
            while True:  # the rest, one per call
                try:
                    op([(0, 0)])
                    break
                except ValueError as e:
                    raised.append(e.swap_seq)
            told[index] = (mine, raised)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    for mine, raised in told.values():
        assert sorted(raised) == sorted(mine)
