"""The launcher (cupy_swap/cuda/launcher.py) on the CPU: a slot launch's
parameter is made once per op and slot, points at that slot, and is
launched as it is (over parts that claim to be GPU memory: ``fake_gpu``)."""

import ctypes
import types

import numpy as np
import pytest

from cupy_swap.core.layout import layout_from_parts
from cupy_swap.cuda import abi
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


def test_gpu_rows_are_held_by_their_slot_until_it_is_written_again(capture_modes):
    """A GPU mapping's arrays (a temporary index tensor, say) are read by
    the launch: its slot holds them until the slot is written again, which
    is only after that launch's kernel said it finished; then they are
    retired, and dropped on the releaser thread a batch at a time (a last
    reference may free GPU memory, which a capture on the calling thread
    forbids).  A slot given back (nothing launched) drops them at once, in
    relaxed capture mode."""
    import gc
    import threading
    import weakref

    from cupy_swap.cuda import capture, release, slots
    from cupy_swap.cuda.gpu_mapping import DeviceRows
    from cupy_swap.cuda.slots import DST_INDEX, INDEX_STEP, N_PAIRS, SRC_INDEX

    from .fakes import fake_ring, land

    class Rows:  # stands for the caller's index arrays; dropped: on which thread, in which mode
        def __del__(self):
            dropped.append((threading.current_thread().name, capture_modes[0]))

    dropped: list = []

    class Event:
        check = seq = slot = path = nbytes = None

    layout = types.SimpleNamespace(bytes_per_pair=64)
    ring = fake_ring(size=1)
    first = Rows()
    i = ring.take()
    seq = ring.write_gpu(i, DeviceRows(0x10, 0x18, 2, 3, first), 3, (None, layout, None), Event())
    control = ring.controls[i]
    assert (control[SRC_INDEX], control[DST_INDEX], control[INDEX_STEP], control[N_PAIRS]) == (
        0x10,
        0x18,
        2,
        3,
    )
    ring.pending[i] = seq
    gone = weakref.ref(first)
    del first
    gc.collect()
    assert gone() is not None  # the launch may still read them
    land(ring, seq)
    for _ in range(slots._RETIRE_BATCH):  # the slot written again each time its kernel finished
        j = ring.take()
        assert j == i
        seq = ring.write_gpu(j, DeviceRows(0x20, 0x28, 1, 1, Rows()), 1, (None, layout, None), Event())
        ring.pending[j] = seq
        land(ring, seq)
    assert release.drain(timeout=30)
    gc.collect()
    assert gone() is None  # retired, then dropped by the releaser with the rest of its batch
    assert {name for name, _ in dropped} == {"cupy_swap-releaser"}
    j = ring.take()
    second = Rows()
    ring.write_gpu(j, DeviceRows(0x20, 0x28, 1, 1, second), 1, (None, layout, None), Event())
    kept = weakref.ref(second)
    del second
    dropped.clear()
    assert kept() is not None and ring._kept[j] is kept()
    ring.give_back(j)  # nothing launched: dropped, and the dropped ring's release waits for no slot
    assert kept() is None and ring._kept[j] is None
    assert dropped == [(threading.current_thread().name, capture.RELAXED)]
