"""``bench --engines``' adapter rows (issue 51, item 4) on the CPU: the
shapes, the plans of a transfer (vLLM's specs and the chunk rows they mean,
SGLang's page indices), vLLM's worker pattern (its pointer lists replayed
with memmove, its streams, waits, pools and results with a stand-in kit),
SGLang's kernel as transcribed (its address modes, argument list and launch,
replayed in Python over torch CPU tensors, called by the stand-in host pool
as SGLang's host pool calls it, checked against the layouts' own indexing),
the host pool's calls against the adapter's signatures, the run's logic with
a stand-in for the GPU, the figures and tables, and the command line."""

from __future__ import annotations

import ctypes
import inspect
import json
import math
import types

import numpy as np
import pytest

from cupy_swap.engines import chunks
from cupy_swap.engines import sglang as sg
from cupy_swap.tools import cli, cli_bench, cli_common, engine_adapters, engines
from cupy_swap.tools.engine_adapters import (
    ADAPTER_CONTENDERS,
    ADAPTER_KEYS,
    SGLANG_SHAPES,
    VLLM_SHAPES,
    SglangShape,
    VllmShape,
)

KIB = 1024


# -- shapes and plans ------------------------------------------------------------------


def test_adapter_shapes_are_the_engines_geometries():
    llama, c4, mla = VLLM_SHAPES
    vllm_engine_shape = next(s for s in engines.SHAPES if s.key == "vllm")  # 64 parts x 32 KiB
    assert llama.case_bytes(16) == c4.case_bytes(16) == vllm_engine_shape.case_bytes(16)
    assert (llama.tensors, llama.page_bytes, llama.blocks_per_chunk) == (32, 64 * KIB, 1)
    assert (c4.blocks_per_chunk, c4.skip) == (4, 1) and (mla.tensors, mla.page_bytes) == (61, 72 * KIB)
    assert [s.label() for s in VLLM_SHAPES] == ["32 x 64 KiB", "32 x 64 KiB, 4/chunk", "61 x 72 KiB"]
    lf, pf, ph, sg_mla = SGLANG_SHAPES
    assert [s.layout for s in SGLANG_SHAPES] == ["layer_first", "page_first", "page_head", "layer_first"]
    assert lf.item_bytes == 8 * 128 * 2 and lf.case_bytes(16) == llama.case_bytes(16)  # 16 pages of 16 tokens
    assert (sg_mla.item_bytes, sg_mla.kv, sg_mla.layers) == (
        576 * 2,
        1,
        61,
    ) and sg_mla.label() == "MLA layer_first"
    assert engine_adapters.adapter_shapes(["sglang"]) == tuple(s.key for s in SGLANG_SHAPES)
    assert (
        engine_adapters.adapter_shapes(["sglang", "vllm"]) == ADAPTER_KEYS
    )  # table order, whatever was asked
    assert engine_adapters.adapter_shapes([]) == ()
    with pytest.raises(ValueError, match="expected engines among vllm, sglang, got lmcache"):
        engine_adapters.adapter_shapes(["lmcache"])
    assert set(engine_adapters.ADAPTER_LABELS) == {c for pair in ADAPTER_CONTENDERS.values() for c in pair}


def test_footprint_and_what_fits():
    llama = VLLM_SHAPES[0]
    gpu, host = engine_adapters.adapter_footprint(llama, 16)
    blocks, chunks_ = engine_adapters.vllm_sizes(llama, 16)
    assert (blocks, chunks_) == (32, 32)
    page = 64 * KIB
    assert gpu == 32 * 32 * page + 16 * 32 * page + (32 * page + 2 * 16 * page)
    assert host == 32 * 32 * page + 16 * 32 * page
    c4 = VLLM_SHAPES[1]
    assert engine_adapters.vllm_sizes(c4, 16) == (32, 10)  # 17 sub-blocks from position 1: 5 chunks, twice
    lf = SGLANG_SHAPES[0]
    pool = 32 * 16 * 2048 * 32 * 2
    assert engine_adapters.adapter_footprint(lf, 16) == (
        2 * pool + lf.case_bytes(16) + 2 * 32 * 16 * 2048,
        pool + lf.case_bytes(16),
    )
    fits = engine_adapters.adapter_footprint(lf, 256)[0] / 0.8
    assert engine_adapters.adapter_counts_that_fit(lf, (1250, 1, 256, 16), fits, 1 << 50) == [1, 16, 256]


@pytest.mark.parametrize("bpc, first", [(1, 0), (4, 0), (4, 1), (4, 3), (2, 5)])
def test_vllm_plan_names_distinct_blocks_and_the_chunk_rows_vllm_means(bpc, first, rng):
    shape = VllmShape("t", 2, 64, bpc, first, "test")
    for n in (1, 5, 16):
        blocks, num_chunks = engine_adapters.vllm_sizes(shape, n)
        case = engine_adapters.vllm_plan(shape, n, blocks, num_chunks, rng)
        assert case.gpu_ids.dtype == case.chunk_ids.dtype == np.int32  # as vLLM's specs hold them
        assert len(set(case.gpu_ids.tolist())) == n and len(set(case.chunk_ids.tolist())) == shape.chunks_for(
            n
        )
        assert case.group_sizes == (n,) and case.block_indices == (first,)
        # The adapter's own reading of the same spec (cupy_swap.engines.chunks) agrees ...
        (rows,) = chunks.transfer_rows(case.gpu_ids, [n], [first], case.chunk_ids, bpc, 1)
        assert np.array_equal(rows.gpu, case.pairs[:, 0]) and np.array_equal(rows.cpu, case.pairs[:, 1])
        # ... and so does the plain rule: block i sits at position first % bpc + i of the chunk list.
        at = [first % bpc + i for i in range(n)]
        assert case.pairs[:, 1].tolist() == [int(case.chunk_ids[a // bpc]) * bpc + a % bpc for a in at]
    with pytest.raises(ValueError, match="need"):
        engine_adapters.vllm_plan(shape, 9, 8, 100, rng)


def test_sglang_plan_names_whole_pages():
    rng = np.random.default_rng(3)
    case = engine_adapters.sglang_plan(5, 12, 20, rng, page_size=4)
    assert case.device_tokens.dtype == case.host_tokens.dtype == np.int64
    assert len(set(case.pages[:, 0].tolist())) == len(set(case.pages[:, 1].tolist())) == 5
    assert case.device_tokens.tolist() == [p * 4 + t for p in case.pages[:, 0] for t in range(4)]
    assert case.host_tokens.tolist() == [p * 4 + t for p in case.pages[:, 1] for t in range(4)]
    assert case.pages[:, 0].max() < 12 and case.pages[:, 1].max() < 20


def test_sglang_launch_is_sgl_kernels():
    """transfer_kv_launcher: items per warp = ceil(n / (quota x warps)), CTAs
    = ceil(n / (items per warp x warps)), warps x 32 threads."""
    assert engine_adapters.sglang_launch(256) == (4, 2, 1024)  # 16 pages of 16 tokens: 2 CTAs
    assert engine_adapters.sglang_launch(1) == (1, 1, 1024)
    assert engine_adapters.sglang_launch(20000) == (313, 2, 1024)
    assert engine_adapters.sglang_launch(100, block_quota=4, num_warps_per_block=8) == (4, 4, 256)
    assert engine_adapters.sglang_launch(0) == (0, 0, 1024)
    for n in (1, 7, 64, 65, 1000, 20000):
        per_warp, ctas, threads = engine_adapters.sglang_launch(n)
        assert per_warp * ctas * threads // 32 >= n  # every item has a warp


# -- vLLM's worker pattern ----------------------------------------------------------------


def test_vllm_sub_block_ptrs_is_compute_sub_block_ptrs():
    out = np.empty(5, np.int64)
    engine_adapters.vllm_sub_block_ptrs(np.array([3, 1], np.int32), 4, out, 1000, 400, 256, skip=2)
    assert out.tolist() == [1000 + 3 * 400 + 128, 1000 + 3 * 400 + 192, 1400, 1464, 1528]
    out = np.empty(2, np.int64)
    engine_adapters.vllm_sub_block_ptrs(np.array([7, 2, 9]), 1, out, 10, 64, 64)
    assert out.tolist() == [10 + 7 * 64, 10 + 2 * 64]


def _vllm_caches(rng, pages, blocks, num_chunks, bpc):
    gpu = [rng.integers(-128, 128, (blocks, p), dtype=np.int8) for p in pages]
    cpu = [rng.integers(-128, 128, (num_chunks, bpc * p), dtype=np.int8) for p in pages]
    return gpu, cpu


def _expected(gpu, cpu, refs, per_group, store):
    """What a transfer of ``per_group`` (the adapter's GroupRows) leaves."""
    gpu, cpu = [a.copy() for a in gpu], [a.copy() for a in cpu]
    for rows, group in zip(per_group, refs):
        for t, nbytes in group:
            chunk_rows = cpu[t].reshape(-1, gpu[t].shape[1])
            if store:
                chunk_rows[rows.cpu, :nbytes] = gpu[t][rows.gpu, :nbytes]
            else:
                gpu[t][rows.gpu, :nbytes] = chunk_rows[rows.cpu, :nbytes]
    return gpu, cpu


@pytest.mark.parametrize("store", [True, False], ids=["store", "load"])
@pytest.mark.parametrize("bpc", [1, 2, 4])
def test_vllm_copy_lists_copy_what_vllm_copies(store, bpc, rng):
    """Two groups with their own page bytes (a hybrid model), one of them
    empty in one transfer, unaligned first chunks: the pointer lists,
    replayed with memmove, copy what the adapter's reading of the specs says."""
    refs = [[(0, 96), (1, 96)], [(2, 40), (3, 40)]]
    blocks, num_chunks = 24, 20
    for sizes, starts in (((5, 3), (1, 2)), ((0, 4), (0, 3)), ((7, 0), (6, 0))):
        gpu, cpu = _vllm_caches(rng, [96, 96, 40, 40], blocks, num_chunks, bpc)
        need = sum(-(-(s + i % bpc) // bpc) for s, i in zip(sizes, starts) if s)
        gpu_ids = rng.permutation(blocks)[: sum(sizes)].astype(np.int32)
        chunk_ids = rng.permutation(num_chunks)[:need].astype(np.int32)
        per_group = chunks.transfer_rows(gpu_ids, sizes, starts, chunk_ids, bpc, 2)
        want_gpu, want_cpu = _expected(gpu, cpu, refs, per_group, store)
        src_ids, dst_ids = (gpu_ids, chunk_ids) if store else (chunk_ids, gpu_ids)
        src_t, dst_t = (gpu, cpu) if store else (cpu, gpu)
        factors = (1, bpc) if store else (bpc, 1)
        src, dst, nbytes_each, nbytes = engine_adapters.vllm_copy_lists(
            src_t, dst_t, refs, src_ids, dst_ids, sizes, starts, *factors
        )
        assert len(src) == len(dst) == len(nbytes_each) == 2 * sum(sizes)
        assert nbytes == sizes[0] * 2 * 96 + sizes[1] * 2 * 40
        for s, d, n in zip(src.tolist(), dst.tolist(), nbytes_each.tolist()):
            ctypes.memmove(d, s, n)
        assert all(np.array_equal(a, b) for a, b in zip(gpu + cpu, want_gpu + want_cpu))


class _Stream:
    def __init__(self, log, name):
        self.log, self.name = log, name

    def wait_stream(self, other):
        self.log.append(("wait_stream", self.name, other))

    def wait_event(self, event):
        self.log.append(("wait_event", self.name, event.name))


class _Event:
    def __init__(self, log, name):
        self.log, self.name, self.done, self.at = log, name, False, None

    def record(self, stream):
        self.log.append(("record", self.name, stream.name))
        self.at = len(self.log)

    def query(self):
        return self.done

    def synchronize(self):
        self.log.append(("synchronize", self.name))
        self.done = True


class _Kit:
    """The pattern's torch calls: streams, events, and the batch copy done
    at once with memmove (the stand-in's "GPU" is the host)."""

    def __init__(self):
        self.log, self.streams, self.events, self.current = [], 0, 0, None

    def batch(self, src, dst, sizes):
        self.log.append(("batch", len(sizes)))
        return src, dst, sizes

    def copy(self, batch, gpu_to_cpu):
        self.log.append(("copy", self.current, gpu_to_cpu))
        for s, d, n in zip(*(a.tolist() for a in batch)):
            ctypes.memmove(d, s, n)

    def new_stream(self):
        self.streams += 1
        return _Stream(self.log, f"s{self.streams}")

    def new_event(self):
        self.events += 1
        return _Event(self.log, f"e{self.events}")

    def current_stream(self):
        return "compute"

    def on(self, stream):
        kit = self

        class _On:
            def __enter__(self):
                kit.current = stream.name

            def __exit__(self, *exc):
                kit.current = None

        return _On()

    def elapsed(self, start, end):
        assert start.at < end.at
        return 2e-3


def test_vllm_worker_pattern_is_vllms_worker_with_a_stand_in_kit(rng):
    shape = VllmShape("t", 3, 64, 2, 1, "test")
    blocks, num_chunks = engine_adapters.vllm_sizes(shape, 6)
    gpu, cpu = _vllm_caches(rng, [64] * 3, blocks, num_chunks, 2)
    kit = _Kit()
    worker = engine_adapters.VllmWorkerPattern(gpu, cpu, 2, [[(t, 64) for t in range(3)]], kit=kit)
    case = engine_adapters.vllm_plan(shape, 6, blocks, num_chunks, rng)
    gpu_spec = types.SimpleNamespace(block_ids=case.gpu_ids, group_sizes=(6,), block_indices=(1,))
    cpu_spec = types.SimpleNamespace(block_ids=case.chunk_ids)
    want = [c.copy() for c in cpu]
    for w, g in zip(want, gpu):
        w.reshape(-1, 64)[case.pairs[:, 1]] = g[case.pairs[:, 0]]
    assert worker.submit_store(7, gpu_spec, cpu_spec) is True
    assert all(np.array_equal(a, b) for a, b in zip(cpu, want))
    assert kit.log[:3] == [("batch", 18), ("wait_stream", "s1", "compute"), ("record", "e1", "s1")]
    assert kit.log[3:5] == [("copy", "s1", True), ("record", "e2", "s1")]
    assert worker.get_finished() == []  # its end event has not completed
    worker.submit_store(8, gpu_spec, cpu_spec)  # a second stream, after the first transfer's end
    assert ("wait_event", "s2", "e2") in kit.log and kit.streams == 2
    for gpu_t in gpu:
        gpu_t[:] = 0
    worker.submit_load(9, cpu_spec, gpu_spec)  # loads wait for the compute (vLLM 0.33.0), not for the stores
    load_log = kit.log[kit.log.index(("batch", 18), 6) :]
    assert [e[0] for e in load_log if e[0] in ("wait_stream", "wait_event")] == ["wait_stream"]
    assert load_log[1][0] == "wait_stream" and load_log[1][2] == "compute"
    assert all(
        np.array_equal(g[case.pairs[:, 0]], w.reshape(-1, 64)[case.pairs[:, 1]]) for g, w in zip(gpu, want)
    )
    worker.submit_load(11, cpu_spec, gpu_spec, expedited=True)  # vLLM 0.33.0: its own handler and stream
    assert [t.job_id for t in worker._expedited.transfers] == [11] and kit.log[-1][2] not in ("s1", "s2")
    worker._expedited.transfers[0].end.done = True
    worker.wait({8})
    assert ("synchronize", "e4") in kit.log
    first, second = worker._store.transfers[0].end, worker._load.transfers[0].end
    first.done = second.done = True
    results = worker.get_finished()  # stores in order up to the first unfinished one, then loads
    assert [(r.job_id, r.success, r.transfer_size, r.transfer_time) for r in results] == [
        (7, True, 6 * 3 * 64, 2e-3),
        (8, True, 6 * 3 * 64, 2e-3),
        (9, True, 6 * 3 * 64, 2e-3),
        (11, True, 6 * 3 * 64, 2e-3),
    ]
    worker.submit_store(10, gpu_spec, cpu_spec)  # the pools give back a stream and two events
    assert kit.streams == 4 and kit.events == 8  # the expedited load took a stream and two events of its own
    worker.shutdown()
    assert worker._store.transfers == deque_empty()


def deque_empty():
    from collections import deque

    return deque()


# -- SGLang's kernel, transcribed; the host pool's calls ------------------------------------


def test_sgl_kernel_source_compiles_for_every_function():
    nvrtc = pytest.importorskip("cupy_backends.cuda.libs.nvrtc", reason="CuPy with NVRTC bindings is needed")
    for name, (kernel, *_modes) in engine_adapters.SGL_FUNCTIONS.items():
        prog = nvrtc.createProgram(engine_adapters.SGL_KERNEL_SOURCE, f"{name}.cu", [], [])
        try:
            nvrtc.compileProgram(
                prog, ["--gpu-architecture=sm_90", *engine_adapters.sgl_kernel_options(name)]
            )
            assert kernel.encode() in nvrtc.getCUBIN(prog), name
        finally:
            nvrtc.destroyProgram(prog)


def _at(mode, base, table, layer, dim, i, item, head=0, heads=1, page_size=1):
    """SGL_KERNEL_SOURCE's cs_at, in Python (sgl-kernel's get_global_offset_*)."""
    if mode == engine_adapters.LF:
        return base + layer * dim + i * item
    if mode == engine_adapters.PF:
        return base + i * dim + layer * item
    if mode == engine_adapters.TABLE:
        return _u64(table + 8 * layer) + i * item
    if mode == engine_adapters.PH:
        return (
            base
            + i // page_size * page_size * dim
            + dim // heads * head * page_size
            + i % page_size * dim // heads
            + layer * item // heads
        )
    if mode == engine_adapters.HEAD_LF:
        return base + layer * dim + i * item + item // heads * head
    return _u64(table + 8 * layer) + i * item + item // heads * head


def _u64(address):
    return ctypes.c_uint64.from_address(address).value


def _i64(address):
    return ctypes.c_int64.from_address(address).value


class _Emulated:
    """A kernel of SGL_KERNEL_SOURCE run in Python from its argument list,
    for torch CPU tensors (their addresses are host addresses)."""

    def __init__(self, name, launches):
        self.name, self.launches = name, launches
        self.kernel, self.src_mode, self.dst_mode, self.kv = engine_adapters.SGL_FUNCTIONS[name]

    def __call__(self, grid, block, args, stream=None):
        a = [int(x) for x in args]
        src_k, dst_k, src_v, dst_v, src_idx, dst_idx, first, layers, items, per_warp, item = a[:11]
        src_dim, dst_dim, tsk, tdk, tsv, tdv, page_size, heads = a[11:]
        self.launches.append((self.name, grid, block, items, per_warp))
        assert per_warp * grid[0] * block[0] // 32 >= items
        sides = [(src_k, dst_k, tsk, tdk)] + ([(src_v, dst_v, tsv, tdv)] if self.kv == 2 else [])
        per_head = self.kernel == "cs_sgl_heads"
        for k in range(items):
            s, d = _i64(src_idx + 8 * k), _i64(dst_idx + 8 * k)
            if s < 0 or d < 0:
                continue
            for layer in range(first, first + layers):
                for head in range(heads if per_head else 1):
                    for sb, db, st, dt in sides:
                        h = (head, heads, page_size) if per_head else ()
                        ctypes.memmove(
                            _at(self.dst_mode, db, dt, layer, dst_dim, d, item, *h),
                            _at(self.src_mode, sb, st, layer, src_dim, s, item, *h),
                            item // heads if per_head else item,
                        )


SMALL = {  # the row shapes, scaled down: 3 layers of 2 heads x 8 elements
    s.key: SglangShape(s.key, s.layout, 3, 1 if s.mla else 2, 12 if s.mla else 8, s.mla, "test")
    for s in SGLANG_SHAPES
}


@pytest.mark.parametrize("direction", ["in", "out"])
@pytest.mark.parametrize("key", list(SMALL))
def test_the_transcription_called_by_the_host_pool_copies_what_the_layouts_say(key, direction, monkeypatch):
    """The stand-in host pool calls SglKernelTranscription's functions as
    SGLang's host pool calls sgl-kernel's (per layer for a load, every layer
    for a backup); its kernels, replayed in Python from their argument
    lists, move exactly the tokens the case names, in every layer, K and V,
    as the layouts' own indexing (host_tokens_view) reads them."""
    torch = pytest.importorskip("torch")
    shape, rng = SMALL[key], np.random.default_rng(len(key) + (direction == "in"))
    pools = engine_adapters.SglangPools(
        shape,
        6,
        8,
        alloc=lambda dims, pinned: torch.from_numpy(rng.integers(-(2**15), 2**15, dims, dtype=np.int16)),
        table=lambda bufs: torch.tensor([b.data_ptr() for b in bufs], dtype=torch.uint64),
    )
    launches = []
    io = engine_adapters.SglKernelTranscription()
    monkeypatch.setattr(io, "_kernel", lambda name: _Emulated(name, launches))
    monkeypatch.setattr(io, "_stream", lambda: None)
    case = engine_adapters.sglang_plan(3, 6, 8, rng, shape.page_size)
    host_idx, dev_idx = torch.from_numpy(case.host_tokens), torch.from_numpy(case.device_tokens)
    d = pools.device_pool
    device = [d.kv_buffer] if shape.mla else [d.k_buffer, d.v_buffer]
    host_before = pools.kv_buffer.numpy().copy()
    device_before = [[t.numpy().copy() for t in layers] for layers in device]
    (pools.load if direction == "in" else pools.backup)(io, host_idx, dev_idx)
    width = shape.heads * shape.head_dim
    if direction == "in":
        assert [x[0] for x in launches] == [
            "transfer_kv_per_layer_mla" if shape.mla else
            {"layer_first": "transfer_kv_per_layer", "page_first": "transfer_kv_per_layer_pf_lf",
             "page_head": "transfer_kv_per_layer_ph_lf"}[shape.layout]
        ] * shape.layers  # fmt: skip
    else:
        assert len(launches) == 1
    mapped_dev = np.isin(np.arange(6 * 16), case.device_tokens)
    mapped_host = np.isin(np.arange(8 * 16), case.host_tokens)
    for kv, layers in enumerate(device):
        for layer, t in enumerate(layers):
            dev = t.numpy().reshape(-1, width)
            host = engine_adapters.host_tokens_view(pools.kv_buffer.numpy(), shape, kv, layer)
            assert np.array_equal(dev[case.device_tokens], host[case.host_tokens])
            if direction == "in":  # nothing else of the device pool written
                before = device_before[kv][layer].reshape(-1, width)
                assert np.array_equal(dev[~mapped_dev], before[~mapped_dev])
            else:
                before = engine_adapters.host_tokens_view(host_before, shape, kv, layer)
                assert np.array_equal(host[~mapped_host], before[~mapped_host])
    if direction == "in":
        assert np.array_equal(pools.kv_buffer.numpy(), host_before)  # the source untouched


class _Recorder:
    """A kvcacheio namespace that records the calls and binds each to a
    signature: cupy_swap.engines.sglang's, or the transcription's."""

    def __init__(self, against):
        self.against, self.calls = against, []

    def __getattr__(self, name):
        def call(**kwargs):
            inspect.signature(getattr(self.against, name)).bind(**kwargs)  # raises on a mismatch
            self.calls.append((name, kwargs))

        return call


@pytest.mark.parametrize("key", list(SMALL))
def test_the_host_pools_calls_fit_the_adapter_and_the_transcription(key):
    """Every call the stand-in host pool makes binds to cupy_swap.engines.sglang's
    function and to the transcription's, with the host pool's arguments."""
    shape = SMALL[key]
    pools = engine_adapters.SglangPools(
        shape,
        4,
        5,
        alloc=lambda dims, pinned: np.zeros(dims, np.int16),
        table=lambda bufs: [id(b) for b in bufs],
    )
    for against in (sg, engine_adapters.SglKernelTranscription()):
        io = _Recorder(against)
        pools.load(io, "host_idx", "dev_idx")
        pools.backup(io, "host_idx", "dev_idx")
        names = [c[0] for c in io.calls]
        assert len(names) == shape.layers + 1 and names[-1].startswith("transfer_kv_all_layer")
        for _, kw in io.calls[: shape.layers]:
            assert kw.get("src_indices") == "host_idx" and kw.get("dst_indices") == "dev_idx"
            assert kw["item_size"] == shape.item_bytes
        last = io.calls[-1][1]
        assert last["src_indices"] == "dev_idx" and last["dst_indices"] == "host_idx"
        assert last["num_layers"] == shape.layers
    if shape.layout == "page_first":
        ref, base = pools.k_data_refs[1], pools.k_buffer  # layer 1: a token every layout_dim bytes
        assert (
            ref.strides[0] == 3 * shape.item_bytes and ref.ctypes.data - base.ctypes.data == shape.item_bytes
        )
        assert io.calls[1][1]["layer_id"] == 1 and io.calls[1][1]["src_layout_dim"] == 3 * shape.item_bytes


def test_host_tokens_view_reads_each_layout_by_its_dims():
    shape = SglangShape("t", "page_head", 3, 2, 4, False, "test")
    pages, P = 2, shape.page_size
    pool = np.arange(2 * pages * 2 * P * 3 * 4).reshape(2, pages, 2, P, 3, 4)
    view = engine_adapters.host_tokens_view(pool, shape, 1, 2)
    assert view.shape == (pages * P, 8)
    token = P + 5  # page 1, token 5: heads 0 and 1 of layer 2, V
    assert view[token].tolist() == pool[1, 1, 0, 5, 2].tolist() + pool[1, 1, 1, 5, 2].tolist()
    pf = SglangShape("t", "page_first", 3, 2, 4, False, "test")
    pool = np.arange(2 * 10 * 3 * 2 * 4).reshape(2, 10, 3, 2, 4)
    assert engine_adapters.host_tokens_view(pool, pf, 0, 1)[7].tolist() == pool[0, 7, 1].reshape(-1).tolist()


# -- the rows ----------------------------------------------------------------------------


def test_time_in_turns_takes_each_calls_own_wait():
    now, waited = [0.0], []

    def submit():
        now[0] += 1.0

    def wait(name, cost):
        def fn():
            waited.append(name)
            now[0] += cost

        return fn

    out = engines.time_in_turns(
        {"a": submit, "b": submit}, {"a": wait("a", 0.5), "b": wait("b", 2.0)}, reps=6, rounds=3,
        clock=lambda: now[0],
    )  # fmt: skip
    assert out == {"a": (1.5, 1.0), "b": (3.0, 1.0)}
    assert waited[:2] == ["a", "b"] and len(waited) == 2 + 3 * 2 * 2


def _adapter_row(
    engine="vllm", shape="vllm-llama", n=16, direction="in", theirs=20.0, ours=45.0, host=(1000.0, 30.0)
):
    a, b = ADAPTER_CONTENDERS[engine]
    row = {
        "engine": engine,
        "shape": shape,
        "num_blocks": n,
        "direction": direction,
        "ceiling_gbps": 54.0,
        "bytes": 1,
    }
    row.update(
        {
            a: theirs,
            a + "_host_us": host[0],
            a + "_ok": True,
            b: ours,
            b + "_host_us": host[1],
            b + "_ok": True,
        }
    )
    row["path"] = "kernel"
    return engine_adapters.finish_adapter_row(row)


def test_adapter_rows_name_their_lead_gains_and_goals():
    r = _adapter_row()
    assert r["lead"] == "vllm_worker" and r["gain"] == 2.25 and math.isclose(r["host_gain"], 1000 / 30)
    bad = _adapter_row(n=256)
    bad["vllm_worker_ok"] = False
    for key in ("gain", "host_gain"):
        bad.pop(key)
    engine_adapters.finish_adapter_row(bad)
    assert bad["lead"] == "vllm_pattern" and "gain" not in bad  # a mismatch never leads nor counts
    slow = _adapter_row(direction="out", ours=39.0, host=(500.0, 40.0))
    sg_rows = [
        _adapter_row("sglang", "sglang-lf", 16, "in", theirs=10.0, ours=30.0),
        _adapter_row("sglang", "sglang-ph", 1, "out", theirs=10.0, ours=9.0),
    ]
    s = engine_adapters.adapter_summary([r, bad, slow, *sg_rows])
    assert s["vllm"]["rows"] == 2 and s["vllm"]["leads"] == 2 and s["vllm"]["gain"] == (1.95, 2.25)
    assert s["sglang"]["leads"] == 1 and s["sglang"]["worst"] == ("sglang-ph", 1, "out")
    lines = engine_adapters.adapter_goal_lines([r, slow, *sg_rows])
    assert lines[0].startswith("vLLM goal at 16 blocks of 32 x 64 KiB, in: 2.25x GB/s, 33.3x less host time")
    assert lines[0].endswith(": met") and lines[1].endswith("NOT met")  # 1.95x GB/s, 12.5x host
    assert (
        lines[2]
        == "SGLang goal: at or above SGLang's kernel in 1 of 2 rows (lowest 0.90x at sglang-ph, 1, out): NOT met"
    )
    assert engine_adapters.adapter_goal_lines([]) == [
        "vLLM goal (2x GB/s, 10x less host time at 16 blocks of vllm-llama): not measured",
        "SGLang goal (at or above SGLang's kernel in every row): not measured",
    ]
    assert "not decided" in engine_adapters.adapter_goal_lines([bad | {"num_blocks": 16}])[0]


def test_adapter_table_and_markdown():
    r = _adapter_row()
    line = engine_adapters.adapter_table_line(r)
    assert line.startswith("vllm-llama        16  in    54.0") and "  45.0 (   30)*" in line
    assert line.endswith("   2.25    33.3  kernel")
    head = engine_adapters.adapter_table_head()
    assert head.startswith("shape") and "x GB/s  x host  path" in head
    partial = _adapter_row("sglang", "sglang-mla")
    del partial["sglang_kernel"]
    partial["sglang_functions_ok"] = False
    text = engine_adapters.adapter_table_line(partial)
    assert " - " in text and "!" in text
    md = engine_adapters.adapter_markdown_table([r, partial])
    assert (
        md[2]
        == "| vLLM | 32 x 64 KiB | 16 | host -> GPU | 54.0 | 20.0 (1000) | **45.0 (30)** | 2.25 | 33.3 |"
    )
    assert md[3].startswith("| SGLang | MLA layer_first | 16 | host -> GPU | 54.0 | - | 45.0 (30) ! |")
    legend = "\n".join(engine_adapters.adapter_legend_lines())
    assert "vllm-llama" in legend and "cuMemcpyBatchAsync" in legend and "load_to_device_per_layer" in legend
    page = "\n".join(
        engines.results_page({"engines": []}, "abc", "cmd", engine_adapters.adapter_findings([r]))
    )
    assert "| vLLM | 32 x 64 KiB | 16 |" in page and "vLLM goal at 16 blocks" in page


class _FakeBufs:
    def __init__(self, shape, n_max, log, broken):
        self.shape, self.log, self.broken = shape, log, broken
        self.notes = {"note": shape.key}
        log.append(("buffers", shape.key, n_max))

    def plan(self, n, rng):
        return types.SimpleNamespace(n=n)

    def fill(self, seed):
        self.log.append(("fill",))

    def poison(self, direction):
        self.log.append(("poison", direction))

    def calls(self, direction, case):
        theirs, ours = ADAPTER_CONTENDERS[self.shape.engine]

        def submit(name):
            def fn():
                if name == self.broken and case.n == 16:
                    raise RuntimeError("refused")
                self.log.append(("submit", name))

            return fn

        def wait(name):
            return lambda: self.log.append(("wait", name))

        return {name: (submit(name), wait(name)) for name in ("memcpy", theirs, ours)}

    def verify(self, direction, case):
        self.log.append(("verify", direction, case.n))
        return self.log[-3] != ("submit", "sglang_kernel")  # the stand-in's SGLang kernel copies wrong bytes

    def path(self):
        return "dma"

    def close(self):
        self.log.append(("close", self.shape.key))


class _FakeAdapterHarness:
    def __init__(self, gpu_free=1 << 50, without=()):
        self.log, self.gpu_free, self.without = [], gpu_free, without

    def unavailable(self, engine):
        return "needs PyTorch with CUDA (test)" if engine in self.without else None

    def free_memory(self):
        return self.gpu_free, 1 << 50

    def settle(self):
        pass

    def buffers(self, shape, n_max):
        return _FakeBufs(shape, n_max, self.log, broken="vllm_worker")

    def release(self):
        self.log.append(("release",))


def test_run_adapters_measures_checks_and_reports_with_a_stand_in_gpu():
    lf = engine_adapters._adapter_shape("sglang-lf")
    h = _FakeAdapterHarness(gpu_free=engine_adapters.adapter_footprint(lf, 16)[0] / 0.8)
    rows, skipped = [], []
    out = engine_adapters.run_adapters(
        ("vllm-llama", "sglang-lf"),
        (1, 16, 1250),
        ("in", "out"),
        reps=6,
        harness=h,
        on_row=rows.append,
        on_skip=lambda shape, n, why: skipped.append((shape.key, n, why[:5])),
    )
    assert out == rows
    assert [(r["shape"], r["direction"], r["num_blocks"]) for r in rows] == [
        (k, d, n) for k in ("vllm-llama", "sglang-lf") for d in ("in", "out") for n in (1, 16)
    ]
    assert [s[:2] for s in skipped] == [("vllm-llama", 1250), ("sglang-lf", 1250)]
    for key in ("vllm-llama", "sglang-lf"):  # each shape's buffers closed, then the allocators' caches freed
        assert h.log[h.log.index(("close", key)) + 1] == ("release",)
    for r in rows:
        assert (
            r["engine"] == r["shape"].split("-")[0]
            and r["note"] == r["shape"]
            and math.isfinite(r["ceiling_gbps"])
        )
        if r["engine"] == "vllm":
            assert r["vllm_pattern_ok"] is True
            assert r.get("path") == ("dma" if r["vllm_worker_ok"] else None)  # what cupy_swap's call took
            if r["num_blocks"] == 16:  # the contender that raised is reported, the other measured
                assert (
                    "vllm_worker" not in r
                    and r["vllm_worker_ok"] is False
                    and "refused" in r["vllm_worker_error"]
                )
            else:
                assert r["vllm_worker_ok"] is True and r["lead"] in ADAPTER_CONTENDERS["vllm"]
        else:
            assert r["sglang_kernel_ok"] is False and r["sglang_functions_ok"] is True
            assert r["lead"] == "sglang_functions" and "gain" not in r
    # Each contender is checked after a poison and one transfer of its own, waited for.
    i = h.log.index(("poison", "in"))
    assert h.log[i : i + 4] == [
        ("poison", "in"),
        ("submit", "vllm_pattern"),
        ("wait", "vllm_pattern"),
        ("verify", "in", 1),
    ]


def test_run_adapters_leaves_out_an_engine_that_cannot_run_here():
    h, skipped = _FakeAdapterHarness(without=("vllm",)), []
    rows = engine_adapters.run_adapters(
        ("vllm-mla", "sglang-mla"), (1, 16), ("in",), reps=2, harness=h,
        on_skip=lambda shape, n, why: skipped.append((shape.key, n, why)),
    )  # fmt: skip
    assert skipped == [("vllm-mla", n, "needs PyTorch with CUDA (test)") for n in (1, 16)]
    assert [r["shape"] for r in rows] == ["sglang-mla"] * 2 and ("buffers", "vllm-mla", 16) not in h.log


def test_the_adapter_harness_says_why_without_torch_cuda(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    assert "needs PyTorch" in engine_adapters.AdapterHarness().unavailable("vllm")
    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(is_available=lambda: False))
    monkeypatch.setitem(sys.modules, "torch", fake)
    assert engine_adapters.AdapterHarness().unavailable("sglang").startswith("needs PyTorch with CUDA")


# -- the command line ------------------------------------------------------------------------


@pytest.fixture
def fake_runs(monkeypatch):
    """bench --engines with both runs stood in for: what each was asked."""
    seen = {}

    def run_engines(shapes=engines.SHAPE_KEYS, counts=engines.ENGINE_COUNTS, directions=("in", "out"), **kw):
        seen["engines"] = list(counts)
        row = {"shape": "vllm", "num_blocks": counts[0], "direction": directions[0], "ceiling_gbps": 50.0}
        row.update({c: 40.0 for c in engines.CONTENDERS})
        row.update({c + "_host_us": 10.0 for c in engines.CONTENDERS})
        row.update({c + "_ok": True for c in engines.CONTENDERS})
        kw["on_row"](engines.finish_row(row))
        return [row]

    def run_adapters(shapes=ADAPTER_KEYS, counts=engines.ENGINE_COUNTS, directions=("in", "out"), **kw):
        seen["adapters"] = dict(
            shapes=list(shapes), counts=list(counts), directions=list(directions), reps=kw["reps"]
        )
        rows = [
            _adapter_row("vllm" if k.startswith("vllm") else "sglang", k, n, d)
            for k in shapes
            for d in directions
            for n in counts
        ]
        for r in rows:
            kw["on_row"](r)
        kw["on_skip"](engine_adapters._adapter_shape(shapes[0]), 99999, "needs 1 TB (test)")
        return rows

    monkeypatch.setattr(cli_common, "require_gpu", lambda: "fake GPU")
    monkeypatch.setattr(cli_common, "environment_lines", lambda: ["GPU 0: fake"])
    from cupy_swap.tools import bench

    monkeypatch.setattr(bench, "swapper_settings", lambda: "settings: fake")
    monkeypatch.setattr(engines, "run_engines", run_engines)
    monkeypatch.setattr(engine_adapters, "run_adapters", run_adapters)
    return seen


def test_bench_engines_adds_the_adapter_rows_prints_and_stores_them(fake_runs, tmp_path, capsys):
    out = tmp_path / "e.json"
    argv = [
        "bench",
        "--engines",
        "--counts",
        "16",
        "--directions",
        "in",
        "--adapters",
        "vllm",
        "--json",
        str(out),
    ]
    assert cli.main(argv) == cli.EXIT_OK
    assert fake_runs["adapters"] == {
        "shapes": ["vllm-llama", "vllm-llama-c4", "vllm-mla"], "counts": [16], "directions": ["in"], "reps": 30,
    }  # fmt: skip
    text = capsys.readouterr().out
    assert "adapter rows (cupy_swap.engines" in text and "vllm-llama-c4     16  in" in text
    assert "vllm-llama     99999  left out: needs 1 TB (test)" in text
    assert "vLLM goal at 16 blocks of 32 x 64 KiB, in: 2.25x GB/s" in text
    report = json.loads(out.read_text())
    assert [r["shape"] for r in report["adapters"]] == ["vllm-llama", "vllm-llama-c4", "vllm-mla"]
    assert len(report["engines"]) == 1
    # Shown again from the stored file, without a GPU.
    assert cli.main(["bench", "--from-json", str(out)]) == cli.EXIT_OK
    assert "vllm-llama-c4     16  in" in capsys.readouterr().out


def test_bench_engines_runs_every_adapter_by_default_and_none_on_request(fake_runs):
    assert cli.main(["bench", "--engines"]) == cli.EXIT_OK
    assert fake_runs["adapters"]["shapes"] == list(ADAPTER_KEYS)
    assert fake_runs["adapters"]["counts"] == [1, 16, 256, 1250] and fake_runs["engines"] == [
        1,
        16,
        256,
        1250,
    ]
    fake_runs.clear()
    assert cli.main(["bench", "--engines", "--adapters", "none"]) == cli.EXIT_OK
    assert "adapters" not in fake_runs and "engines" in fake_runs


def test_a_mismatch_in_an_adapter_row_exits_1(fake_runs, monkeypatch):
    def run_adapters(shapes, **kw):
        row = _adapter_row("sglang", "sglang-pf")
        row["sglang_kernel_ok"] = False  # the engine's own way counts too: every row is checked
        kw["on_row"](row)
        return [row]

    monkeypatch.setattr(engine_adapters, "run_adapters", run_adapters)
    assert cli.main(["bench", "--engines", "--adapters", "sglang"]) == cli.EXIT_MISMATCH


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--adapters", "vllm"], "argument --adapters: applies to --engines only"),
        (["--engines", "--adapters", "lmcache"], "'lmcache' not among vllm, sglang, none"),
        (["--engines", "--adapters", "none,vllm"], "'none' leaves every adapter row out: give it alone"),
    ],
)
def test_bad_adapters_options_exit_2_before_a_gpu_is_looked_for(argv, message, monkeypatch, capsys):
    monkeypatch.setattr(cli_common, "gpu_status", lambda: pytest.fail("looked for a GPU"))
    with pytest.raises(SystemExit) as e:
        cli.main(["bench", *argv])
    assert e.value.code == cli.EXIT_USAGE and message in capsys.readouterr().err


def test_adapters_arg_parses_and_dedupes():
    assert cli_bench.adapters_arg("sglang,vllm,sglang") == ["sglang", "vllm"]
    assert cli_bench.adapters_arg("none") == []
    assert cli.parse_args(["bench", "--engines"]).adapters == ["vllm", "sglang"]
    assert cli_bench.OWNED["adapters"] == "--engines"


class _Results:
    """A worker whose get_finished() hands out what the test queued."""

    def __init__(self):
        self.submitted, self.ready = [], []

    def submit_store(self, job, gpu_spec, cpu_spec):
        self.submitted.append(("store", job, gpu_spec, cpu_spec))

    def submit_load(self, job, cpu_spec, gpu_spec):
        self.submitted.append(("load", job, cpu_spec, gpu_spec))

    def get_finished(self):
        out, self.ready = self.ready, []
        return out


def test_jobs_drive_a_worker_as_vllms_connector_does():
    from cupy_swap.engines.offload import TransferResult

    worker = _Results()
    jobs = engine_adapters._Jobs(worker, False, "gpu", "cpu", 96)
    jobs.submit()
    jobs.submit()
    (_, first, src, dst), (_, second, _, _) = worker.submitted
    assert (src, dst) == ("cpu", "gpu") and second == first + 1  # a load: CPU spec, then GPU spec
    worker.ready = [TransferResult(first, True, 96, 1e-3), TransferResult(second, True, 96, 1e-3)]
    jobs.finish()
    assert jobs.waiting == set()
    jobs.submit()
    worker.ready = [TransferResult(second + 1, False)]
    with pytest.raises(RuntimeError, match="success=False"):
        jobs.finish()
    jobs = engine_adapters._Jobs(worker, True, "gpu", "cpu", 96)
    jobs.submit()
    assert worker.submitted[-1][0] == "store" and worker.submitted[-1][2:] == ("gpu", "cpu")
    worker.ready = [TransferResult(worker.submitted[-1][1], True, 64, 1e-3)]
    with pytest.raises(RuntimeError, match="transfer_size 64, expected 96"):
        jobs.finish()
    jobs.submit()
    with pytest.raises(TimeoutError, match="not reported by get_finished"):
        jobs.finish(timeout=0.01)
