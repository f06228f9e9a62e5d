"""The launcher (cupy_swap/cuda/launcher.py) on the CPU: a slot launch's
parameter is made once per op and slot, points at that slot, and is
launched as it is; the descriptor ring's slots are taken and freed by the
queueing rule (over parts that claim to be GPU memory: ``fake_gpu``)."""

import ctypes
import threading
import types

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


def test_gpu_rows_are_held_by_their_slot_until_it_is_written_again(capture_modes):
    """A GPU mapping's arrays (a temporary index tensor, say) are read by
    the launch: its slot holds them until the slot is written again, which
    is only after that launch's kernel said it finished, or given back
    (nothing launched), and drops them in relaxed capture mode.  (This
    replaces the launcher's event-queried keep list.)"""
    import gc
    import weakref

    from cupy_swap.cuda import capture
    from cupy_swap.cuda.gpu_mapping import DeviceRows
    from cupy_swap.cuda.slots import DST_INDEX, INDEX_STEP, N_PAIRS, SRC_INDEX

    from .fakes import fake_ring, land

    class Rows:  # stands for the caller's index arrays; dropped: in which capture mode
        def __del__(self):
            modes.append(capture_modes[0])

    modes: list = []

    class Event:
        check = seq = slot = path = nbytes = None

    layout = types.SimpleNamespace(bytes_per_pair=64)
    ring = fake_ring(size=1)
    first, second = Rows(), Rows()
    i = ring.take()
    seq = ring.write_gpu(i, DeviceRows(0x10, 0x18, 2, 3, first), 3, (None, layout, None), Event())
    control = ring.controls[i]
    assert (control[SRC_INDEX], control[DST_INDEX], control[INDEX_STEP], control[N_PAIRS]) == (
        0x10,
        0x18,
        2,
        3,
    )
    ring.launched(i, seq)
    gone = weakref.ref(first)
    del first
    gc.collect()
    assert gone() is not None  # the launch may still read them
    land(ring, seq)
    j = ring.take()  # free again only now: its kernel finished
    ring.write_gpu(j, DeviceRows(0x20, 0x28, 1, 1, second), 1, (None, layout, None), Event())
    gc.collect()
    assert j == i and gone() is None
    kept = weakref.ref(second)
    del second
    assert kept() is not None and ring._kept[j] is kept()
    ring.give_back(j)  # nothing launched: dropped, and the dropped ring's release waits for no slot
    assert kept() is None and ring._kept[j] is None
    assert modes == [capture.RELAXED, capture.RELAXED]  # a last reference may free GPU memory
