"""The engine adapters (issue 51) without a GPU and without the engines.

* Stand-ins for cupy_swap: :class:`StandInSwapper` makes real
  ``PreparedSwap`` ops over tests/fakes.py's ``FakeSwapper`` (the real
  layout checks, mapping forms, launch verdicts and failure channels), with
  NumPy arrays claiming to be GPU memory; a call whose rows pass the fake
  kernel's check is then copied with NumPy.
* Stand-ins for the engines: objects with the fields of vLLM's
  ``CanonicalKVCaches``, ``GPULoadStoreSpec``, ``TransferResult`` and of
  SGLang's buffers and index tensors, and references written from the
  engines' own address arithmetic (vLLM's ``compute_sub_block_ptrs`` and
  transfer loop, sgl-kernel's ``get_global_offset_*``) that every transfer is
  compared with, byte for byte.
* Where vLLM or sgl-kernel import, the adapters are checked against their
  classes and signatures; elsewhere those tests skip, saying why.
"""

from __future__ import annotations

import importlib
import inspect
import subprocess
import sys
import threading
import types
import zlib
from pathlib import Path

import numpy as np
import pytest

import cupy_swap.prepared as prepared
from cupy_swap.core.layout import layout_from_parts
from cupy_swap.core.parts import as_parts
from cupy_swap.engines import chunks, offload
from cupy_swap.engines import sglang as sg
from cupy_swap.engines import vllm as cv
from cupy_swap.prepared import PreparedSwap

from .fakes import FakeSwapper, _fake_check, on_gpu

pytest.importorskip("cupy", reason="the stand-in ops tell CuPy events apart (cupy_swap.cuda.streams)")

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def not_capturing(monkeypatch):
    monkeypatch.setattr(prepared, "stream_is_capturing", lambda handle: False)


# -- the stand-in swapper -------------------------------------------------------------


class StandInEvent:
    """What the worker reads of a ``SwapEvent``: ``done``, ``synchronize()``
    (raises the launch's verdict), ``device_time()``, ``seq``."""

    def __init__(self, inner, seconds=1e-3):
        self.inner, self.seconds, self.landed = inner, seconds, True
        self.seq = getattr(inner, "seq", None)

    @property
    def done(self):
        return self.landed

    def synchronize(self):
        self.landed = True
        if getattr(self.inner, "check", None) is not None:
            self.inner.check.raise_on_event(self.inner)

    def device_time(self):
        self.synchronize()
        return self.seconds


def _flat_rows(mapping) -> np.ndarray:
    if isinstance(mapping, tuple):
        return np.stack([np.asarray(mapping[0]).reshape(-1), np.asarray(mapping[1]).reshape(-1)], 1)
    return np.asarray(mapping, np.int64).reshape(-1, 2)


class StandInOp:
    def __init__(self, owner, op, layout, src, dst):
        self.owner, self.op, self.layout, self.src, self.dst = owner, op, layout, src, dst
        self.bytes_per_pair = op.bytes_per_pair

    def __call__(self, mapping, *, stream=None, wait_for=(), **kw):
        self.owner.calls.append(("call", self, stream, wait_for, len(_flat_rows(mapping))))
        event = self.op(mapping, **kw)  # the real op: checks, verdicts, channels
        rows = _flat_rows(mapping)
        kind, _, _ = _fake_check(rows.reshape(-1).tolist(), self.layout)
        if kind == 0:  # the fake kernel found the rows good: copy them
            for s, d in zip(self.src, self.dst):
                d[rows[:, 1]] = s[rows[:, 0]]
        out = StandInEvent(event)
        out.landed = not self.owner.hold
        self.owner.events.append(out)
        return out


class StandInSwapper:
    """``prepare(src, dst)`` -> a real ``PreparedSwap`` over ``FakeSwapper``;
    arrays inside the ranges given to :meth:`gpu` claim to be GPU memory."""

    max_blocks = 64  # the FakeSwapper's ring rows

    def __init__(self, kernel_ok=True):
        self.calls, self.events, self.ranges, self.hold = [], [], [], False
        self.kernel_ok = kernel_ok  # False: prepare(mode="kernel") refuses, as for unmapped host memory

    def gpu(self, *arrays):
        for a in arrays:
            start = a.__array_interface__["data"][0]
            self.ranges.append((start, start + a.nbytes))
        return arrays[0] if len(arrays) == 1 else arrays

    def _parts(self, arrays, name):
        parts = []
        for i, a in enumerate(arrays):
            (p,) = as_parts(a, f"{name}[{i}]")
            if any(lo <= p.ptr < hi for lo, hi in self.ranges):
                (p,) = on_gpu([p])
            parts.append(p)
        return parts

    def prepare(self, src, dst, mode=None):
        if mode == "kernel" and not self.kernel_ok:
            raise ValueError("mode: 'kernel' needs host memory mapped into the GPU's address space")
        src, dst = list(src), list(dst)
        layout = layout_from_parts(self._parts(src, "src"), self._parts(dst, "dst"))
        # A FakeSwapper per op: its fake kernel checks rows against the layout it was bound to last.
        op = StandInOp(self, PreparedSwap(FakeSwapper([]), layout, (src, dst)), layout, src, dst)
        op.mode = mode  # the route asked for (the stand-in copies the same way on every one)
        return op


# -- vLLM: stand-ins of its data structures and its copy, from its source -------------


class Spec:
    """The fields of vLLM's GPULoadStoreSpec / CPULoadStoreSpec (block_ids int32)."""

    def __init__(self, block_ids, group_sizes=None, block_indices=None):
        self.block_ids = np.array(block_ids, dtype=np.int32)
        self.group_sizes, self.block_indices = group_sizes, block_indices


def vllm_copy(src, dst, group_refs, gpu_spec, chunk_ids, bpc, store):
    """What vLLM's CPU worker copies for one transfer, from its pointer
    arithmetic: per group, skip ``block_index % factor`` sub-blocks of the
    first chunk; per layer, one copy of ``page_size_bytes`` from ``base +
    block * row_stride + sub * sub_block_size`` per block (tensors as byte
    arrays, in place of addresses)."""
    src_f, dst_f = (1, bpc) if store else (bpc, 1)
    src_ids, dst_ids = (gpu_spec.block_ids, chunk_ids) if store else (chunk_ids, gpu_spec.block_ids)
    s_at = d_at = 0

    def offsets(ids, factor, tensor, skip, count):
        sub = tensor.shape[1] // factor
        every = [int(b) * tensor.strides[0] + j * sub for b in ids for j in range(factor)]
        return every[skip : skip + count]

    for size, index, refs in zip(gpu_spec.group_sizes, gpu_spec.block_indices, group_refs):
        if size == 0:
            continue
        s_skip, d_skip = index % src_f, index % dst_f
        s_n, d_n = -(-(size + s_skip) // src_f), -(-(size + d_skip) // dst_f)
        g_src, g_dst = src_ids[s_at : s_at + s_n], dst_ids[d_at : d_at + d_n]
        for t, nbytes in refs:
            s_bytes, d_bytes = src[t].reshape(-1), dst[t].reshape(-1)
            for a, b in zip(
                offsets(g_src, src_f, src[t], s_skip, size), offsets(g_dst, dst_f, dst[t], d_skip, size)
            ):
                d_bytes[b : b + nbytes] = s_bytes[a : a + nbytes]
        s_at, d_at = s_at + s_n, d_at + d_n


def _caches(rng, pages, num_blocks, num_chunks, bpc):
    gpu = [rng.integers(-128, 128, (num_blocks, p), dtype=np.int8) for p in pages]
    cpu = [rng.integers(-128, 128, (num_chunks, bpc * p), dtype=np.int8) for p in pages]
    return gpu, cpu


class StandInStream:
    def __init__(self, name, log):
        self.name, self.log = name, log
        self.cuda_stream = id(self)  # a raw handle, as a torch stream has

    def wait_event(self, event):
        self.log.append(("wait", self.name, event.timing))


class StandInMark:
    """An event of the worker's kit (its wait and its timing)."""

    def __init__(self, log, timing):
        self.log, self.timing, self.where = log, timing, None

    def record(self, stream):
        self.where = stream if isinstance(stream, str) else stream.name
        self.log.append(("record", self.where, self.timing))


class StandInKit:
    """The worker's event kit: marks recorded into the swapper's log; every
    transfer takes 2 ms between its start and end marks."""

    def __init__(self, log):
        self.log, self.made = log, 0

    def new(self, timing):
        self.made += 1
        return StandInMark(self.log, timing)

    def record(self, event, stream):
        event.record(stream)

    def order(self, stream, event):
        stream.wait_event(event)

    def done(self, event):
        return True

    def wait(self, event):
        pass

    def elapsed(self, start, end):
        assert start.timing and end.timing and start.where == end.where
        return 2e-3


def _worker(sw, gpu, cpu, refs, bpc, **kw):
    sw.gpu(*gpu)
    kw.setdefault("events", StandInKit(sw.calls))
    streams = dict(store_stream=StandInStream("store", sw.calls), load_stream=StandInStream("load", sw.calls))
    return offload.ChunkOffloadWorker(gpu, cpu, refs, bpc, swapper=sw, **streams, **kw)


def _group_spec(rng, sizes, indices, num_blocks, num_chunks, bpc):
    """Distinct GPU blocks and chunks for groups of ``sizes`` starting at
    request block ``indices`` (distinct across groups: one block pool)."""
    need = sum(-(-(s + i % bpc) // bpc) for s, i in zip(sizes, indices) if s)
    gpu_ids = rng.permutation(num_blocks)[: sum(sizes)]
    chunk_ids = rng.permutation(num_chunks)[:need]
    return Spec(gpu_ids, list(sizes), list(indices)), Spec(chunk_ids)


# Engine-shaped cases, scaled down: pages per tensor, refs per group, blocks per chunk.
LLAMA = dict(pages=[256] * 8, refs=[[(t, 256) for t in range(8)]])  # 8 layers of K+V pages
MLA = dict(pages=[144] * 6, refs=[[(t, 144) for t in range(6)]])  # latent caches, one per layer
HYBRID = dict(  # two groups on shared tensors, pages padded to the larger: 256 and 96 bytes used
    pages=[256] * 4,
    refs=[[(0, 256), (1, 256)], [(2, 96), (3, 96)]],
)
HYBRID_SHARED = dict(
    pages=[256] * 2, refs=[[(0, 256), (1, 256)], [(0, 96), (1, 96)]]
)  # groups overlay tensors
SAME_BYTES = dict(pages=[128] * 3, refs=[[(0, 128), (1, 128), (2, 128)]] * 2)  # two groups, one op
CASES = dict(llama=LLAMA, mla=MLA, hybrid=HYBRID, hybrid_shared=HYBRID_SHARED, same_bytes=SAME_BYTES)


@pytest.mark.parametrize("store", [True, False], ids=["store", "load"])
@pytest.mark.parametrize("bpc", [1, 2, 4])
@pytest.mark.parametrize("case", list(CASES))
def test_a_transfer_copies_what_vllm_copies(case, bpc, store):
    geometry, rng = CASES[case], np.random.default_rng(zlib.crc32(f"{case} {bpc} {store}".encode()))
    num_blocks, num_chunks = 48, 40
    gpu, cpu = _caches(rng, geometry["pages"], num_blocks, num_chunks, bpc)
    want_gpu, want_cpu = [a.copy() for a in gpu], [a.copy() for a in cpu]
    sw = StandInSwapper()
    worker = _worker(sw, gpu, cpu, geometry["refs"], bpc)
    groups = len(geometry["refs"])
    for sizes, indices in (
        ([5] * groups, [0] * groups),
        ([7] * groups, [3] * groups),
        ([1] + [0] * (groups - 1), [2] * groups),
    ):
        gpu_spec, cpu_spec = _group_spec(rng, sizes, indices, num_blocks, num_chunks, bpc)
        if store:
            assert worker.submit_store(1, gpu_spec, cpu_spec) is True
            vllm_copy(want_gpu, want_cpu, geometry["refs"], gpu_spec, cpu_spec.block_ids, bpc, True)
        else:
            assert worker.submit_load(1, cpu_spec, gpu_spec) is True
            vllm_copy(want_cpu, want_gpu, geometry["refs"], gpu_spec, cpu_spec.block_ids, bpc, False)
        (result,) = worker.get_finished()
        assert result.success and result.job_id == 1, getattr(result, "error", None)
        for got, want in zip(gpu + cpu, want_gpu + want_cpu):
            assert np.array_equal(got, want)
        sigs, of = chunks.part_signatures(geometry["refs"])
        moved = sum(size * sum(n for _, n in sigs[op]) for size, op in zip(sizes, of))
        assert result.transfer_size == moved and result.transfer_time is not None
    ops = len(chunks.part_signatures(geometry["refs"])[0])
    assert ops == {"same_bytes": 1, "hybrid": 2, "hybrid_shared": 2}.get(case, 1)


def test_transfer_size_is_the_bytes_moved_and_one_call_serves_every_tensor():
    rng = np.random.default_rng(5)
    gpu, cpu = _caches(rng, LLAMA["pages"], 32, 16, 2)
    sw = StandInSwapper()
    worker = _worker(sw, gpu, cpu, LLAMA["refs"], 2)
    gpu_spec, cpu_spec = Spec([4, 9, 1], [3], [1]), Spec([2, 7])  # starts mid-chunk: 2 chunks for 3 blocks
    worker.submit_store(7, gpu_spec, cpu_spec)
    calls = [c for c in sw.calls if c[0] == "call"]
    assert len(calls) == 1 and calls[0][4] == 3  # one call, 3 rows, 8 tensors
    (result,) = worker.get_finished()
    assert result.transfer_size == 3 * 8 * 256 and result.transfer_time == pytest.approx(2e-3)
    # chunk 2 holds request blocks 0..1: block index 1 is its second half, then chunk 7's first
    assert np.array_equal(cpu[0][2, 256:], gpu[0][4]) and np.array_equal(cpu[0][7, :256], gpu[0][9])
    assert np.array_equal(cpu[0][7, 256:], gpu[0][1])


def test_the_chunk_rows_of_unaligned_first_and_last_chunks():
    assert chunks.chunk_rows([3, 5, 9], 4, 2, 7).tolist() == [14, 15, 20, 21, 22, 23, 36]
    assert chunks.chunk_rows([3], 1, 0, 1).tolist() == [3]
    rows = chunks.transfer_rows([10, 11, 12, 20, 21], [3, 0, 2], [5, 0, 7], [1, 6, 2], 4, 3)
    assert [r.gpu.tolist() for r in rows] == [[10, 11, 12], [], [20, 21]]
    # group 0: request blocks 5..7 are blocks 1..3 of chunk 1; group 2: block 7 is chunk 6's last,
    # block 8 chunk 2's first (its last chunk, unaligned); the empty group takes no chunk
    assert [r.cpu.tolist() for r in rows] == [[5, 6, 7], [], [27, 8]]
    with pytest.raises(chunks.SpecError, match="need 2 chunks, 1 left"):
        chunks.transfer_rows([10, 11, 12, 20, 21], [3, 0, 2], [5, 0, 7], [1, 6], 4, 3)
    with pytest.raises(chunks.SpecError, match="expected 3 chunks"):
        chunks.transfer_rows([10, 11, 12, 20, 21], [3, 0, 2], [5, 0, 7], [1, 6, 2, 8], 4, 3)
    with pytest.raises(chunks.SpecError, match="sum\\(group_sizes\\) == 5"):
        chunks.transfer_rows([10, 11, 12, 20, 21], [3, 0, 1], [5, 0, 7], [1, 2, 6], 4, 3)
    with pytest.raises(chunks.SpecError, match="one per KV cache group"):
        chunks.transfer_rows([10], [1], [0], [1], 4, 2)


def test_signatures_share_ops_between_groups_touching_the_same_bytes():
    sigs, of = chunks.part_signatures(
        [[(0, 64), (1, 64)], [(1, 64), (0, 64)], [(0, 32)], [], [(0, 16), (0, 32)]]
    )
    assert sigs == [((0, 64), (1, 64)), ((0, 32),)] and of == [0, 0, 1, None, 1]


def test_results_come_in_submission_order_per_direction():
    rng = np.random.default_rng(1)
    gpu, cpu = _caches(rng, [64, 64], 32, 32, 1)
    sw = StandInSwapper()
    worker = _worker(sw, gpu, cpu, [[(0, 64), (1, 64)]], 1)
    sw.hold = True
    worker.submit_store(1, Spec([1], [1], [0]), Spec([1]))
    sw.hold = False
    worker.submit_store(2, Spec([2], [1], [0]), Spec([2]))
    worker.submit_load(3, Spec([3]), Spec([3], [1], [0]))
    worker.submit_store(4, Spec([], [0], [0]), Spec([]))  # an empty transfer: after 1 and 2
    assert [r.job_id for r in worker.get_finished()] == [3]  # 2 and 4 are done but wait behind 1
    sw.events[0].landed = True
    results = worker.get_finished()
    assert [r.job_id for r in results] == [1, 2, 4] and all(r.success for r in results)
    assert results[2].transfer_size == 0 and worker.get_finished() == []


def test_an_expedited_load_runs_on_its_own_lane_behind_no_regular_load():
    """vLLM 0.33.0's connector submits a load its request needs this step
    with ``expedited=True`` and waits for it at once: it runs on its own
    stream, ``wait`` settles it without the regular loads queued before it,
    and ``get_finished`` reports stores, loads, then expedited loads, each
    lane in submission order."""
    rng = np.random.default_rng(3)
    gpu, cpu = _caches(rng, [64], 32, 32, 1)
    sw = StandInSwapper()
    lane = StandInStream("expedited", sw.calls)
    worker = _worker(sw, gpu, cpu, [[(0, 64)]], 1, expedited_stream=lane, current_stream=lambda: "compute")
    sw.hold = True
    worker.submit_load(1, Spec([1]), Spec([1], [1], [0]))  # a regular load, still in flight
    sw.hold = False
    worker.submit_load(2, Spec([2]), Spec([2], [1], [0]), expedited=True)
    worker.submit_store(3, Spec([3], [1], [0]), Spec([3]))
    streams = [c[2].name for c in sw.calls if c[0] == "call"]
    assert streams == ["load", "expedited", "store"]
    expedited = sw.calls.index(next(c for c in sw.calls if c[0] == "call" and c[2] is lane))
    assert sw.calls[expedited - 3 : expedited - 1] == [
        ("record", "compute", False),
        ("wait", "expedited", False),
    ]
    # Its ops never stage (one copy stream per swapper and direction); the others keep auto's choice.
    assert [op.mode for ops in worker._ops["expedited load"] for op in ops] == ["kernel"]
    assert [op.mode for ops in worker._ops["load"] + worker._ops["store"] for op in ops] == [None, None]
    unmapped = _worker(StandInSwapper(kernel_ok=False), gpu, cpu, [[(0, 64)]], 1)
    assert [op.mode for ops in unmapped._ops["expedited load"] for op in ops] == ["dma"]
    worker.wait({2})  # returns: job 1 is not waited for
    assert not sw.events[0].landed
    assert [r.job_id for r in worker.get_finished()] == [3, 2]  # 1 is still in flight
    sw.events[0].landed = True
    (late,) = worker.get_finished()
    assert late.job_id == 1 and late.success
    other = StandInSwapper()
    default = _worker(other, gpu, cpu, [[(0, 64)]], 1)  # no expedited stream: the load stream
    default.submit_load(4, Spec([4]), Spec([4], [1], [0]), expedited=True)
    assert [c[2].name for c in other.calls if c[0] == "call"] == ["load"]


def test_a_missing_vllm_dependency_is_named_not_masked(monkeypatch):
    """Where vLLM's spec module exists but a package it imports does not, the
    error names that package (it was once reported as the class missing
    from where older releases keep it)."""
    _stand_in_vllm(monkeypatch)
    import importlib.abc

    class Broken(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "vllm.v1.kv_offload.cpu.spec":
                raise ModuleNotFoundError("No module named 'regex'", name="regex")
            return None

    monkeypatch.delitem(sys.modules, "vllm.v1.kv_offload.cpu.spec")
    monkeypatch.delattr(sys.modules["vllm.v1.kv_offload.cpu"], "spec")
    monkeypatch.setattr(sys.modules["vllm.v1.kv_offload.cpu"], "__path__", [], raising=False)  # a package
    monkeypatch.setattr(sys, "meta_path", [Broken(), *sys.meta_path])
    with pytest.raises(ModuleNotFoundError, match="regex"):
        getattr(cv, "CupySwapOffloadingSpec")  # noqa: B009 - as vLLM's factory asks


def test_streams_waits_and_timing_marks():
    """Stores on the store stream, loads on the load stream; a transfer
    first waits for the current stream's work (an event recorded there),
    then its calls run between its start and end marks; the marks are
    made with the worker (``event_pool`` transfers' worth), more when more
    transfers are unreported, and reused once their transfer is reported."""
    rng = np.random.default_rng(2)
    gpu, cpu = _caches(rng, [64, 64], 200, 200, 1)
    sw = StandInSwapper()
    kit = StandInKit(sw.calls)
    refs = [[(0, 64)], [(1, 32)]]
    default = StandInKit([])
    _worker(StandInSwapper(), gpu, cpu, refs, 1, events=default)
    assert default.made == 3 * 16  # the default event_pool: 16 transfers' marks
    worker = _worker(sw, gpu, cpu, refs, 1, current_stream=lambda: "compute", events=kit, event_pool=1)
    assert kit.made == 3 and sw.calls == []  # one transfer's marks, made with the worker
    worker.submit_store(1, Spec(range(70), [70, 0], [0, 0]), Spec(range(70)))  # 70 rows: 2 calls
    worker.submit_load(2, Spec([5, 6]), Spec([7, 8], [1, 1], [0, 0]))  # two groups, two ops
    seen = [c if c[0] != "call" else ("call", c[2].name, c[3], c[4]) for c in sw.calls]

    def transfer(stream, *rows):  # wait for compute, start mark, the calls (no wait_for), end mark
        head = [("record", "compute", False), ("wait", stream, False), ("record", stream, True)]
        return head + [("call", stream, (), n) for n in rows] + [("record", stream, True)]

    assert seen == transfer("store", 64, 6) + transfer("load", 1, 1)
    results = worker.get_finished()
    assert [r.success for r in results] == [True, True] and results[0].transfer_time == pytest.approx(2e-3)
    assert kit.made == 6
    worker.submit_store(3, Spec([1], [1, 0], [0, 0]), Spec([1]))
    worker.get_finished()
    assert kit.made == 6  # the reported transfers' marks were reused


class _ModeDriver:
    """cuThreadExchangeStreamCaptureMode of one thread (as in
    tests/test_capture_rule.py): ``mode`` is this thread's capture mode."""

    def __init__(self):
        self.mode = 0

    def cuThreadExchangeStreamCaptureMode(self, ptr):
        ptr._obj.value, self.mode = self.mode, ptr._obj.value
        return 0


def test_the_torch_event_kit_creates_cuda_events_when_made_relaxed_and_never_at_submit(monkeypatch):
    """torch creates an event's CUDA event at its first ``record()``: a kit
    that only constructed ``torch.cuda.Event`` in relaxed mode left
    ``cudaEventCreate`` to the worker's first records, inside ``submit_*``
    and outside relaxed mode (the capture rule, cupy_swap/cuda/capture.py;
    and a creation can wait ~950 ms behind a release, NOTES 77).  Here
    every driver call of the kit's events is logged with the thread's
    capture mode: creations happen in relaxed mode when the worker is made
    (or, past its pool, in relaxed mode still), and cudaEventElapsedTime is
    relaxed too."""
    torch = pytest.importorskip("torch", reason="torch is not installed here (the torch extra)")
    from cupy_swap.cuda import capture
    from cupy_swap.cuda import driver as driver_module

    drv = _ModeDriver()
    monkeypatch.setattr(driver_module, "libcuda", lambda: drv)
    log = []  # (driver call, capture mode, phase)
    phase = ["make"]

    class LazyEvent:  # torch.cuda.Event's lifetime: the CUDA event is made at the first record()
        def __init__(self, enable_timing=False, blocking=False, interprocess=False):
            self.timing, self.created = enable_timing, False

        def record(self, stream=None):
            if not self.created:
                self.created = True
                log.append(("cudaEventCreate", drv.mode, phase[0]))
            log.append(("cudaEventRecord", drv.mode, phase[0]))

        @property
        def cuda_event(self):  # the raw handle the kit records and waits on: it must exist by then
            assert self.created, "an event used by its handle before its CUDA event was made"
            return id(self)

        def query(self):
            log.append(("cudaEventQuery", drv.mode, phase[0]))
            return True

        def synchronize(self):
            log.append(("cudaEventSynchronize", drv.mode, phase[0]))

        def elapsed_time(self, end):
            log.append(("cudaEventElapsedTime", drv.mode, phase[0]))
            return 2.0

    class SideStream:
        def __init__(self, device=None, priority=0):
            log.append(("cudaStreamCreate", drv.mode, phase[0]))

    class Runtime:  # the kit's records and waits on the worker's streams, by raw handle
        def eventRecord(self, event, stream):
            log.append(("cudaEventRecord", drv.mode, phase[0]))

        def streamWaitEvent(self, stream, event, flags):
            log.append(("cudaStreamWaitEvent", drv.mode, phase[0]))

    monkeypatch.setattr(torch.cuda, "Event", LazyEvent)
    monkeypatch.setattr(torch.cuda, "Stream", SideStream)
    monkeypatch.setattr(cv, "_runtime", Runtime)
    kit = cv.TorchEvents()
    event = kit.new(True)
    assert event.created and event.timing  # the CUDA event exists when new() returns
    rng = np.random.default_rng(17)
    gpu, cpu = _caches(rng, [64], 16, 16, 1)
    sw = StandInSwapper()
    worker = _worker(sw, gpu, cpu, [[(0, 64)]], 1, current_stream=lambda: 7, events=kit, event_pool=2)
    phase[0] = "submit"
    sw.hold = True
    worker.submit_store(1, Spec([1], [1], [0]), Spec([1]))
    worker.submit_store(2, Spec([2], [1], [0]), Spec([2]))  # two in flight: the pool's two
    assert [c for c in log if c[0] == "cudaEventCreate" and c[2] == "submit"] == []
    worker.submit_store(3, Spec([3], [1], [0]), Spec([3]))  # a third: its events made now
    phase[0] = "report"
    for e in sw.events:
        e.landed = True
    results = worker.get_finished()
    assert [(r.job_id, r.success, r.transfer_time) for r in results] == [
        (1, True, 2e-3),
        (2, True, 2e-3),
        (3, True, 2e-3),
    ]
    creates = [c for c in log if c[0] == "cudaEventCreate"]
    assert len(creates) == 1 + 3 * 3  # new() above, the pool's two transfers, the third's
    assert {c[2] for c in creates} == {"make", "submit"}
    relaxed_only = ("cudaEventCreate", "cudaStreamCreate", "cudaEventQuery", "cudaEventSynchronize",
                    "cudaEventElapsedTime")  # fmt: skip
    outside = [c for c in log if c[0] in relaxed_only and c[1] != capture.RELAXED]
    assert outside == [], outside
    assert ("cudaEventElapsedTime", capture.RELAXED, "report") in log
    assert sum(c[0] == "cudaStreamCreate" for c in log) == 1  # one private stream for the kit
    assert drv.mode == 0


def test_a_bad_block_id_is_success_false_and_writes_nothing():
    rng = np.random.default_rng(3)
    gpu, cpu = _caches(rng, [64, 64], 16, 8, 2)
    before = [a.copy() for a in gpu + cpu]
    sw = StandInSwapper()
    worker = _worker(sw, gpu, cpu, [[(0, 64), (1, 64)]], 2)
    worker.submit_store(1, Spec([3, 99], [2], [0]), Spec([1]))  # GPU block 99 of 16: the launch refuses
    worker.submit_store(2, Spec([3, 4], [2], [0]), Spec([8]))  # chunk 8 of 8: out of range
    worker.submit_load(3, Spec([1]), Spec([2, 2], [2], [0]))  # GPU block 2 twice
    worker.submit_store(4, Spec([3, 4], [2], [0]), Spec([1, 2]))  # one chunk too many: a bad spec
    results = worker.get_finished()
    assert [(r.job_id, r.success) for r in results] == [(1, False), (2, False), (4, False), (3, False)]
    assert all(r.transfer_size is None and r.transfer_time is None for r in results)
    assert "out of range" in results[0].error and "expected 1 chunks" in results[2].error
    assert "again" in results[3].error
    for got, want in zip(gpu + cpu, before):
        assert np.array_equal(got, want)


def test_more_parts_than_one_op_holds_take_several_ops():
    rng = np.random.default_rng(9)
    gpu, cpu = _caches(rng, [64] * 5, 16, 8, 1)
    sw = StandInSwapper()
    sw.max_parts = 2
    worker = _worker(sw, gpu, cpu, [[(t, 64) for t in range(5)]], 1)
    worker.submit_store(1, Spec([3, 4], [2], [0]), Spec([6, 7]))
    assert [c[4] for c in sw.calls if c[0] == "call"] == [2, 2, 2]  # parts 0-1, 2-3, 4
    (result,) = worker.get_finished()
    assert result.success and result.transfer_size == 2 * 5 * 64
    assert all(np.array_equal(c[[6, 7]], g[[3, 4]]) for g, c in zip(gpu, cpu))
    worker.submit_store(2, Spec([3, 16], [2], [0]), Spec([1, 2]))  # block 16 of 16: no op runs
    (result,) = worker.get_finished()
    assert not result.success and len([c for c in sw.calls if c[0] == "call"]) == 3


def test_a_bad_id_in_a_transfer_of_several_calls_writes_nothing():
    """Several ops (two groups): every row is range-checked before any call."""
    rng = np.random.default_rng(4)
    gpu, cpu = _caches(rng, [64, 64], 16, 8, 1)
    before = [a.copy() for a in gpu + cpu]
    sw = StandInSwapper()
    worker = _worker(sw, gpu, cpu, [[(0, 64)], [(1, 32)]], 1)
    worker.submit_store(1, Spec([3, 40], [1, 1], [0, 0]), Spec([1, 2]))
    (result,) = worker.get_finished()
    assert not result.success and "nothing was copied" in result.error and sw.calls == []
    for got, want in zip(gpu + cpu, before):
        assert np.array_equal(got, want)


def test_an_earlier_failure_told_by_the_next_call_fails_only_its_own_transfer():
    """cupy_swap raises a failed launch's verdict once at the op's next call
    (which launches nothing) when no event told it: the worker makes the
    call again and the earlier transfer's event tells its failure."""
    rng = np.random.default_rng(6)
    gpu, cpu = _caches(rng, [64], 16, 16, 1)
    sw = StandInSwapper()
    worker = _worker(sw, gpu, cpu, [[(0, 64)]], 1)
    worker.submit_store(1, Spec([3, 3 + 100], [2], [0]), Spec([1, 2]))
    worker.submit_store(2, Spec([5, 6], [2], [0]), Spec([3, 4]))
    worker.submit_store(3, Spec([7], [1], [0]), Spec([5]))
    assert [(r.job_id, r.success) for r in worker.get_finished()] == [(1, False), (2, True), (3, True)]
    assert np.array_equal(cpu[0][3], gpu[0][5]) and np.array_equal(cpu[0][5], gpu[0][7])


def test_wait_and_shutdown():
    rng = np.random.default_rng(7)
    gpu, cpu = _caches(rng, [64], 16, 16, 1)
    sw = StandInSwapper()
    worker = _worker(sw, gpu, cpu, [[(0, 64)]], 1)
    sw.hold = True
    worker.submit_store(1, Spec([1], [1], [0]), Spec([1]))
    worker.submit_store(2, Spec([2], [1], [0]), Spec([2]))
    worker.submit_load(3, Spec([3]), Spec([3], [1], [0]))
    worker.wait({2})  # 1 and 2 are waited for, 3 is not
    assert [e.landed for e in sw.events] == [True, True, False]
    assert [r.job_id for r in worker.get_finished()] == [1, 2]
    worker.shutdown()
    assert sw.events[2].landed and worker.get_finished() == []
    with pytest.raises(RuntimeError, match="shut down"):
        worker.submit_store(4, Spec([1], [1], [0]), Spec([1]))


def test_shutdown_drains_every_lane_when_one_fails_to(monkeypatch):
    """A lane whose wait fails (a broken context) leaves the other lanes
    drained and the worker shut; the failure is raised after."""
    rng = np.random.default_rng(9)
    gpu, cpu = _caches(rng, [64], 16, 16, 1)
    sw = StandInSwapper()
    worker = _worker(sw, gpu, cpu, [[(0, 64)]], 1)
    sw.hold = True
    worker.submit_store(1, Spec([1], [1], [0]), Spec([1]))
    worker.submit_load(2, Spec([2]), Spec([2], [1], [0]))
    worker.submit_load(3, Spec([3]), Spec([3], [1], [0]), expedited=True)
    settle = worker._settle

    def broken(t):
        if t.job_id == 1:
            raise RuntimeError("a broken context")
        settle(t)

    monkeypatch.setattr(worker, "_settle", broken)
    with pytest.raises(RuntimeError, match="broken context"):
        worker.shutdown()
    assert [e.landed for e in sw.events] == [False, True, True]  # the store's wait failed; loads drained
    with pytest.raises(RuntimeError, match="shut down"):
        worker.submit_load(4, Spec([4]), Spec([4], [1], [0]))


def test_worker_refuses_chunk_tensors_that_do_not_fit():
    sw = StandInSwapper()
    gpu = sw.gpu(np.zeros((8, 64), np.int8))
    with pytest.raises(ValueError, match=r"expected shape \(chunks, 2 x 64\)"):
        offload.ChunkOffloadWorker([gpu], [np.zeros((4, 64), np.int8)], [[(0, 64)]], 2, swapper=sw)
    with pytest.raises(ValueError, match="whose pages hold 64"):
        offload.ChunkOffloadWorker([gpu], [np.zeros((4, 128), np.int8)], [[(0, 80)]], 2, swapper=sw)


# -- vLLM's classes: the adapter's against stand-ins, and against vLLM's where it imports


def _stand_in_vllm(monkeypatch, chunks_attr="num_chunks"):
    """Modules with the names and shapes of vLLM's offloading classes (as in
    vLLM 0.33.0, which cupy_swap.engines.vllm follows; ``chunks_attr``: the
    spec's count of CPU chunks, ``"num_blocks"`` before that release), and
    its factory's loading rule."""
    import abc
    import dataclasses

    base = types.ModuleType("vllm.v1.kv_offload.base")

    class OffloadingWorker(abc.ABC):
        @abc.abstractmethod
        def submit_store(self, job_id, src_spec, dst_spec): ...

        @abc.abstractmethod
        def submit_load(self, job_id, src_spec, dst_spec, expedited=False): ...

        @abc.abstractmethod
        def get_finished(self): ...

        @abc.abstractmethod
        def wait(self, job_ids): ...

        def shutdown(self):
            return

    @dataclasses.dataclass
    class TransferResult:
        job_id: int
        success: bool
        transfer_size: int | None = None
        transfer_time: float | None = None

    class OffloadingSpec(abc.ABC):
        def __init__(self, config):
            self.config, self.extra_config = config, config.extra_config
            self.blocks_per_chunk = config.cache.blocks_per_chunk

        @abc.abstractmethod
        def get_manager(self): ...

        @abc.abstractmethod
        def get_worker(self, kv_caches): ...

    class CPUOffloadingSpec(OffloadingSpec):
        def __init__(self, config):
            super().__init__(config)
            self._worker = None
            setattr(self, chunks_attr, 10)

        def get_manager(self):
            return "vLLM's manager"

        def get_worker(self, kv_caches):
            return "vLLM's worker"

    base.OffloadingWorker, base.TransferResult, base.OffloadingSpec = (
        OffloadingWorker,
        TransferResult,
        OffloadingSpec,
    )
    cpu_spec = types.ModuleType("vllm.v1.kv_offload.cpu.spec")
    cpu_spec.CPUOffloadingSpec = CPUOffloadingSpec
    pkgs = {
        name: types.ModuleType(name)
        for name in ("vllm", "vllm.v1", "vllm.v1.kv_offload", "vllm.v1.kv_offload.cpu")
    }
    pkgs["vllm.v1.kv_offload"].base = base
    pkgs["vllm.v1.kv_offload.cpu"].spec = cpu_spec
    for name, module in {**pkgs, base.__name__: base, cpu_spec.__name__: cpu_spec}.items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(cv, "_classes", {})
    return base, CPUOffloadingSpec


def _load_spec(extra_config):
    """vLLM's OffloadingSpecFactory.create_spec, for a spec it has not registered."""
    module = importlib.import_module(extra_config["spec_module_path"])
    spec_cls = getattr(module, extra_config["spec_name"])
    base = sys.modules["vllm.v1.kv_offload.base"]
    assert issubclass(spec_cls, base.OffloadingSpec)
    config = types.SimpleNamespace(extra_config=extra_config, cache=types.SimpleNamespace(blocks_per_chunk=4))
    return spec_cls(config)


@pytest.mark.parametrize("chunks_attr", ["num_chunks", "num_blocks"])
def test_vllm_loads_the_spec_by_module_path_and_gets_cupy_swaps_worker(monkeypatch, chunks_attr):
    base, cpu_spec = _stand_in_vllm(monkeypatch, chunks_attr)
    made = []
    monkeypatch.setattr(cv, "make_worker", lambda *a, **kw: made.append((a, kw)) or "cupy_swap's worker")
    extra = {
        "spec_name": "CupySwapOffloadingSpec",
        "spec_module_path": "cupy_swap.engines.vllm",
        "cpu_bytes_to_use": 1 << 30,
        "cupy_swap_max_rows": "4096",
    }
    spec = _load_spec(extra)
    assert isinstance(spec, cpu_spec) and spec.get_manager() == "vLLM's manager"
    assert spec.get_worker("kv caches") == "cupy_swap's worker" == spec.get_worker("kv caches")  # made once
    ((args, kw),) = made
    assert args == ("kv caches", 4, 10) and kw == {"max_rows": 4096}
    worker_cls = cv.CupySwapOffloadingWorker
    assert issubclass(worker_cls, base.OffloadingWorker) and not inspect.isabstract(worker_cls)
    assert (
        worker_cls.__module__ == "cupy_swap.engines.vllm"
        and worker_cls.__qualname__ == "CupySwapOffloadingWorker"
    )


@pytest.mark.parametrize(
    "setting, words",
    [
        (dict(config=dict(per_group_pools=True)), "per_group_cpu_pools"),
        (dict(spec=dict(arena="vLLM's GroupArena")), "per_group_cpu_pools"),
        (dict(config=dict(replicated_layout=True)), "replicated layout"),
        (dict(config=dict(replicated_layout=True), spec=dict(replicated_layout=False)), None),
        (dict(spec=dict(replicated_layout=True)), "replicated layout"),
        (dict(spec=dict(compact_layout_requested=True)), "enable_compact_layout"),
        (dict(config=dict(canonical_layout=True)), "canonical_layout"),
        (dict(config=dict(per_group_pools=False, replicated_layout=False, canonical_layout=False)), None),
    ],
    ids=["per_group", "arena", "replicated", "replicated_off_here", "replicated_spec", "compact", "canonical",
         "direct"],
)  # fmt: skip
def test_get_worker_refuses_the_cpu_layouts_it_does_not_keep(monkeypatch, setting, words):
    """vLLM's CPUOffloadingSpec (cpu/spec.py as stored) has per-group pools
    (``config.per_group_pools``; chunk ids are rows of a shared arena) and
    the replicated layout (``config.replicated_layout``, the spec's own
    ``replicated_layout`` where it has one: one copy for every rank, sized
    once, stored by rank 0).  The worker keeps neither: get_worker refuses
    them before making anything, naming the setting and what it keeps."""
    _stand_in_vllm(monkeypatch)
    made = []
    monkeypatch.setattr(cv, "make_worker", lambda *a, **kw: made.append(a) or "cupy_swap's worker")
    spec = _load_spec({"spec_name": "CupySwapOffloadingSpec", "spec_module_path": "cupy_swap.engines.vllm"})
    for name, value in setting.get("config", {}).items():
        setattr(spec.config, name, value)
    for name, value in setting.get("spec", {}).items():
        setattr(spec, name, value)
    if words is None:
        assert spec.get_worker("kv caches") == "cupy_swap's worker" and len(made) == 1
        return
    with pytest.raises(NotImplementedError, match=words) as raised:
        spec.get_worker("kv caches")
    assert "direct per-rank CPU layout only" in str(raised.value) and made == []


def test_the_worker_class_serves_vllms_results(monkeypatch):
    base, _ = _stand_in_vllm(monkeypatch)
    rng = np.random.default_rng(8)
    gpu, cpu = _caches(rng, [64], 16, 16, 1)
    sw = StandInSwapper()
    sw.gpu(*gpu)
    worker = cv.CupySwapOffloadingWorker(
        gpu, cpu, [[(0, 64)]], 1, swapper=sw, make_result=base.TransferResult
    )
    worker.submit_store(1, Spec([1], [1], [0]), Spec([2]))
    (result,) = worker.get_finished()
    assert result == base.TransferResult(job_id=1, success=True, transfer_size=64, transfer_time=None)


def test_importing_the_adapters_needs_no_engine_no_torch_and_no_cupy():
    code = (
        "import sys\n"
        "for name in ('torch', 'vllm', 'sglang', 'sgl_kernel', 'cupy'): sys.modules[name] = None\n"
        "import cupy_swap.engines.vllm as v, cupy_swap.engines.sglang as s\n"
        "from cupy_swap import engines\n"
        "assert engines.vllm is v and engines.sglang is s\n"
        "try:\n"
        "    v.CupySwapOffloadingSpec\n"
        "except ImportError as e:\n"
        "    print(e)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert "needs vLLM" in r.stdout and cv.VLLM_COMMIT[:12] in r.stdout


def test_against_vllms_own_classes():
    base = pytest.importorskip(
        "vllm.v1.kv_offload.base", reason="vLLM is not installed here (pip install vllm)"
    )
    if not hasattr(base, "OffloadingWorker") or not hasattr(base.OffloadingWorker, "submit_store"):
        pytest.skip("this vLLM predates OffloadingWorker.submit_store (cupy_swap follows vLLM 0.33.0)")
    spec_cls, worker_cls = cv.CupySwapOffloadingSpec, cv.CupySwapOffloadingWorker
    assert issubclass(spec_cls, base.OffloadingSpec) and issubclass(worker_cls, base.OffloadingWorker)
    assert not inspect.isabstract(worker_cls)
    for name in ("submit_store", "submit_load", "get_finished", "wait", "shutdown"):
        ours = list(inspect.signature(getattr(worker_cls, name)).parameters)
        theirs = list(inspect.signature(getattr(base.OffloadingWorker, name)).parameters)
        assert ours == theirs, name
    assert list(inspect.signature(spec_cls.get_worker).parameters) == ["self", "kv_caches"]
    fields = {f.name for f in __import__("dataclasses").fields(base.TransferResult)}
    assert {"job_id", "success", "transfer_size", "transfer_time"} <= fields


def test_vllms_own_spec_sizes_the_cpu_chunks_cupy_swaps_worker_gets(monkeypatch):
    """Made from vLLM's own ``OffloadingConfig`` (vLLM 0.33.0's dataclasses),
    the spec is vLLM's ``CPUOffloadingSpec`` sizing the CPU chunks from
    ``cpu_bytes_to_use``; its ``get_worker`` hands cupy_swap's worker that
    count (``num_chunks``; ``num_blocks`` before 0.33.0, where this
    adapter once looked only)."""
    config = pytest.importorskip(
        "vllm.v1.kv_offload.config", reason="vLLM is not installed here (pip install vllm)"
    )
    import dataclasses

    needed = {
        "OffloadingConfig",
        "OffloadingParallelConfig",
        "OffloadingCacheConfig",
        "OffloadingModelConfig",
    }
    if not needed <= set(vars(config)):
        pytest.skip("this vLLM's OffloadingConfig predates 0.33.0's (cupy_swap follows vLLM 0.33.0)")
    ones = {"world_size", "tp_size", "pp_size", "pcp_size", "dcp_size", "data_parallel_size"}
    values = {"data_parallel_rank_local": None, "is_parallelism_agnostic": True}
    parallel = config.OffloadingParallelConfig(
        **{
            f.name: values.get(f.name, 1 if f.name in ones else 0)
            for f in dataclasses.fields(config.OffloadingParallelConfig)
        }
    )
    extra = {
        "spec_name": "CupySwapOffloadingSpec",
        "spec_module_path": "cupy_swap.engines.vllm",
        "cpu_bytes_to_use": 1 << 30,
    }
    made = []
    monkeypatch.setattr(cv, "make_worker", lambda *a, **kw: made.append((a, kw)) or "cupy_swap's worker")
    spec = cv.CupySwapOffloadingSpec(
        config.OffloadingConfig(
            groups=(config.OffloadingGroupConfig(16, ("layer.0",), 0),),
            worker_kv_bytes_per_block=64 << 10,
            enable_kv_cache_events=False,
            extra_config=extra,
            engine_id="engine",
            model=config.OffloadingModelConfig("a model", "bfloat16"),
            cache=config.OffloadingCacheConfig(16, 4),
            parallel=parallel,
        )
    )
    assert spec.get_worker("kv caches") == "cupy_swap's worker"
    assert made == [(("kv caches", 4, (1 << 30) // ((64 << 10) * 4)), {"max_rows": None})]


# -- SGLang: sgl-kernel's transfers, from transfer.cu's address arithmetic ----------------


def kernel_copy(src, dst, src_idx, dst_idx, item, src_at, dst_at, mla=False):
    """sgl-kernel's transfer kernel, in NumPy: for each item, ``item`` bytes
    from ``src_at(buffer, index)`` to ``dst_at(buffer, index)`` (K and V)."""
    pairs = [(0, 0)] if mla else [(0, 0), (1, 1)]
    for s, d in zip(np.asarray(src_idx).tolist(), np.asarray(dst_idx).tolist()):
        for a, b in pairs:
            sb, db = src[a].reshape(-1).view(np.uint8), dst[b].reshape(-1).view(np.uint8)
            so, do = src_at(s), dst_at(d)
            db[do : do + item] = sb[so : so + item]


def lf(item):  # get_global_offset_lf, layer 0 of a layer's own buffer
    return lambda p: p * item


def pf(item, layout_dim, layer):  # get_global_offset_pf
    return lambda p: p * layout_dim + layer * item


def ph_heads(src, dst, src_idx, dst_idx, item, heads, page, layout_dim, layer, to_host):
    """transfer_page_head_kernel_impl: per item and head, head bytes between
    ``get_global_offset_ph`` and ``get_global_offset_per_head_lf``."""
    hb = item // heads

    def ph(p, h):
        return (
            p // page * page * layout_dim
            + layout_dim // heads * h * page
            + p % page * layout_dim // heads
            + layer * hb
        )

    def per_head_lf(p, h):
        return p * item + hb * h

    for s, d in zip(np.asarray(src_idx).tolist(), np.asarray(dst_idx).tolist()):
        for kv in range(2):
            sb, db = src[kv].reshape(-1).view(np.uint8), dst[kv].reshape(-1).view(np.uint8)
            for h in range(heads):
                so, do = (per_head_lf(s, h), ph(d, h)) if to_host else (ph(s, h), per_head_lf(d, h))
                db[do : do + hb] = sb[so : so + hb]


H, D, PAGE, LAYERS = 4, 8, 4, 3  # heads, head_dim (bf16 as int16), tokens per page, layers
ITEM = H * D * 2
SLOTS = 32  # tokens per pool


@pytest.fixture
def sglang_swapper():
    sw = StandInSwapper()
    sg.use_swapper(sw)
    yield sw
    sg.use_swapper(None)


def _pool(rng, shape, sw=None):
    a = rng.integers(-(2**15), 2**15, shape, dtype=np.int16)
    return sw.gpu(a) if sw is not None else a


def _index_pair(rng, n, gpu_slots=SLOTS, host_slots=SLOTS):
    return rng.permutation(host_slots)[:n].astype(np.int64), rng.permutation(gpu_slots)[:n].astype(np.int64)


def test_per_layer_lf_and_pf_and_ph_to_lf_match_sgl_kernel(sglang_swapper):
    rng = np.random.default_rng(10)
    sw = sglang_swapper
    dev_k, dev_v = [_pool(rng, (SLOTS, H, D), sw) for _ in range(2)]
    layer = 1
    layouts = {
        "lf": (rng.integers(-9, 9, (2, LAYERS, SLOTS, H, D), dtype=np.int16), None),
        "pf": (rng.integers(-9, 9, (2, SLOTS, LAYERS, H, D), dtype=np.int16), None),
        "ph": (rng.integers(-9, 9, (2, SLOTS // PAGE, H, PAGE, LAYERS, D), dtype=np.int16), None),
    }
    for name, (host, _) in layouts.items():
        host_idx, dev_idx = _index_pair(rng, 9)
        want = [dev_k.copy(), dev_v.copy()]
        layout_dim = ITEM * LAYERS
        if name == "lf":
            sg.transfer_kv_per_layer(host[0, layer], dev_k, host[1, layer], dev_v, host_idx, dev_idx, ITEM)
            kernel_copy([host[0, layer], host[1, layer]], want, host_idx, dev_idx, ITEM, lf(ITEM), lf(ITEM))
        elif name == "pf":
            sg.transfer_kv_per_layer_pf_lf(
                host[0], dev_k, host[1], dev_v, host_idx, dev_idx, layer, ITEM, layout_dim
            )
            kernel_copy(
                [host[0], host[1]], want, host_idx, dev_idx, ITEM, pf(ITEM, layout_dim, layer), lf(ITEM)
            )
        else:
            sg.transfer_kv_per_layer_ph_lf(
                host[0], dev_k, host[1], dev_v, host_idx, dev_idx, layer, ITEM, layout_dim, PAGE, H
            )
            ph_heads([host[0], host[1]], want, host_idx, dev_idx, ITEM, H, PAGE, layout_dim, layer, False)
        assert np.array_equal(dev_k, want[0]) and np.array_equal(dev_v, want[1]), name
        assert len(sg.last_events()) == 1  # K and V in one call


def test_all_layer_lf_to_lf_pf_ph_match_sgl_kernel(sglang_swapper):
    rng = np.random.default_rng(11)
    sw = sglang_swapper
    dev_k = [_pool(rng, (SLOTS, H, D), sw) for _ in range(LAYERS)]
    dev_v = [_pool(rng, (SLOTS, H, D), sw) for _ in range(LAYERS)]
    layout_dim = ITEM * LAYERS
    for name in ("lf", "lf_tables", "pf", "ph"):
        dev_idx, host_idx = _index_pair(rng, 11)
        if name.startswith("lf"):
            host = np.zeros((2, LAYERS, SLOTS, H, D), np.int16)
            hk, hv = [host[0, i] for i in range(LAYERS)], [host[1, i] for i in range(LAYERS)]
            args = (dev_k, hk, dev_v, hv)
            if name == "lf_tables":  # SGLang passes tables of layer addresses
                tables = [np.array([x.__array_interface__["data"][0] for x in t], np.uint64) for t in args]
                for table, layers in zip(tables, args):
                    sg.register_layers(table, layers)
                args = tables
            sg.transfer_kv_all_layer(*args[:2], *args[2:], dev_idx, host_idx, ITEM, LAYERS)
            for j in range(LAYERS):
                want = np.zeros((2, SLOTS, H, D), np.int16)
                kernel_copy([dev_k[j], dev_v[j]], want, dev_idx, host_idx, ITEM, lf(ITEM), lf(ITEM))
                assert np.array_equal(host[:, j], want), (name, j)
            continue
        if name == "pf":
            host = np.zeros((2, SLOTS, LAYERS, H, D), np.int16)
            sg.transfer_kv_all_layer_lf_pf(
                dev_k, host[0], dev_v, host[1], dev_idx, host_idx, ITEM, layout_dim, LAYERS
            )
            want = np.zeros_like(host)
            for j in range(LAYERS):
                kernel_copy(
                    [dev_k[j], dev_v[j]], want, dev_idx, host_idx, ITEM, lf(ITEM), pf(ITEM, layout_dim, j)
                )
        else:
            host = np.zeros((2, SLOTS // PAGE, H, PAGE, LAYERS, D), np.int16)
            sg.transfer_kv_all_layer_lf_ph(
                dev_k, host[0], dev_v, host[1], dev_idx, host_idx, ITEM, layout_dim, LAYERS, PAGE, H
            )
            want = np.zeros_like(host)
            for j in range(LAYERS):
                ph_heads([dev_k[j], dev_v[j]], want, dev_idx, host_idx, ITEM, H, PAGE, layout_dim, j, True)
        assert np.array_equal(host, want), name
        assert len(sg.last_events()) == 1  # every layer's K and V in one call


def test_mla_variants_match_sgl_kernel(sglang_swapper):
    rng = np.random.default_rng(12)
    sw = sglang_swapper
    dim = 36  # kv_lora_rank + rope dims, scaled down (int16: 72-byte items)
    item = dim * 2
    dev = [_pool(rng, (SLOTS, 1, dim), sw) for _ in range(LAYERS)]
    layout_dim = item * LAYERS
    host_lf = np.zeros((LAYERS, SLOTS, 1, dim), np.int16)
    dev_idx, host_idx = _index_pair(rng, 7)
    sg.transfer_kv_all_layer_mla(dev, [host_lf[i] for i in range(LAYERS)], dev_idx, host_idx, item, LAYERS)
    for j in range(LAYERS):
        want = np.zeros((SLOTS, 1, dim), np.int16)
        kernel_copy([dev[j]], [want], dev_idx, host_idx, item, lf(item), lf(item), mla=True)
        assert np.array_equal(host_lf[j], want)
    host_pf = np.zeros((SLOTS, LAYERS, 1, dim), np.int16)
    sg.transfer_kv_all_layer_mla_lf_pf(dev, host_pf, dev_idx, host_idx, item, layout_dim, LAYERS)
    want = np.zeros_like(host_pf)
    for j in range(LAYERS):
        kernel_copy([dev[j]], [want], dev_idx, host_idx, item, lf(item), pf(item, layout_dim, j), mla=True)
    assert np.array_equal(host_pf, want)
    back_idx = rng.permutation(SLOTS)[:7].astype(np.int64)
    for j in range(LAYERS):
        before = dev[j].copy()
        sg.transfer_kv_per_layer_mla_pf_lf(host_pf, dev[j], host_idx, back_idx, j, item, layout_dim)
        kernel_copy(
            [host_pf], [before], host_idx, back_idx, item, pf(item, layout_dim, j), lf(item), mla=True
        )
        assert np.array_equal(dev[j], before)
        sg.transfer_kv_per_layer_mla(host_lf[j], dev[j], host_idx, dev_idx, item)
        kernel_copy([host_lf[j]], [before], host_idx, dev_idx, item, lf(item), lf(item), mla=True)
        assert np.array_equal(dev[j], before)


def test_direct_variants_match_sgl_kernel(sglang_swapper):
    """transfer_kv_direct copies tokens of every layer; the page-first direct
    ones copy whole pages, from each page's first index (transfer.cu)."""
    rng = np.random.default_rng(13)
    sw = sglang_swapper
    dev = [_pool(rng, (SLOTS, H, D), sw) for _ in range(2 * LAYERS)]  # K layers, then V layers
    host_lf = [np.zeros((SLOTS, H, D), np.int16) for _ in dev]
    dev_idx, host_idx = np.arange(8, 16, dtype=np.int64), np.arange(20, 28, dtype=np.int64)
    sg.transfer_kv_direct(dev, host_lf, dev_idx, host_idx, PAGE)
    for d, h in zip(dev, host_lf):
        assert np.array_equal(h[20:28], d[8:16]) and not h[:20].any()
    pages = SLOTS // PAGE
    host = np.zeros((2, pages, LAYERS, PAGE, H, D), np.int16)
    dev_tokens = np.concatenate([np.arange(4, 8), np.arange(17, 21)]).astype(np.int64)  # unaligned page start
    host_tokens = np.concatenate([np.arange(12, 16), np.arange(0, 4)]).astype(np.int64)  # pages 3 and 0
    sg.transfer_kv_all_layer_direct_lf_pf(dev, [host[0], host[1]], dev_tokens, host_tokens, PAGE)
    assert len(sg.last_events()) == 1
    for j in range(LAYERS):
        for kv in range(2):
            assert np.array_equal(host[kv, 3, j], dev[kv * LAYERS + j][4:8])
            assert np.array_equal(host[kv, 0, j], dev[kv * LAYERS + j][17:21])
    assert not host[:, [1, 2, 4, 5, 6, 7]].any()
    back = [np.zeros((SLOTS, H, D), np.int16) for _ in range(2)]
    sw.gpu(*back)
    sg.transfer_kv_per_layer_direct_pf_lf(
        [host[0], host[1]], back, host_tokens, np.arange(9, 17, dtype=np.int64), 2, PAGE
    )
    assert np.array_equal(back[0][9:13], host[0, 3, 2]) and np.array_equal(back[1][13:17], host[1, 0, 2])
    assert not back[0][:9].any() and not back[0][17:].any()


def test_sglang_checks_refusals_and_bad_indices(sglang_swapper):
    rng = np.random.default_rng(14)
    sw = sglang_swapper
    dev_k, dev_v = [_pool(rng, (SLOTS, H, D), sw) for _ in range(2)]
    host = np.zeros((2, LAYERS, SLOTS, H, D), np.int16)
    ok = np.arange(4, dtype=np.int64)
    with pytest.raises(ValueError, match="divisible by 8"):
        sg.transfer_kv_per_layer(dev_k, host[0, 0], dev_v, host[1, 0], ok, ok, 12)
    with pytest.raises(ValueError, match="same length"):
        sg.transfer_kv_per_layer(dev_k, host[0, 0], dev_v, host[1, 0], ok, ok[:3], ITEM)
    with pytest.raises(TypeError, match="must be of type long"):
        sg.transfer_kv_per_layer(dev_k, host[0, 0], dev_v, host[1, 0], ok.astype(np.int32), ok, ITEM)
    with pytest.raises(ValueError, match="divisible by page size"):
        sg.transfer_kv_direct([dev_k], [host[0, 0]], ok[:3], ok[:3], PAGE)
    with pytest.raises(LookupError, match="register_layers"):
        sg.transfer_kv_all_layer(np.zeros(1, np.uint64), [host[0, 0]], [dev_v], [host[1, 0]], ok, ok, ITEM, 1)
    with pytest.raises(ValueError, match="does not match num_layers"):
        sg.transfer_kv_all_layer([dev_k], [host[0, 0]], [dev_v], [host[1, 0]], ok, ok, ITEM, 2)
    with pytest.raises(ValueError, match="not those of the 1 buffers"):
        sg.register_layers(np.zeros(1, np.uint64), [dev_k])
    sg.transfer_kv_per_layer(dev_k, host[0, 0], dev_v, host[1, 0], ok[:0], ok[:0], ITEM)  # empty: nothing
    assert sg.last_events() == [] and sw.calls == []
    bad = np.array([1, SLOTS + 3], np.int64)  # token 35 of a 32-token pool
    sg.transfer_kv_per_layer(dev_k, host[0, 0], dev_v, host[1, 0], bad, ok[:2], ITEM)
    (event,) = sg.last_events()
    with pytest.raises(IndexError, match="out of range"):
        event.synchronize()
    assert not host.any()  # nothing was copied
    neg = np.array([-1, 2], np.int64)  # sgl-kernel skips it; here it is out of range
    sg.transfer_kv_per_layer(dev_k, host[0, 0], dev_v, host[1, 0], neg, ok[:2], ITEM)
    with pytest.raises(IndexError):
        sg.last_events()[0].synchronize()
    assert not host.any()


def test_rows_longer_than_one_call_are_split(sglang_swapper):
    rng = np.random.default_rng(15)
    sw = sglang_swapper
    dev = [_pool(rng, (200, H, D), sw) for _ in range(2)]
    host = np.zeros((2, 200, H, D), np.int16)
    idx = rng.permutation(200).astype(np.int64)[:150]
    sg.transfer_kv_per_layer(dev[0], host[0], dev[1], host[1], idx, idx, ITEM)
    assert [c[4] for c in sw.calls] == [64, 64, 22]
    assert np.array_equal(host[0][idx], dev[0][idx]) and np.array_equal(host[1][idx], dev[1][idx])


def test_the_modules_own_swapper_queues_a_layer_by_layer_load(monkeypatch):
    """SGLang queues a load layer by layer (61 layers of one launch, 32 of
    three at 20,000 tokens): the module's own swapper keeps DEFAULT_RING launches queued
    before a call waits for the GPU (16, the BlockSwapper default, made
    the host wait for the copies: NOTES 79)."""
    from cupy_swap import swapper

    made = []
    monkeypatch.setattr(swapper, "BlockSwapper", lambda **kw: made.append(kw) or object())
    monkeypatch.setattr(sg, "_swappers", {})
    monkeypatch.setattr(sg, "_override", [None])
    sg._swapper_for([np.zeros(4)])
    assert made == [{"max_blocks": sg.DEFAULT_MAX_ROWS, "device": None, "ring_size": sg.DEFAULT_RING}]
    assert sg.DEFAULT_RING >= max(61, 32 * 3)


def test_a_split_transfer_reads_its_index_bounds_once_per_index_tensors(monkeypatch):
    """SGLang loads layer by layer with the same index tensors: their bounds
    are read back (a stream synchronize on the GPU) at the first layer only,
    again when torch counts an in-place write to them, and for new tensors."""
    torch = pytest.importorskip("torch", reason="torch is not installed here (the torch extra)")
    reads = []
    bounds = sg._bounds
    monkeypatch.setattr(sg, "_bounds", lambda s, d: reads.append(1) or bounds(s, d))
    monkeypatch.setattr(sg, "_state", threading.local())
    idx, other = torch.tensor([5, 0, 13, 7]), torch.tensor([2, 9, 1, 4])
    for _ in range(4):  # four layers
        sg._check_split(idx, other, (14, 10))
    assert len(reads) == 1
    other.add_(0)  # an in-place write: checked again
    sg._check_split(idx, other, (14, 10))
    sg._check_split(idx.clone(), other, (14, 10))  # other tensors: checked again
    assert len(reads) == 3
    other[1] = 10  # out of range now, and counted by torch
    with pytest.raises(IndexError, match="destination row 10"):
        sg._check_split(idx, other, (14, 10))
    with pytest.raises(IndexError, match="destination row 10"):  # a failed check is not remembered
        sg._check_split(idx, other, (14, 10))
    with torch.inference_mode():  # as SGLang's scheduler may make them: no version to read
        idx, other = torch.tensor([5, 0, 13, 7]), torch.tensor([2, 9, 1, 4])
    for _ in range(2):
        sg._check_split(idx, other, (14, 10))
    assert len(reads) == 7  # checked at every call


def test_a_split_page_head_load_reads_its_bounds_once_for_all_layers(sglang_swapper, monkeypatch):
    """A page-head load's source rows are made from the indices at the first
    layer and kept (one tensor for every layer), so the split check, kept by
    the rows it read, reads the bounds at the first layer only (NOTES 82: a
    read per layer made 1,250 pages wait 68 ms on the host), and every
    layer's bytes still match sgl-kernel's."""
    torch = pytest.importorskip("torch", reason="torch is not installed here (the torch extra)")
    rng = np.random.default_rng(23)
    sw = sglang_swapper
    reads = []
    bounds = sg._bounds
    monkeypatch.setattr(sg, "_bounds", lambda s, d: reads.append(1) or bounds(s, d))
    monkeypatch.setattr(sg, "_state", threading.local())
    slots = 160  # 40 pages of 4 tokens: 150 rows take three calls of 64
    host = rng.integers(-9, 9, (2, slots // PAGE, H, PAGE, LAYERS, D), dtype=np.int16)
    dev_k, dev_v = [_pool(rng, (slots, H, D), sw) for _ in range(2)]
    host_idx, dev_idx = (torch.from_numpy(a) for a in _index_pair(rng, 150, slots, slots))
    layout_dim = ITEM * LAYERS
    for layer in range(LAYERS):
        want = [dev_k.copy(), dev_v.copy()]
        sg.transfer_kv_per_layer_ph_lf(
            host[0], dev_k, host[1], dev_v, host_idx, dev_idx, layer, ITEM, layout_dim, PAGE, H
        )
        ph_heads([host[0], host[1]], want, host_idx, dev_idx, ITEM, H, PAGE, layout_dim, layer, False)
        assert np.array_equal(dev_k, want[0]) and np.array_equal(dev_v, want[1]), layer
        assert len(sg.last_events()) == 3  # 150 rows (one per token, a part per head): three calls
    assert len(reads) == 1


def test_a_page_head_loads_rows_are_made_once_per_index_tensor(sglang_swapper, monkeypatch):
    """A page-head load makes its source rows (four GPU operations, about 59
    µs of host time: NOTES 86) at its first layer and keeps them for the
    next layers; it makes them again after an in-place write torch counts,
    for other index tensors, for other page shapes, and at every call for
    inference tensors and NumPy arrays (no version to read).  Every layer's
    bytes match sgl-kernel's, the rewritten indices' included."""
    torch = pytest.importorskip("torch", reason="torch is not installed here (the torch extra)")
    rng = np.random.default_rng(25)
    sw = sglang_swapper
    made = []
    page_rows = sg._page_rows
    monkeypatch.setattr(sg, "_page_rows", lambda *a: made.append(1) or page_rows(*a))
    monkeypatch.setattr(sg, "_state", threading.local())
    host = rng.integers(-9, 9, (2, SLOTS // PAGE, H, PAGE, LAYERS, D), dtype=np.int16)
    dev_k, dev_v = [_pool(rng, (SLOTS, H, D), sw) for _ in range(2)]
    layout_dim = ITEM * LAYERS

    def load(host_idx, dev_idx, page=PAGE, heads=H, layers=range(LAYERS)):
        for layer in layers:
            want = [dev_k.copy(), dev_v.copy()]
            sg.transfer_kv_per_layer_ph_lf(
                host[0], dev_k, host[1], dev_v, host_idx, dev_idx, layer, ITEM, layout_dim, page, heads
            )
            if (page, heads) == (PAGE, H):
                ph_heads([host[0], host[1]], want, host_idx, dev_idx, ITEM, H, PAGE, layout_dim, layer, False)
                assert np.array_equal(dev_k, want[0]) and np.array_equal(dev_v, want[1]), layer

    host_idx, dev_idx = (torch.from_numpy(a) for a in _index_pair(rng, 12))
    load(host_idx, dev_idx)
    assert len(made) == 1  # every layer
    host_idx[:] = torch.from_numpy(rng.permutation(SLOTS)[:12])  # an in-place write torch counts
    load(host_idx, dev_idx)
    load(host_idx.clone(), dev_idx)  # another tensor
    assert len(made) == 3
    load(host_idx, dev_idx, page=2 * PAGE, heads=H // 2, layers=[0])  # another page shape
    load(host_idx, dev_idx, layers=[0])
    assert len(made) == 5
    load(host_idx.numpy(), dev_idx.numpy())
    assert len(made) == 5 + LAYERS
    with torch.inference_mode():
        host_idx, dev_idx = (torch.from_numpy(a) for a in _index_pair(rng, 12))
    load(host_idx, dev_idx)
    assert len(made) == 5 + 2 * LAYERS


def test_a_huge_index_never_wraps_into_a_page_head_row(sglang_swapper):
    """The page-head rows multiply the indices: an index near 2**62 once
    wrapped an int64 back to a row in range (2**62 + 3 copied token 3).
    Clipped first, it stays out of range and copies nothing."""
    rng = np.random.default_rng(24)
    sw = sglang_swapper
    host = rng.integers(-9, 9, (2, SLOTS // PAGE, H, PAGE, LAYERS, D), dtype=np.int16)
    dev_k, dev_v = [_pool(rng, (SLOTS, H, D), sw) for _ in range(2)]
    before = dev_k.copy(), dev_v.copy()
    for huge in (2**62 + 3, -(2**62), 2**63 - 1):
        bad = np.array([huge, 1], np.int64)
        sg.transfer_kv_per_layer_ph_lf(
            host[0], dev_k, host[1], dev_v, bad, np.array([0, 1], np.int64), 0, ITEM, ITEM * LAYERS, PAGE, H
        )
        with pytest.raises(IndexError, match="out of range"):
            sg.last_events()[0].synchronize()
        assert np.array_equal(dev_k, before[0]) and np.array_equal(dev_v, before[1]), huge
    for page_size, heads in ((4, 4), (16, 8), (1, 64)):
        rows = sg._page_rows(np.array([2**62 + 3, -(2**62), 5], np.int64), page_size, heads)
        assert (
            rows[0] > 2**40 and rows[1] < 0 and rows[2] == 5 // page_size * page_size * heads + 5 % page_size
        )


def test_a_bad_index_in_any_call_of_a_split_transfer_copies_nothing(sglang_swapper):
    """A transfer of several op calls (rows past one call's, or parts past
    one op's) is checked whole before its first launch: a bad index in any
    slice raises IndexError from the function and nothing is copied (it
    used to copy the slices before the bad one, and tell the bad one only
    at the op's next call)."""
    rng = np.random.default_rng(18)
    sw = sglang_swapper
    dev = [_pool(rng, (200, H, D), sw) for _ in range(2)]
    host = np.zeros((2, 200, H, D), np.int16)
    idx = rng.permutation(200).astype(np.int64)[:150]  # 3 calls: 64, 64, 22 rows
    for at, side, value in ((100, "source", 200), (149, "source", -1), (10, "destination", 230)):
        bad = idx.copy()
        bad[at] = value
        src, dst = (bad, idx) if side == "source" else (idx, bad)
        with pytest.raises(IndexError, match=f"{side} row {value} .*nothing was copied"):
            sg.transfer_kv_per_layer(dev[0], host[0], dev[1], host[1], src, dst, ITEM)
        assert sw.calls == [] and sg.last_events() == [] and not host.any()
    sg.transfer_kv_per_layer(dev[0], host[0], dev[1], host[1], idx, idx, ITEM)  # nothing left pending
    assert [c[4] for c in sw.calls] == [64, 64, 22] and np.array_equal(host[0][idx], dev[0][idx])
    sw.calls.clear()
    sw.max_parts = 1  # K and V in two ops: two calls for two rows
    sg.use_swapper(sw)
    small = np.array([3, 200], np.int64)
    with pytest.raises(IndexError, match="source row 200 .*nothing was copied"):
        sg.transfer_kv_per_layer(dev[0], host[0], dev[1], host[1], small, np.array([3, 4], np.int64), ITEM)
    assert sw.calls == []


def test_a_transfer_takes_the_swapper_use_swapper_names_last():
    """The kept ops are keyed by buffers and parameters, not by swapper:
    use_swapper() drops them, so the next transfer of the same buffers
    prepares on the new one."""
    rng = np.random.default_rng(26)
    first, second = StandInSwapper(), StandInSwapper()
    host = np.zeros((2, SLOTS, H, D), np.int16)
    dev = [_pool(rng, (SLOTS, H, D)) for _ in range(2)]
    idx = np.arange(3, dtype=np.int64)
    try:
        for sw in (first, second, first):
            sw.gpu(*dev)
            sg.use_swapper(sw)
            host[:] = 0
            sg.transfer_kv_per_layer(dev[0], host[0], dev[1], host[1], idx, idx, ITEM)
            assert len(sw.calls) == 1 and np.array_equal(host[0][idx], dev[0][idx])
            sw.calls.clear()
    finally:
        sg.use_swapper(None)


def test_a_one_call_failure_is_told_by_its_event_or_the_same_ops_next_call(sglang_swapper):
    """One op call: the function returns; the failure is raised by the
    call's event, or (nobody synchronizing it, as SGLang) once by the next
    call of the same op (same function, buffers, parameters: the next
    transfer of that layer), which copies nothing of its own; another op's
    calls are not affected."""
    rng = np.random.default_rng(19)
    sw = sglang_swapper
    dev = [_pool(rng, (SLOTS, H, D), sw) for _ in range(4)]
    host = np.zeros((2, SLOTS, H, D), np.int16)
    ok, bad = np.arange(2, dtype=np.int64), np.array([1, SLOTS + 3], np.int64)
    sg.transfer_kv_per_layer(dev[0], host[0], dev[1], host[1], bad, ok, ITEM)  # returns
    sg.transfer_kv_per_layer(dev[2], host[0], dev[3], host[1], ok, ok, ITEM)  # another layer: copies
    assert np.array_equal(host[0][:2], dev[2][:2])
    host[:] = 0
    with pytest.raises(IndexError, match="earlier swap .*this call was not launched"):
        sg.transfer_kv_per_layer(dev[0], host[0], dev[1], host[1], ok, ok, ITEM)  # the same op
    assert not host.any()
    sg.transfer_kv_per_layer(dev[0], host[0], dev[1], host[1], ok, ok, ITEM)  # told once
    assert np.array_equal(host[0][:2], dev[0][:2])


class _DevicePool:
    def __init__(self, k, v):
        self.k_buffer, self.v_buffer = k, v
        self.k_data_ptrs = np.array([x.__array_interface__["data"][0] for x in k], np.uint64)
        self.v_data_ptrs = np.array([x.__array_interface__["data"][0] for x in v], np.uint64)


def _stand_in_host_pool_module():
    """A module shaped as SGLang's pool_host/mha.py: kvcacheio names imported
    at module level, a host pool class that calls them by those names (its
    JIT path first when allowed), layer_first layout."""
    module = types.ModuleType("stand_in_sglang_mha")

    def never(*a, **kw):
        raise AssertionError("sgl-kernel's function was called")

    for name in sg.KERNEL_FUNCTIONS + sg.DIRECT_FUNCTIONS:
        setattr(module, name, never)

    class MHATokenToKVPoolHost:
        def __init__(self, device_pool, layers):
            self.device_pool, self.layer_num, self.can_use_jit = device_pool, layers, True
            self.kv_buffer = np.zeros((2, layers, SLOTS, H, D), np.int16)
            self.k_data_refs = [self.kv_buffer[0, i] for i in range(layers)]
            self.v_data_refs = [self.kv_buffer[1, i] for i in range(layers)]
            self.k_data_ptrs = np.array(
                [x.__array_interface__["data"][0] for x in self.k_data_refs], np.uint64
            )
            self.v_data_ptrs = np.array(
                [x.__array_interface__["data"][0] for x in self.v_data_refs], np.uint64
            )
            self.token_stride_size = ITEM

        def backup_from_device_all_layer(self, device_pool, host_indices, device_indices, io_backend):
            assert io_backend == "kernel"
            if self.can_use_jit:
                raise AssertionError("SGLang's JIT kernel was called")
            module.transfer_kv_all_layer(
                src_k_layers=device_pool.k_data_ptrs,
                dst_k_layers=self.k_data_ptrs,
                src_v_layers=device_pool.v_data_ptrs,
                dst_v_layers=self.v_data_ptrs,
                src_indices=device_indices,
                dst_indices=host_indices,
                item_size=self.token_stride_size,
                num_layers=self.layer_num,
            )

        def load_to_device_per_layer(self, device_pool, host_indices, device_indices, layer_id, io_backend):
            module.transfer_kv_per_layer(
                src_k=self.kv_buffer[0, layer_id],
                dst_k=device_pool.k_buffer[layer_id],
                src_v=self.kv_buffer[1, layer_id],
                dst_v=device_pool.v_buffer[layer_id],
                src_indices=host_indices,
                dst_indices=device_indices,
                item_size=self.token_stride_size,
            )

    module.MHATokenToKVPoolHost = MHATokenToKVPoolHost
    return module


def test_the_patch_routes_a_host_pools_kernel_backend_here_and_undoes(sglang_swapper):
    rng = np.random.default_rng(16)
    sw = sglang_swapper
    module = _stand_in_host_pool_module()
    cls, original_init = module.MHATokenToKVPoolHost, module.MHATokenToKVPoolHost.__init__
    patch = sg.patch_host_pools([module])
    assert module.transfer_kv_all_layer is sg.transfer_kv_all_layer
    assert module.transfer_kv_direct is not sg.transfer_kv_direct  # direct=False leaves them
    dev = _DevicePool(*[[_pool(rng, (SLOTS, H, D), sw) for _ in range(LAYERS)] for _ in range(2)])
    pool = cls(dev, LAYERS)
    assert pool.can_use_jit is False
    dev_idx, host_idx = _index_pair(rng, 8)
    pool.backup_from_device_all_layer(dev, host_idx, dev_idx, "kernel")
    for j in range(LAYERS):
        assert np.array_equal(pool.kv_buffer[0, j][host_idx], dev.k_buffer[j][dev_idx])
        assert np.array_equal(pool.kv_buffer[1, j][host_idx], dev.v_buffer[j][dev_idx])
    for j in range(LAYERS):
        dev.k_buffer[j][:] = 0
        pool.load_to_device_per_layer(dev, host_idx, dev_idx, j, "kernel")
        assert np.array_equal(dev.k_buffer[j][dev_idx], pool.kv_buffer[0, j][host_idx])
    assert sg.patch_host_pools([module]).classes == []  # already adopting: not wrapped twice
    patch.undo()
    assert cls.__init__ is original_init and module.transfer_kv_all_layer is not sg.transfer_kv_all_layer


def test_against_sgl_kernels_own_signatures():
    kvcacheio = pytest.importorskip(
        "sgl_kernel.kvcacheio", reason="sgl-kernel is not installed here (pip install sgl-kernel)"
    )
    for name in sg.KERNEL_FUNCTIONS + sg.DIRECT_FUNCTIONS:
        theirs = getattr(kvcacheio, name, None)
        if theirs is None:
            continue  # a function this sgl-kernel release does not have
        ours, theirs = inspect.signature(getattr(sg, name)), inspect.signature(theirs)
        assert list(ours.parameters) == list(theirs.parameters), name
        for p in theirs.parameters.values():
            if p.default is not inspect.Parameter.empty and p.name != "num_warps_per_block":
                assert ours.parameters[p.name].default == p.default, (name, p.name)


def test_our_signatures_are_sgl_kernels_as_read():
    """The names and parameters of sgl-kernel's kvcacheio.py at 0ba3cdd, as
    SGLang's host pools call them by keyword."""
    want = {
        "transfer_kv_per_layer": "src_k dst_k src_v dst_v src_indices dst_indices item_size",
        "transfer_kv_per_layer_pf_lf": "src_k dst_k src_v dst_v src_indices dst_indices layer_id item_size src_layout_dim",
        "transfer_kv_per_layer_ph_lf": "src_k dst_k src_v dst_v src_indices dst_indices layer_id item_size "
        "src_layout_dim page_size head_num",
        "transfer_kv_all_layer": "src_k_layers dst_k_layers src_v_layers dst_v_layers src_indices dst_indices "
        "item_size num_layers",
        "transfer_kv_all_layer_lf_pf": "src_k_layers dst_k src_v_layers dst_v src_indices dst_indices item_size "
        "dst_layout_dim num_layers",
        "transfer_kv_all_layer_lf_ph": "src_k_layers dst_k src_v_layers dst_v src_indices dst_indices item_size "
        "dst_layout_dim num_layers page_size head_num",
        "transfer_kv_per_layer_mla": "src dst src_indices dst_indices item_size",
        "transfer_kv_per_layer_mla_pf_lf": "src dst src_indices dst_indices layer_id item_size src_layout_dim",
        "transfer_kv_all_layer_mla": "src_layers dst_layers src_indices dst_indices item_size num_layers",
        "transfer_kv_all_layer_mla_lf_pf": "src_layers dst src_indices dst_indices item_size dst_layout_dim num_layers",
        "transfer_kv_direct": "src_layers dst_layers src_indices dst_indices page_size",
        "transfer_kv_per_layer_direct_pf_lf": "src_ptrs dst_ptrs src_indices dst_indices layer_id page_size",
        "transfer_kv_all_layer_direct_lf_pf": "src_ptrs dst_ptrs src_indices dst_indices page_size",
    }
    for name, params in want.items():
        got = list(inspect.signature(getattr(sg, name)).parameters)
        tail = ["block_quota", "num_warps_per_block"] if "direct" not in name else []
        assert got == params.split() + tail, name


def test_torch_buffers_and_indices_are_viewed_as_numpys_are():
    """The byte views and index arithmetic on torch tensors (CPU here; CUDA
    tensors take the same calls) agree with NumPy's."""
    torch = pytest.importorskip("torch", reason="torch is not installed here (the torch extra)")
    host = torch.arange(2 * 6 * 5 * 4, dtype=torch.int16).reshape(2, 6, 5, 4)  # [kv, tokens, layers, dim]
    for buf in (host[0], host[1], host[1, 2:]):
        for offset, stride, block in ((0, 40, 8), (16, 40, 8), (0, 8, 8), (8, 8, 24)):
            ours, numpys = sg._rows(buf, offset, stride, block), sg._rows(buf.numpy(), offset, stride, block)
            assert ours.dtype == torch.uint8 and np.array_equal(ours.numpy(), numpys)
    view = sg._rows(host[1], 8, 40, 8)
    view[2] = 0  # a view: the tensor changes
    assert not host[1, 2, 1].any() and host[1, 2, 0].all()
    idx = torch.tensor([5, 0, 13, 7], dtype=torch.int64)
    assert np.array_equal(sg._page_head_rows(idx, 4, 3).numpy(), sg._page_head_rows(idx.numpy(), 4, 3))
    assert np.array_equal(sg._head_rows(idx, 3).numpy(), sg._head_rows(idx.numpy(), 3))
    other = torch.tensor([2, 9, 1, 4], dtype=torch.int64)
    assert sg._bounds(idx, other) == sg._bounds(idx.numpy(), other.numpy()) == [0, 13, 1, 9]
    assert not sg._capturing(idx)  # a CPU tensor: no stream to ask
    with pytest.raises(IndexError, match="destination row 9 .*nothing was copied"):
        sg._check_split(idx, other, (14, 9))
    table = torch.tensor([b.data_ptr() for b in host], dtype=torch.uint64)
    layers = list(host)
    sg.register_layers(table, layers)
    assert all(a is b for a, b in zip(sg._layers(table, 2, "t"), layers))
