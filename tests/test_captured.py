"""A swap captured into the caller's CUDA graph (issue 40), on the CPU: the
replay verdict ring (cupy_swap/graphs/replay_verdicts.py) over NumPy memory,
with the kernel's writes played by the tests, and what CapturedSwap sets up
and launches (no GPU: allocations and launches stood in)."""

from __future__ import annotations

import ctypes
import types

import numpy as np
import pytest

from cupy_swap.core.layout import layout_from_parts
from cupy_swap.cuda import abi, memory, release
from cupy_swap.cuda.resolve import resolve_layout
from cupy_swap.graphs import captured as captured_module
from cupy_swap.graphs.replay_verdicts import ReplayVerdicts, ring_words
from cupy_swap.prepared import PreparedSwap

from .fakes import FakeSwapper

LAYOUT = types.SimpleNamespace(src_limit=64, dst_limit=64, src_limit_name="src", dst_limit_name="dst")


def _replay(words: np.ndarray, k: int, kind: int = 0, row: int = 0, value: int = 0) -> None:
    """What replay ``k``'s launch writes: nothing when good; a failure into
    the record of its number (word 0 zeroed first, written last), then the
    failure count."""
    if not kind:
        return
    size = words.shape[0] - 1
    f = int(words[size, 0]) + 1
    record = words[f % size]
    record[0] = 0
    record[1:5] = kind, row, value, f
    record[0] = k
    words[size, 0] = f


def test_each_failed_replay_is_reported_once_in_order():
    words = np.zeros(ring_words(8), np.int64)
    ring = ReplayVerdicts(8, words)
    assert ring.failures(LAYOUT) == []  # nothing ran yet
    for k in range(1, 6):
        _replay(words, k, *((3, 1, 10) if k == 3 else (0, 0, 0)))
    found = ring.failures(LAYOUT)
    assert [type(e) for e in found] == [ValueError] and found[0].replay == 3
    assert (
        "replay #3 of a captured swap: expected distinct destination blocks, got block 10 again in row 1"
        in str(found[0])
    )
    assert ring.failures(LAYOUT) == []  # once
    _replay(words, 6, 2, 0, 99)
    _replay(words, 7)
    (err,) = ring.failures(LAYOUT)
    assert (
        isinstance(err, IndexError) and err.replay == 6 and "destination block index 99 in row 0" in str(err)
    )


def test_any_number_of_good_replays_between_reads_loses_nothing():
    words = np.zeros(ring_words(2), np.int64)
    ring = ReplayVerdicts(2, words)
    for k in range(1, 1001):  # 1000 replays into a ring of 2, two of them bad
        _replay(words, k, *((1, 0, -5) if k in (17, 999) else (0, 0, 0)))
    found = ring.failures(LAYOUT)
    assert [e.replay for e in found] == [17, 999] and all(isinstance(e, IndexError) for e in found)
    assert ring.failures(LAYOUT) == []


def test_failures_overwritten_before_they_were_read_are_reported_lost():
    words = np.zeros(ring_words(4), np.int64)
    ring = ReplayVerdicts(4, words)
    for k in range(1, 12):  # 11 failed replays into a ring of 4: failures 1..7 were overwritten
        _replay(words, k, 1, 0, -k)
    found = ring.failures(LAYOUT)
    assert isinstance(found[0], RuntimeError) and found[0].replay is None
    assert "failures #1..#7" in str(found[0]) and "overwritten before they were read" in str(found[0])
    assert [e.replay for e in found[1:]] == [8, 9, 10, 11] and isinstance(found[1], IndexError)
    assert "source block index -8" in str(found[1])
    assert ring.failures(LAYOUT) == []


def test_a_record_rewritten_while_it_is_read_is_reported_lost():
    words = np.zeros(ring_words(4), np.int64)
    ring = ReplayVerdicts(4, words)
    for k in range(1, 4):
        _replay(words, k, 3, 0, k)

    class Racing(np.ndarray):  # record 2's replay number changes between the two reads
        def __getitem__(self, index):
            got = super().__getitem__(index)
            if index == 2 and isinstance(got, np.ndarray):
                got = got.view(_Rewritten)
            return got

    class _Rewritten(np.ndarray):
        seen = 0

        def __getitem__(self, index):
            if index == 0:
                type(self).seen += 1
                return 2 if type(self).seen == 1 else 0
            return super().__getitem__(index)

    ring.words = words.view(Racing)
    found = ring.failures(LAYOUT)
    assert [type(e) for e in found] == [ValueError, RuntimeError, ValueError]
    assert [e.replay for e in found] == [1, None, 3] and "failures #2..#2" in str(found[1])


class _Launcher:
    def __init__(self):
        self.device, self.max_ctas, self.check_rows_max = 0, 8, 8192
        self.launches: list = []

    def byref_args(self, layout):
        return abi.ByRefArgs(16, layout, fn=0xF00)

    def _launch(self, fn, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        (struct_ptr,) = (ctypes.c_void_p * 1).from_address(params)
        words = np.ctypeslib.as_array((ctypes.c_int64 * 12).from_address(struct_ptr)).copy()
        self.launches.append((fn, gx, bx, smem, stream, words))


@pytest.fixture
def made(fake_gpu, monkeypatch):
    """A CapturedSwap over stand-ins: device memory at 0x7000, pinned verdict
    words at NumPy memory with alias 0xA000, uploads recorded."""
    sw = FakeSwapper([])
    parts = [fake_gpu.parts(np.zeros((64, 64), np.uint8), name) for name in ("src", "dst")]
    op = PreparedSwap(sw, resolve_layout(layout_from_parts(*parts), 0), None)
    lau = sw._launcher = _Launcher()  # what CapturedSwap reads of the launcher
    uploads, kept, allocs = [], [], []
    monkeypatch.setattr(memory, "zeros_pinned_for_gpu", lambda shape, dtype, device: np.zeros(shape, dtype))
    monkeypatch.setattr(memory, "host_alias", lambda ptr, nbytes: 0xA000)
    monkeypatch.setattr(release, "keep_for_process", kept.append)
    monkeypatch.setattr(
        captured_module.CapturedSwap,
        "_upload",
        staticmethod(lambda base, c, device: uploads.append(c.copy())),
    )
    monkeypatch.setattr(captured_module, "_device_view", lambda ptr, shape, device, owner: (ptr, shape))
    monkeypatch.setattr(captured_module, "on_device", lambda device: _Null())
    capturing: set = set()  # stream handles the stand-in says are capturing
    monkeypatch.setattr(captured_module, "stream_is_capturing", capturing.__contains__)
    alloc = lambda nbytes, device: allocs.append(nbytes) or 0x7000  # noqa: E731
    return types.SimpleNamespace(
        op=op, lau=lau, uploads=uploads, kept=kept, allocs=allocs, alloc=alloc, capturing=capturing
    )


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_a_captured_swap_points_its_launch_at_its_own_control_rows_and_count(made):
    cs = captured_module.CapturedSwap(made.op, 32, 16, alloc=made.alloc)
    assert made.allocs == [8 * (abi.CONTROL_WORDS + 2 * 32 + 1)]
    (control,) = made.uploads
    assert control[:8].tolist() == [0, 0xA000, 0, 0, 0, 0, 2, 16]  # count 0, status ring, step 2, 16 replays
    assert cs.rows == (0x7000 + 64, (32, 2)) and cs.count == (0x7000, ()) and cs.done_ptr == 0x7000 + 24
    cs.launch(stream=9)
    ((fn, grid, threads, smem, stream, words),) = made.lau.launches
    rows = 0x7000 + 8 * abi.CONTROL_WORDS
    assert fn == 0xF00 and stream == 9 and smem == abi.check_shared_bytes(32)
    assert words[0] == 32 and words[5] == words[6] == 0  # capacity; status and number from the record
    assert words[7] == rows + 16 * 32  # its own CTA count
    assert words[8:12].tolist() == [rows, rows + 8, 2, 0x7000]
    assert any(type(k) is tuple and k[0] is made.op for k in made.kept)  # a replay may write them any time
    cs.launch(stream=9)  # launches allocate nothing
    assert len(made.allocs) == 1 and len(made.uploads) == 1


@pytest.mark.parametrize(
    "max_rows, ring, match",
    [
        (0, 16, "max_rows: expected an int from 1 to 64"),
        (65, 16, "max_rows"),
        (8, 0, "ring: expected an int >= 1"),
    ],
)
def test_bad_arguments_are_refused_before_anything_is_allocated(made, max_rows, ring, match):
    with pytest.raises(ValueError, match=match):
        captured_module.CapturedSwap(made.op, max_rows, ring, alloc=made.alloc)
    assert made.allocs == [] and made.uploads == []


def test_each_failure_is_raised_once_by_check_or_listed_by_failures(made):
    cs = captured_module.CapturedSwap(made.op, 8, 4, alloc=made.alloc)
    words = cs._verdicts.words
    _replay(words, 1, 3, 1, 5)
    _replay(words, 2, 1, 0, 70)
    with pytest.raises(ValueError, match="replay #1"):
        cs.check()
    with pytest.raises(IndexError, match="replay #2"):
        cs.check()
    cs.check()
    assert cs.failures() == []


class _GpuArray:
    """What gpu_mapping reads of a torch CUDA tensor."""

    is_cuda = True

    def __init__(self, ptr, shape, dtype="int64", device=0, contiguous=True):
        import torch  # noqa: F401  (gpu_mapping compares with torch.int64)

        self.ptr, self.shape, self.device, self.contiguous = ptr, shape, device, contiguous
        self.dtype = getattr(torch, dtype)

    def get_device(self):
        return self.device

    def data_ptr(self):
        return self.ptr

    def is_contiguous(self):
        return self.contiguous


@pytest.fixture
def fake_torch(monkeypatch):
    torch = types.SimpleNamespace(int64=object(), int32=object())
    monkeypatch.setitem(__import__("sys").modules, "torch", torch)
    return torch


def test_a_captured_swap_reads_the_callers_rows_and_copies_the_callers_count(made, fake_torch, monkeypatch):
    copies = []
    import cupy.cuda.runtime as runtime

    monkeypatch.setattr(runtime, "memcpyAsync", lambda *a: copies.append(a), raising=False)
    pair = (_GpuArray(0x5000, (40,)), _GpuArray(0x6000, (40,)))
    count = _GpuArray(0x4000, ())
    cs = captured_module.CapturedSwap(made.op, 32, 4, alloc=made.alloc, rows=pair, count=count)
    (control,) = made.uploads
    assert control[4:8].tolist() == [0x5000, 0x6000, 1, 4]  # the caller's indices, step 1; ring of 4
    assert cs.rows is pair and cs.count is count
    cs.launch(stream=9)
    assert copies == [
        (0x7000, 0x4000, 8, 3, 9)
    ]  # the count into the record, on the stream, before the launch
    assert len(made.lau.launches) == 1
    assert any(type(k) is tuple and k[1] is pair and k[2] is count for k in made.kept)
    table = _GpuArray(0x5000, (32, 2))
    captured_module.CapturedSwap(made.op, 32, 4, alloc=made.alloc, rows=table)
    assert made.uploads[1][4:7].tolist() == [0x5000, 0x5008, 2]


@pytest.mark.parametrize(
    "rows, count, error, match",
    [
        ([[0, 1]] * 32, None, TypeError, "rows: expected an int64 GPU array of shape"),
        ("pair16", None, ValueError, "rows: expected at least max_rows=32 rows, got 16"),
        ("int32", None, TypeError, "rows: expected int64"),
        ("gpu1", None, ValueError, "rows: expected a mapping on GPU 0"),
        (None, np.zeros((), np.int64), TypeError, "count: expected a CuPy array or torch CUDA tensor"),
        (None, "two", ValueError, r"count: expected one element \(shape \(\) or \(1,\)\), got shape \(2,\)"),
        (None, "int32", TypeError, "count: expected int64"),
    ],
)
def test_bad_caller_buffers_are_refused_before_anything_is_allocated(
    made, fake_torch, rows, count, error, match
):
    named = {
        "pair16": (_GpuArray(0x5000, (16,)), _GpuArray(0x6000, (16,))),
        "int32": _GpuArray(0x5000, (32, 2), "int32"),
        "gpu1": _GpuArray(0x5000, (32, 2), device=1),
    }
    if isinstance(rows, str):
        rows = named[rows]
    if count == "two":
        count = _GpuArray(0x4000, (2,))
    elif count == "int32":
        count = _GpuArray(0x4000, (), "int32")
    with pytest.raises(error, match=match):
        captured_module.CapturedSwap(made.op, 32, 4, alloc=made.alloc, rows=rows, count=count)
    assert made.allocs == [] and made.uploads == []


def test_wait_done_enqueues_a_gpu_wait_on_the_completion_word(made, monkeypatch):
    waits = []
    monkeypatch.setattr(captured_module, "stream_wait_geq", lambda *a: waits.append(a))
    monkeypatch.setattr(captured_module, "stream_on_device", lambda stream, device: stream)
    cs = captured_module.CapturedSwap(made.op, 8, 4, alloc=made.alloc)
    cs.wait_done(stream=5, replay=3)
    assert waits == [(5, cs.done_ptr, 3)]
    for bad in (0, -1, 2.0, None, 1 << 63, (1 << 64) + 3):  # the wait compares 64 bits, signed
        with pytest.raises(ValueError, match=r"replay: expected an int from 1 to 2\*\*63 - 1"):
            cs.wait_done(stream=5, replay=bad)
    assert len(waits) == 1


def test_wait_done_refuses_a_capturing_stream(made, monkeypatch):
    """A captured cuStreamWaitValue64 keeps its value: in a graph's second
    launch it would not wait for that launch's replay (review of issue 40)."""
    waits = []
    monkeypatch.setattr(captured_module, "stream_wait_geq", lambda *a: waits.append(a))
    monkeypatch.setattr(captured_module, "stream_on_device", lambda stream, device: stream)
    cs = captured_module.CapturedSwap(made.op, 8, 4, alloc=made.alloc)
    made.capturing.add(5)
    with pytest.raises(ValueError, match="stream: expected a stream that is not capturing.*captured event"):
        cs.wait_done(stream=5, replay=1)
    assert waits == []


def test_a_closed_swapper_refuses_captured_and_launch(made):
    cs = captured_module.CapturedSwap(made.op, 8, 4, alloc=made.alloc)
    made.op._swapper._closed = True
    with pytest.raises(RuntimeError, match="launch: the BlockSwapper of this captured swap is closed"):
        cs.launch(stream=5)
    with pytest.raises(RuntimeError, match="captured: this BlockSwapper is closed"):
        made.op.captured(8)
    assert made.lau.launches == []


def test_stream_none_means_the_same_stream_for_launch_and_wait_done(made, monkeypatch):
    """No ``stream=``: CuPy's current stream (77 in the stand-in), or torch's
    current stream for an op over torch tensors, for both calls alike."""
    waits = []
    monkeypatch.setattr(captured_module, "stream_wait_geq", lambda *a: waits.append(a))
    cs = captured_module.CapturedSwap(made.op, 8, 4, alloc=made.alloc)
    cs.launch()
    cs.wait_done(None, 1)
    made.op._decided.default_stream = lambda: 55  # torch's current stream
    cs.launch()
    cs.wait_done(None, 2)
    assert [launch[4] for launch in made.lau.launches] == [77, 55]
    assert waits == [(77, cs.done_ptr, 1), (55, cs.done_ptr, 2)]


@pytest.mark.parametrize("kw", [dict(check="host"), dict(mode="dma")])  # GPU -> GPU: no staging
def test_an_op_prepared_for_host_checks_or_the_copy_engines_refuses_a_capture(fake_gpu, kw):
    """A captured swap is the kernel, checking in each replay the rows the
    caller's kernels wrote: an op prepared with ``check="host"`` or a
    copy-engine or staged ``mode`` refuses ``captured()`` before anything is
    allocated (it built one that checked on the GPU)."""
    parts = [fake_gpu.parts(np.zeros((64, 64), np.uint8), name) for name in ("src", "dst")]
    op = PreparedSwap(FakeSwapper([]), resolve_layout(layout_from_parts(*parts), 0), None, **kw)
    with pytest.raises(ValueError, match="captured: a captured swap is the kernel.*prepared with"):
        op.captured(8)
