"""The inline launch (cupy_swap/cuda/launcher.py BoundKernel) on the CPU: a
stand-in launcher reads the parameter struct at the moment of each launch,
as the driver does, and checks tier choice, contents and laziness (over
parts that claim to be GPU memory: the ``fake_gpu`` fixture)."""

import ctypes
import threading

import numpy as np
import pytest

from cupy_swap.core.layout import layout_from_parts
from cupy_swap.cuda import abi
from cupy_swap.cuda.launcher import BoundKernel, launch_shape
from cupy_swap.cuda.resolve import resolve_layout

CLASSIC_TIERS = [t for t in abi.TIERS if 8 * t.words <= 4096]  # what CUDA < 12.1 compiles


class _Launcher:
    def __init__(self, tiers=abi.TIERS):
        self.max_ctas, self.max_inline_pairs = 8, max(t.pairs for t in abi.TIERS)
        self.slots_mapped = False  # no ring here: inline launches only
        self.tiers, self.looked_up, self.launches = tiers, [], []
        self.inline_lock = threading.Lock()

    def inline_tiers(self, width):
        self.looked_up.append(width)
        return list(self.tiers)

    def function(self, name):
        return name  # stands for the CUfunction handle

    def launch_inline(self, fn, grid, threads, stream, params, capturing, smem=0):
        assert self.inline_lock.locked()  # the parameter buffer is written and read under it
        (struct_ptr,) = (ctypes.c_void_p * 1).from_address(params)
        tier = next(
            t for t in abi.TIERS if abi.inline_kernel(16, t) == fn or fn.endswith(f"_p{t.parts}_n{t.pairs}")
        )
        words = np.ctypeslib.as_array((ctypes.c_int64 * tier.words).from_address(struct_ptr)).copy()
        self.launches.append((fn, grid, threads, stream, words, tier))
        self.smem = smem


def _layout(fake_gpu, parts: int, block: int = 4096):
    def gpu(name):
        return fake_gpu.part(np.zeros((64, block), np.uint8), name)

    return resolve_layout(
        layout_from_parts([gpu("s") for _ in range(parts)], [gpu("d") for _ in range(parts)]), 0
    )


def test_struct_at_launch_holds_header_table_and_pairs(fake_gpu):
    layout = _layout(fake_gpu, 2)
    lau = _Launcher()
    bound = BoundKernel(lau, layout)
    assert lau.looked_up == []  # nothing compiled until the first launch
    assert bound.launch([1, 2, 3, 4], 2, 9, False)
    assert bound.launch(np.array([[5, 6]], np.int64), 1, 9, False)
    for (fn, grid, threads, stream, words, tier), pairs in zip(lau.launches, ([1, 2, 3, 4], [5, 6])):
        assert tier == abi.TIERS[0] and fn == abi.inline_kernel(layout.width, tier) and stream == 9
        n = len(pairs) // 2
        assert words[:3].tolist() == [n, 2, layout.units_per_pair]
        assert (
            words[abi.HEADER_WORDS : abi.HEADER_WORDS + layout.table.size].tolist() == layout.table.tolist()
        )
        at = abi.HEADER_WORDS + tier.parts * abi.PART_WORDS
        assert words[at : at + 2 * n].tolist() == pairs
        assert (grid, threads) == launch_shape(n * layout.units_per_pair, 8)
        assert words[3:7].tolist() == [64, 64, 0, 0]  # the check's bounds; status 0: no check
        assert lau.smem == 0


def test_a_checked_launch_carries_its_status_record_and_number(fake_gpu):
    layout = _layout(fake_gpu, 1)
    lau = _Launcher()
    assert BoundKernel(lau, layout).launch([1, 2, 3, 4, 5, 6], 3, 9, False, status=0x7000, seq=42)
    words = lau.launches[-1][4]
    assert words[:7].tolist() == [3, 1, layout.units_per_pair, 64, 64, 0x7000, 42]
    assert lau.smem == abi.check_shared_bytes(3) == 64 + 24  # 8 slots of 8 bytes (2 a row at least), 3 rows


@pytest.mark.parametrize(
    "parts, n, tier",
    [
        (1, 16, abi.Tier(4, 16)),
        (1, 17, abi.Tier(16, 192)),
        (4, 193, abi.Tier(64, 1792)),
        (5, 3, abi.Tier(16, 192)),
        (17, 1, abi.Tier(64, 16)),  # a short swap of many parts: the small parameter
        (64, 16, abi.Tier(64, 16)),
        (64, 17, abi.Tier(64, 1792)),
        (65, 1, abi.Tier(256, 1024)),
        (256, 1024, abi.Tier(256, 1024)),
    ],
)
def test_smallest_tier_that_holds_the_swap(parts, n, tier, fake_gpu):
    lau = _Launcher()
    rng = np.random.default_rng(n)
    m = np.column_stack((rng.permutation(64)[: min(n, 64)],) * 2) if n <= 64 else None
    pairs = m if m is not None else np.zeros((n, 2), np.int64)
    assert BoundKernel(lau, _layout(fake_gpu, parts)).launch(pairs, n, 0, False)
    assert lau.launches[-1][5] == tier


def test_too_large_or_turned_off_goes_to_the_ring(fake_gpu):
    lau = _Launcher()
    assert not BoundKernel(lau, _layout(fake_gpu, 65)).launch(np.zeros((1025, 2), np.int64), 1025, 0, False)
    assert not BoundKernel(lau, _layout(fake_gpu, 1)).launch(np.zeros((1793, 2), np.int64), 1793, 0, False)
    lau.max_inline_pairs = 0
    assert not BoundKernel(lau, _layout(fake_gpu, 1)).launch([0, 0], 1, 0, False)
    old = _Launcher(tiers=CLASSIC_TIERS)  # a compiler without parameters over 4 KiB
    bound = BoundKernel(old, _layout(fake_gpu, 1))
    assert not bound.launch(np.zeros((193, 2), np.int64), 193, 0, False) and bound.max_pairs == 192
    assert lau.launches == [] and old.launches == []


def test_launch_shape_follows_the_budget(fake_gpu):
    lau = _Launcher()
    bound = BoundKernel(lau, _layout(fake_gpu, 1, block=32768))
    m = np.zeros((1250, 2), np.int64)
    bound.launch(m, 1250, 0, False)
    lau.max_ctas = 4
    bound.launch(m, 1250, 0, False)
    assert [x[1] for x in lau.launches] == [8, 4]


def test_a_thread_that_sees_the_tiers_never_sees_a_larger_bound(fake_gpu):
    """On a compiler without parameters over 4 KiB the first launch lowers
    ``max_pairs`` from the largest tier to the largest this GPU has.  The
    tiers were once published before the bound was lowered: a second
    thread in between passed the bound check, found no tier large enough
    and wrote 193 pairs into a 192-pair buffer (ValueError)."""
    old = _Launcher(tiers=CLASSIC_TIERS)
    bound = BoundKernel(old, _layout(fake_gpu, 1))
    # The state another thread could observe between the two stores.
    bound._tiers = [[t, None] for t in CLASSIC_TIERS]
    bound.max_pairs = max(t.pairs for t in abi.TIERS)
    assert not bound.launch(np.zeros((193, 2), np.int64), 193, 0, False)  # the ring takes it
    assert old.launches == []


class _RingLauncher:
    """A Launcher's descriptor methods over plain NumPy slots (no CUDA)."""

    from cupy_swap.cuda.launcher import Launcher

    write_slot = Launcher.write_slot
    acquire = Launcher.acquire
    _free_slot = Launcher._free_slot

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
    from cupy_swap.cuda import launcher as launcher_module

    lau = _RingLauncher()
    a, b = _layout(fake_gpu, 2), _layout(fake_gpu, 2, block=8192)
    a.serial, b.serial = 1, 2
    held: list = []
    lau.write_slot(a, [1, 2], 0, False, held)
    held.pop().lock.release()
    real = abi.write_descriptor

    def interrupted(out, layout, mapping, include_table, status, seq):
        out[abi.HEADER_WORDS] = -1  # the first word of B's table went in, then the interrupt
        raise KeyboardInterrupt

    monkeypatch.setattr(launcher_module.abi, "write_descriptor", interrupted)
    with pytest.raises(KeyboardInterrupt):
        lau.write_slot(b, [3, 4], 0, False, held)
    held.pop().lock.release()
    monkeypatch.setattr(launcher_module.abi, "write_descriptor", real)
    lau.write_slot(a, [5, 6], 0, False, held)  # A again: the table must be written afresh
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


def test_a_kernel_node_launch_sets_the_nodes_parameters_then_launches():
    """``KernelNode.launch_one`` (the eager inline path) writes grid, CTA
    size and parameter pointer into the node's struct before the driver
    reads it, then launches the graph once; a refused update raises before
    any launch."""
    from cupy_swap.cuda.driver import KernelNodeParams
    from cupy_swap.cuda.launcher import KernelNode

    calls, status = [], [0]
    node = KernelNode.__new__(KernelNode)
    node.params = KernelNodeParams(7, 1, 1, 1, 32, 1, 1, 0, None, None)
    node.exec = 99
    node._args = ("exec", "node", "params")

    def set_params(exec_, n, ptr):
        p = node.params
        calls.append(("set", n, p.gridDimX, p.blockDimX, p.kernelParams))
        return status[0]

    node._set, node._launch = set_params, lambda e, s: calls.append(("launch", e, s))
    node.launch_one(8, 1024, 4096, stream=5)
    assert calls == [("set", "node", 8, 1024, 4096), ("launch", 99, 5)]
    status[0], calls[:] = 1, []
    with pytest.raises(RuntimeError, match="cuGraphExecKernelNodeSetParams"):
        node.launch_one(4, 256, 8192, stream=5)
    assert calls == [("set", "node", 4, 256, 8192)]  # nothing launched


def test_launch_inline_uses_the_streams_node_and_launches_plainly_while_capturing():
    """An eager launch goes to its stream's kernel node (built on first use);
    while the stream captures, or once no node can be built (a closed
    launcher), the kernel is launched plainly so the capture records it."""
    from cupy_swap.cuda.launcher import Launcher

    launched = []

    class Node:
        def __init__(self, key):
            self.key = key

        def launch_one(self, grid, threads, params, stream, smem):
            launched.append(("node", self.key, grid, threads, params, stream))

    lau = Launcher.__new__(Launcher)
    lau._nodes, can_build = {}, [True]
    lau._launch = lambda fn, g, _y, _z, t, _by, _bz, _sm, stream, params, _extra: launched.append(
        ("plain", fn, g, t, params, stream)
    )

    def new_node(fn, grid, threads, params, stream):
        if not can_build[0]:
            return None
        key = (fn, stream)
        lau._nodes[key] = Node(key)
        launched.append(("built", key))
        return lau._nodes[key]

    lau._new_node = new_node
    lau.launch_inline("fn", 8, 1024, stream=5, params=111, capturing=False)
    lau.launch_inline("fn", 4, 256, stream=5, params=222, capturing=False)
    lau.launch_inline("fn", 2, 64, stream=5, params=333, capturing=True)
    can_build[0] = False
    lau._nodes.clear()  # what closing the launcher does
    lau.launch_inline("fn", 1, 32, stream=6, params=444, capturing=False)
    assert launched == [
        ("built", ("fn", 5)),
        ("node", ("fn", 5), 8, 1024, 111, 5),  # the first launch builds the node, then uses it
        ("node", ("fn", 5), 4, 256, 222, 5),
        ("plain", "fn", 2, 64, 333, 5),  # capturing: never the node
        ("plain", "fn", 1, 32, 444, 6),  # no node to be had
    ]


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
