"""The launcher (cupy_swap/cuda/launcher.py) on the CPU: a slot launch's
parameter is made once per op and slot, points at that slot, and is
launched as it is; the descriptor ring's slots are taken and freed by the
queueing rule (over parts that claim to be GPU memory: ``fake_gpu``)."""

import ctypes
import gc
import threading

import numpy as np
import pytest

from cupy_swap.core.layout import layout_from_parts
from cupy_swap.cuda import abi
from cupy_swap.cuda import launcher as launcher_module
from cupy_swap.cuda.launcher import BoundKernel, launch_shape
from cupy_swap.cuda.resolve import resolve_layout

from .fakes import fake_ring


class _Launcher:
    """What a BoundKernel reads of its launcher, recording launches with the
    header and index words as the driver copies them."""

    def __init__(self, ring_size: int = 3, capacity: int = 64):
        self.device, self.max_ctas, self.check_rows_max = 0, 8, 8192
        self.slots = fake_ring(ring_size, capacity)
        self.launches: list = []
        self.graphs_ok = True  # prewarmed (graph_builder.prewarm)

    def byref_args(self, layout):
        return abi.ByRefArgs(16, layout, fn=0xF00)

    def _launch(self, fn, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        (struct_ptr,) = (ctypes.c_void_p * 1).from_address(params)
        words = np.ctypeslib.as_array((ctypes.c_int64 * 12).from_address(struct_ptr)).copy()
        self.launches.append(("slot", fn, gx, bx, smem, stream, params, words))

    def launch_kernel(self, fn, grid, threads, stream, params, smem=0):
        (struct_ptr,) = (ctypes.c_void_p * 1).from_address(params)
        words = np.ctypeslib.as_array((ctypes.c_int64 * 12).from_address(struct_ptr)).copy()
        self.launches.append(("plain", fn, grid, threads, stream, words))

    def graph_launch(self, exec_, stream):
        self.launches.append(("graph", exec_, stream))

    def make_current(self):
        pass


def _layout(fake_gpu, parts: int, block: int = 4096):
    def gpu(name):
        return fake_gpu.part(np.zeros((64, block), np.uint8), name)

    return resolve_layout(
        layout_from_parts([gpu("s") for _ in range(parts)], [gpu("d") for _ in range(parts)]), 0
    )


def test_a_slot_launch_points_at_its_slot_and_sets_nothing_per_call(fake_gpu):
    lau = _Launcher()
    layout = _layout(fake_gpu, 2)
    bound = BoundKernel(lau, layout)
    bound.launch_slot(1, stream=9)
    bound.launch_slot(1, stream=10)  # the same slot again: the same parameter, on another stream
    bound.launch_slot(0, stream=9)
    assert [(s[5], s[6]) for s in lau.launches][:2] == [(9, lau.launches[0][6]), (10, lau.launches[0][6])]
    assert lau.launches[2][6] != lau.launches[0][6]  # each slot its own parameter
    ring = lau.slots
    for (_, fn, grid, threads, smem, _, _, words), i in zip(lau.launches, (1, 1, 0)):
        rows = ring.aliases[i] + 8 * abi.CONTROL_WORDS
        assert fn == 0xF00 and (grid, threads) == launch_shape(ring.capacity * layout.units_per_pair, 8)
        assert smem == abi.check_shared_bytes(ring.capacity)  # the check of a full slot fits
        assert words[0] == ring.capacity  # the rows the launch may read
        assert words[5] == words[6] == 0  # count, status and number come from the control record
        assert words[7] == ring.arrivals[i]
        assert words[8:12].tolist() == [rows, rows + 8, 2, ring.aliases[i]]


def test_a_new_cta_budget_changes_the_grid(fake_gpu):
    lau = _Launcher()
    bound = BoundKernel(lau, _layout(fake_gpu, 1, block=1 << 20))
    bound.launch_slot(0, stream=1)
    lau.max_ctas = 2
    bound.launch_slot(0, stream=1)
    assert lau.launches[0][2] > 2 and lau.launches[1][2] <= 2


@pytest.fixture
def graphs(monkeypatch):
    """The graphs the builder thread makes: ``(fn, grid, threads, smem,
    header and index words as the driver copies them)``; exec handles
    0x200 + k; destroyed ones recorded in ``graphs.destroyed``."""
    from cupy_swap.cuda import graph_builder, release

    gc.collect()  # earlier tests' ops released first: their graphs are not this test's
    assert release.drain(5)
    made: list = []

    def kernel_graph(fn, grid, threads, smem, args_ptr):
        (struct_ptr,) = (ctypes.c_void_p * 1).from_address(args_ptr)
        words = np.ctypeslib.as_array((ctypes.c_int64 * 12).from_address(struct_ptr)).copy()
        made.append((fn, grid, threads, smem, words))
        return 0x100 + len(made), 0x200 + len(made)

    destroyed: list = []
    monkeypatch.setattr(graph_builder, "BUILD_AFTER", 8)  # slot graphs on (off by default)
    monkeypatch.setattr(graph_builder, "kernel_graph", kernel_graph)
    monkeypatch.setattr(graph_builder, "destroy_graphs", lambda device, built: destroyed.extend(built) or 0)
    monkeypatch.setattr(graph_builder, "_prewarmed", {0: True})
    monkeypatch.setattr(graph_builder, "_live", [0])
    made_list = type("Made", (list,), {})()
    made_list.made, made_list.destroyed = made, destroyed
    yield made_list
    gc.collect()  # this test's ops released while the fakes stand in
    assert graph_builder.builder.drain(5) and release.drain(5)


def test_an_op_launches_plainly_until_its_graphs_are_built_off_the_call_path(fake_gpu, graphs):
    """Issue 38 (NOTES 61): a graph build can wait for the whole device, so
    no call builds one; after BUILD_AFTER calls the builder thread builds one
    per slot, each pointing at its slot, and later calls launch them."""
    from cupy_swap.cuda import graph_builder

    lau = _Launcher()
    bound = BoundKernel(lau, _layout(fake_gpu, 1))
    for k in range(graph_builder.BUILD_AFTER - 1):
        bound.launch_slot(k % 3, stream=5)
    assert graph_builder.builder.drain(5) and graphs.made == []  # not asked for yet
    bound.launch_slot(0, stream=5)  # the BUILD_AFTER-th call: the builder is asked
    assert graph_builder.builder.drain(5) and len(graphs.made) == 3
    assert all(launch[0] == "slot" for launch in lau.launches)  # every call so far plain
    ring = lau.slots
    for i, (fn, _, _, _, words) in enumerate(graphs.made):
        rows = ring.aliases[i] + 8 * abi.CONTROL_WORDS
        assert fn == 0xF00 and words[7] == ring.arrivals[i]
        assert words[8:12].tolist() == [rows, rows + 8, 2, ring.aliases[i]]
    lau.launches.clear()
    bound.launch_slot(1, stream=6)
    assert lau.launches == [("graph", 0x202, 6)]
    lau.max_ctas = 2  # another CTA budget: plain launches until the graphs of it are built
    bound.launch_slot(1, stream=6)
    assert lau.launches[-1][0] == "slot"


def test_a_dropped_op_destroys_its_graphs(fake_gpu, graphs):
    from cupy_swap.cuda import graph_builder, release

    lau = _Launcher()
    bound = BoundKernel(lau, _layout(fake_gpu, 1))
    for k in range(graph_builder.BUILD_AFTER):
        bound.launch_slot(k % 3, stream=5)
    assert graph_builder.builder.drain(5)
    del bound
    assert release.drain(5)
    assert sorted(graphs.destroyed) == [(0x101, 0x201), (0x102, 0x202), (0x103, 0x203)]


def test_slot_graphs_are_off_by_default():
    """NOTES 72: a build past the prewarmed high-water mark of executables
    can wait for a busy device and hold the process's launches meanwhile;
    graphs are opt-in (CUPY_SWAP_SLOT_GRAPHS=1)."""
    import os
    import subprocess
    import sys

    code = "from cupy_swap.cuda import graph_builder as g; print(g.BUILD_AFTER)"
    env = {k: v for k, v in os.environ.items() if k != "CUPY_SWAP_SLOT_GRAPHS"}

    def build_after(**extra) -> list:
        run = subprocess.run(
            [sys.executable, "-c", code], env={**env, **extra}, capture_output=True, text=True
        )
        return run.stdout.split()

    assert build_after() == ["0"] and build_after(CUPY_SWAP_SLOT_GRAPHS="1") == ["8"]


def test_a_failed_graph_build_leaves_the_op_on_plain_launches(fake_gpu, monkeypatch):
    from cupy_swap.cuda import graph_builder

    monkeypatch.setattr(graph_builder, "BUILD_AFTER", 8)  # slot graphs on (off by default)

    def refuses(*args):
        raise RuntimeError("cudaGraphInstantiate failed")

    monkeypatch.setattr(graph_builder, "kernel_graph", refuses)
    monkeypatch.setattr(graph_builder, "_prewarmed", {0: True})
    monkeypatch.setattr(graph_builder, "_live", [0])
    lau = _Launcher()
    bound = BoundKernel(lau, _layout(fake_gpu, 1))
    with pytest.warns(UserWarning, match="slot graphs could not be built .cudaGraphInstantiate failed"):
        for k in range(graph_builder.BUILD_AFTER):
            bound.launch_slot(k % 3, stream=5)
        assert graph_builder.builder.drain(5)
    for k in range(3 * graph_builder.BUILD_AFTER):
        bound.launch_slot(k % 3, stream=5)
    assert all(launch[0] == "slot" for launch in lau.launches)


def test_no_call_raises_after_its_launch_was_enqueued(fake_gpu, graphs, monkeypatch):
    """Review of issue 38: the builder could not be asked (no thread could be
    started) after the launch was enqueued; the caller then gave back a slot
    a queued kernel reads.  Now the call returns and launches stay plain;
    a graph launch that fails falls back to a plain one."""
    from cupy_swap.cuda import graph_builder

    def cannot(bound):
        raise RuntimeError("can't start new thread")

    lau = _Launcher()
    bound = BoundKernel(lau, _layout(fake_gpu, 1))
    monkeypatch.setattr(graph_builder.builder, "request", cannot)
    with pytest.warns(UserWarning, match="builder could not be asked .can't start new thread"):
        for k in range(graph_builder.BUILD_AFTER):
            bound.launch_slot(k % 3, stream=5)
    assert len(lau.launches) == graph_builder.BUILD_AFTER and bound._execs is None
    monkeypatch.undo()
    monkeypatch.setattr(graph_builder, "BUILD_AFTER", 8)
    monkeypatch.setattr(graph_builder, "_prewarmed", {0: True})
    monkeypatch.setattr(graph_builder, "_live", [0])
    monkeypatch.setattr(graph_builder, "kernel_graph", lambda *args: (0x100, 0x200))
    monkeypatch.setattr(graph_builder, "destroy_graphs", lambda device, built: 0)  # made-up handles
    other = BoundKernel(lau, _layout(fake_gpu, 1))
    for k in range(graph_builder.BUILD_AFTER):
        other.launch_slot(k % 3, stream=5)
    assert graph_builder.builder.drain(5) and other._execs is not None

    def broken(exec_, stream):
        raise RuntimeError("cudaGraphLaunch failed")

    lau.graph_launch = broken
    lau.launches.clear()
    with pytest.warns(UserWarning, match="a graph launch failed"):
        other.launch_slot(1, stream=6)
    assert [launch[0] for launch in lau.launches] == ["slot"] and other._execs is None


def test_a_warning_made_an_error_never_raises_after_the_launch_was_enqueued(fake_gpu, graphs, monkeypatch):
    """Second review of issue 38: with warnings as errors (``-W error``) the
    one warning that the builder could not be asked raised after the launch
    was enqueued; the caller then gave back a slot a queued kernel reads."""
    import warnings

    from cupy_swap.cuda import graph_builder

    def cannot(bound):
        raise RuntimeError("can't start new thread")

    lau = _Launcher()
    bound = BoundKernel(lau, _layout(fake_gpu, 1))
    monkeypatch.setattr(graph_builder.builder, "request", cannot)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for k in range(graph_builder.BUILD_AFTER + 2):
            bound.launch_slot(k % 3, stream=5)
    assert len(lau.launches) == graph_builder.BUILD_AFTER + 2 and bound._execs is None


def test_a_captured_launch_keeps_rows_of_its_own(fake_gpu, monkeypatch):
    """A captured swap's rows live in pinned words of its own, kept for the
    process (a replay may run at any time); the launch reads them there."""
    from cupy_swap.cuda import memory, release

    kept: list = []
    monkeypatch.setattr(memory, "zeros_pinned_for_gpu", lambda shape, dtype, device: np.zeros(shape, dtype))
    monkeypatch.setattr(memory, "host_alias", lambda ptr, nbytes: 0xA000)
    monkeypatch.setattr(release, "keep_for_process", kept.append)
    lau = _Launcher()
    BoundKernel(lau, _layout(fake_gpu, 1)).launch_captured([3, 4, 5, 6], 2, stream=7)
    (words,) = kept
    assert words[0] == 2 and words[abi.CONTROL_WORDS :].tolist() == [3, 4, 5, 6]
    _, fn, grid, threads, stream, params = lau.launches[0]
    assert stream == 7 and params[0] == 2 and params[7] == 0  # no done word: a replay frees nothing
    assert params[8:12].tolist() == [0xA000 + 64, 0xA000 + 72, 2, 0xA000]


class _RingLauncher:
    """A Launcher's descriptor methods over plain NumPy slots (no CUDA)."""

    from cupy_swap.cuda.launcher import Launcher

    write_slot = Launcher.write_slot
    acquire = Launcher.acquire
    _free_slot = Launcher._free_slot
    _ring = Launcher._ring

    def __init__(self, slots: int = 1):
        import threading
        import types

        self._lock = threading.Lock()
        self._next, self.ring_waits = 0, 0
        self._finalizer = types.SimpleNamespace(alive=True)
        words = np.zeros(abi.descriptor_words(2, 64), np.int64)
        self._slots = [
            types.SimpleNamespace(
                lock=threading.Lock(),
                host_words=words.copy(),
                table_serial=-1,
                event=None,
                device_ptr=0,
                device_args="dev",
            )
            for _ in range(slots)
        ]

    def upload(self, slot, dst_ptr, words, stream):
        pass


def test_an_interrupted_descriptor_write_leaves_no_table_marked_current(monkeypatch, fake_gpu):
    """The slot's table tag was once set after the write: a write of layout
    B's table cut short left B's partial table tagged as layout A's, and
    A's next swap reused it without rewriting."""
    lau = _RingLauncher()
    a, b = _layout(fake_gpu, 2), _layout(fake_gpu, 2, block=8192)
    a.serial, b.serial = 1, 2
    held: list = []
    lau.write_slot(a, [1, 2], 0, held)
    held.pop().lock.release()
    real = abi.write_descriptor

    def interrupted(out, layout, mapping, include_table):
        out[abi.HEADER_WORDS] = -1  # the first word of B's table went in, then the interrupt
        raise KeyboardInterrupt

    monkeypatch.setattr(launcher_module.abi, "write_descriptor", interrupted)
    with pytest.raises(KeyboardInterrupt):
        lau.write_slot(b, [3, 4], 0, held)
    held.pop().lock.release()
    monkeypatch.setattr(launcher_module.abi, "write_descriptor", real)
    lau.write_slot(a, [5, 6], 0, held)  # A again: the table must be written afresh
    words = lau._slots[0].host_words
    assert words[abi.HEADER_WORDS : abi.HEADER_WORDS + a.table.size].tolist() == a.table.tolist()


def test_a_swap_that_gets_its_slot_after_close_raises_and_frees_the_slot():
    """close() once raced a swap that had passed the closed check: the ring
    was freed while that swap wrote and launched over a slot."""
    lau = _RingLauncher()
    slot = lau._slots[0]
    slot.lock.acquire()  # another swap holds the slot ...
    held: list = []
    outcome = []

    def swap():
        try:
            lau.acquire(held)
            outcome.append("acquired")
        except RuntimeError as e:
            outcome.append(str(e))

    t = threading.Thread(target=swap)
    t.start()
    lau._finalizer.alive = False  # ... while close() runs
    slot.lock.release()
    t.join(10)
    assert outcome and "closed" in outcome[0]
    assert held == [] and not slot.lock.locked()


class _Event:
    """A slot's event: done after ``queries`` queries, each recorded with the
    capture mode it was asked in."""

    def __init__(self, calls: list, mode: list, queries: int = 0):
        self.calls, self.mode, self.left = calls, mode, queries

    @property
    def done(self):
        self.calls.append(("query", self.mode[0]))
        self.left -= 1
        return self.left < 0


@pytest.fixture
def capture_modes(monkeypatch):
    """The thread's capture mode as the stand-in driver keeps it (0: global)."""
    from cupy_swap.cuda import capture

    mode = [0]

    def exchange(new):
        old, mode[0] = mode[0], new
        return old

    monkeypatch.setattr(capture, "exchange", exchange)
    return mode


def test_a_slot_is_queried_in_relaxed_capture_mode(capture_modes):
    """Review finding: ``acquire`` queried (and waited for) the slot's last
    event in the thread's own capture mode; in global mode that breaks
    another thread's capture.  Every query now runs relaxed."""
    from cupy_swap.cuda import capture

    lau, calls = _RingLauncher(), []
    for queries in (0, 3):  # done at once; done after three looks (the ring was full)
        lau._slots[0].event = _Event(calls, capture_modes, queries)
        held: list = []
        lau.acquire(held)
        held.pop().lock.release()
    assert calls == [("query", capture.RELAXED)] * 5
    assert capture_modes[0] == 0 and lau.ring_waits == 1


def test_a_swap_takes_a_free_slot_rather_than_wait_for_a_busy_one(capture_modes):
    """Finding 7 of issue 32: strict round robin made a swap wait for the
    next slot's event (a swap queued behind a 2 s kernel of another stream)
    while 15 slots were free."""
    lau, calls = _RingLauncher(slots=4), []
    lau._slots[0].event = _Event(calls, capture_modes, queries=10**9)  # behind a long kernel
    taken = []
    for _ in range(6):
        held: list = []
        taken.append(lau._slots.index(lau.acquire(held)))
        held.pop().lock.release()
    assert 0 not in taken and lau.ring_waits == 0


def test_with_every_slot_busy_a_swap_takes_the_first_to_free(capture_modes):
    lau, calls = _RingLauncher(slots=3), []
    lau._slots[0].event = _Event(calls, capture_modes, queries=10**9)
    lau._slots[1].event = _Event(calls, capture_modes, queries=10**9)
    lau._slots[2].event = _Event(calls, capture_modes, queries=2)  # the last in ring order frees first
    held: list = []
    assert lau.acquire(held) is lau._slots[2] and lau.ring_waits == 1


def test_a_kept_gpu_mapping_is_held_first_and_released_by_relaxed_queries(capture_modes):
    """Finding 6 of issue 32: keep_until_done queried the previous swap's
    event in global mode (breaking another thread's capture) and could
    raise after the kernel launched, before holding the mapping it reads."""
    import collections
    import types

    from cupy_swap.cuda import capture
    from cupy_swap.cuda.launcher import Launcher

    calls: list = []
    lau = types.SimpleNamespace(_kept=collections.deque(), _kept_lock=threading.Lock())
    done = _Event(calls, capture_modes)
    Launcher.keep_until_done(lau, done, "first")
    Launcher.keep_until_done(lau, _Event(calls, capture_modes, queries=10), "second")
    assert [k for _, k in lau._kept] == ["second"] and calls == [("query", capture.RELAXED)]

    class Broken:
        @property
        def done(self):
            raise RuntimeError("cudaErrorIllegalAddress")

    lau._kept.appendleft((Broken(), "broken"))
    Launcher.keep_until_done(lau, done, "third")  # never raises: it keeps what it cannot query
    assert [k for _, k in lau._kept] == ["broken", "second", "third"]


def test_prewarm_makes_and_destroys_its_executables_once_per_gpu(monkeypatch):
    """The driver's first wait for the device (past about 32 live
    executables, NOTES 71-72) is paid by prewarm, once per process and GPU."""
    from cupy_swap.cuda import graph_builder

    made, destroyed = [], []
    monkeypatch.setattr(graph_builder, "_prewarmed", {})
    monkeypatch.setattr(graph_builder, "kernel_graph", lambda *a: made.append(a) or (len(made), -len(made)))
    monkeypatch.setattr(graph_builder, "destroy_graphs", lambda device, built: destroyed.extend(built) or 0)
    assert graph_builder.prewarm(3, 0xF00, 0x1234) is True
    n = graph_builder.PREWARM_EXECS
    assert n > 32 and len(made) == n and {a[0] for a in made} == {0xF00} and {a[-1] for a in made} == {0x1234}
    assert sorted(destroyed) == sorted((k, -k) for k in range(1, n + 1))  # every one destroyed
    assert graph_builder.prewarm(3, 0xF00, 0x1234) is True and len(made) == n  # once per GPU
    assert graph_builder.prewarm(4, 0xF00, 0x1234) is True and len(made) == 2 * n


def test_a_failed_prewarm_destroys_what_it_made_and_keeps_slot_graphs_off(monkeypatch):
    from cupy_swap.cuda import graph_builder

    made, destroyed = [], []

    def kernel_graph(*args):
        if len(made) == 40:
            raise RuntimeError("cudaErrorMemoryAllocation")
        made.append(args)
        return len(made), -len(made)

    monkeypatch.setattr(graph_builder, "_prewarmed", {})
    monkeypatch.setattr(graph_builder, "kernel_graph", kernel_graph)
    monkeypatch.setattr(graph_builder, "destroy_graphs", lambda device, built: destroyed.extend(built) or 0)
    with pytest.warns(UserWarning, match=r"slot graphs off on GPU 0: cudaErrorMemoryAllocation"):
        assert graph_builder.prewarm(0, 0xF00, 0x1234) is False
    assert len(destroyed) == 40
    assert graph_builder.prewarm(0, 0xF00, 0x1234) is False and len(made) == 40  # not tried again


def test_an_op_never_asks_for_graphs_where_the_prewarm_failed(fake_gpu, graphs):
    from cupy_swap.cuda import graph_builder

    lau = _Launcher()
    lau.graphs_ok = False
    bound = BoundKernel(lau, _layout(fake_gpu, 1))
    for _ in range(graph_builder.BUILD_AFTER + 2):
        bound.launch_slot(0, stream=1)
    assert graph_builder.builder.drain(5)
    assert graphs.made == [] and bound._execs is None


def test_slot_graphs_stay_below_the_prewarmed_mark(fake_gpu, graphs, monkeypatch):
    """NOTES 72: past the mark prewarm set, an instantiate waits for a busy
    device; an op that would pass it launches plainly and asks again later,
    and a dropped op's graphs give their room back."""
    from cupy_swap.cuda import graph_builder, release

    monkeypatch.setattr(graph_builder, "PREWARM_EXECS", 6)  # two rings of 3
    monkeypatch.setattr(graph_builder, "RETRY_AFTER", 4)
    lau = _Launcher(ring_size=3)
    ops = [BoundKernel(lau, _layout(fake_gpu, 1)) for _ in range(3)]
    for op in ops:
        for _ in range(graph_builder.BUILD_AFTER):
            op.launch_slot(0, stream=1)
    assert graph_builder.builder.drain(5)
    assert [op._execs is not None for op in ops] == [True, True, False]
    assert len(graphs.made) == 6 and graph_builder._live == [6]
    ops[2].launch_slot(0, stream=1)
    assert lau.launches[-1][0] == "slot"  # the third stays plain
    del ops[0]
    gc.collect()
    assert release.drain(5)
    assert len(graphs.destroyed) == 3 and graph_builder._live == [3]
    for _ in range(graph_builder.RETRY_AFTER + graph_builder.BUILD_AFTER):  # it asks again
        ops[1].launch_slot(0, stream=1)
    assert graph_builder.builder.drain(5)
    assert ops[1]._execs is not None and graph_builder._live == [6]


def test_only_destroyed_slot_graphs_give_their_room_back(monkeypatch):
    from cupy_swap.cuda import graph_builder

    monkeypatch.setattr(graph_builder, "_live", [5])
    monkeypatch.setattr(graph_builder, "destroy_graphs", lambda device, built: 2)  # two refused
    with pytest.raises(RuntimeError, match="2 of 5 slot graphs could not be destroyed"):
        graph_builder.destroy_slot_graphs(0, [(1, 2)] * 5)
    assert graph_builder._live == [2]  # still allocated: still counted


def test_a_gpu_without_a_prewarm_builds_no_slot_graph(fake_gpu, graphs, monkeypatch):
    from cupy_swap.cuda import graph_builder

    monkeypatch.setattr(graph_builder, "_prewarmed", {0: False})
    lau = _Launcher()
    op = BoundKernel(lau, _layout(fake_gpu, 1))
    for _ in range(graph_builder.BUILD_AFTER):
        op.launch_slot(0, stream=1)
    assert graph_builder.builder.drain(5)
    assert op._execs is None and graphs.made == [] and graph_builder._live == [0]


def test_a_new_cta_budget_destroys_the_old_shapes_graphs_after_their_launches(fake_gpu, graphs):
    """Review of issue 38: graphs of an old launch shape kept their room
    until the op was dropped, so one max_ctas change could leave every op
    on plain launches."""
    from cupy_swap.cuda import graph_builder, release

    lau = _Launcher(ring_size=3)
    bound = BoundKernel(lau, _layout(fake_gpu, 1))
    for _ in range(graph_builder.BUILD_AFTER):
        bound.launch_slot(0, stream=1)
    assert graph_builder.builder.drain(5) and bound._execs is not None and graph_builder._live == [3]
    i = lau.slots.take()  # a launch of the old shape still running
    lau.slots.launched(i, 7)
    lau.max_ctas = 2
    bound.launch_slot(1, stream=1)  # reshaped: plain, old graphs handed to the releaser
    assert bound._execs is None and bound._graphs == []
    assert not release.drain(0.2) and graphs.destroyed == []  # behind the running launch
    lau.slots.words[i, 3] = 7  # its done word: finished
    assert release.drain(5) and len(graphs.destroyed) == 3 and graph_builder._live == [0]


def test_graphs_of_a_failed_build_are_destroyed_and_their_room_given_back(fake_gpu, graphs, monkeypatch):
    from cupy_swap.cuda import graph_builder, release

    made = []

    def second_fails(fn, grid, threads, smem, args_ptr):
        if made:
            raise RuntimeError("cudaErrorMemoryAllocation")
        made.append(fn)
        return 0x101, 0x201

    monkeypatch.setattr(graph_builder, "kernel_graph", second_fails)
    lau = _Launcher(ring_size=3)
    bound = BoundKernel(lau, _layout(fake_gpu, 1))
    with pytest.warns(UserWarning, match="slot graphs could not be built"):
        for _ in range(graph_builder.BUILD_AFTER):
            bound.launch_slot(0, stream=1)
        assert graph_builder.builder.drain(5)
    assert release.drain(5)
    assert bound._execs is None and bound._graphs == [] and graphs.destroyed == [(0x101, 0x201)]
    assert graph_builder._live == [0]


def test_a_forked_child_gets_the_builders_locks_free():
    """A fork while another thread held a graph_builder lock would leave the
    child a lock nobody releases."""
    import os

    from cupy_swap.cuda import graph_builder

    with graph_builder.builder._lock, graph_builder._live_lock:
        pid = os.fork()
        if pid == 0:  # the child: both locks must be free
            taken = graph_builder.builder._lock.acquire(timeout=5) and graph_builder._live_lock.acquire(
                timeout=5
            )
            os._exit(0 if taken else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
