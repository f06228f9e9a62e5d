"""The engine adapters on a GPU (issue 51): vLLM's offloading worker and
sgl-kernel's kvcacheio functions, bit-exact at Llama-3-8B, DeepSeek-V3 (MLA)
and a hybrid model's two KV cache groups with their own page sizes, every
byte compared with a NumPy reference of what the engine copies; a bad block
id is ``success=False`` (vLLM) or a raised IndexError (SGLang) with nothing
written.  Where vLLM or sgl-kernel import, their classes and kernels are
used beside the adapters.  (Written without a GPU: first run by the lead.)"""

from __future__ import annotations

import types

import numpy as np
import pytest

from cupy_swap.engines import sglang as sg
from cupy_swap.engines import vllm as cv

from .gpu_helpers import require_gpu, require_torch_cuda, spin

pytestmark = [pytest.mark.gpu, pytest.mark.torch]

cp = require_gpu()
torch = require_torch_cuda()

NS = types.SimpleNamespace


# -- vLLM ---------------------------------------------------------------------------


def _kv_caches(shape_of_block, layers, num_blocks, groups=None):
    """vLLM's CanonicalKVCaches (its classes where vLLM imports, else objects
    with their fields): one tensor per layer, num_blocks leading (vLLM's
    standardized layouts), random bytes on the GPU."""
    g = torch.Generator(device="cuda").manual_seed(11)
    tensors = [
        torch.randint(
            -(2**15), 2**15, (num_blocks, *shape_of_block), generator=g, device="cuda", dtype=torch.int16
        ).view(torch.bfloat16)
        for _ in range(layers)
    ]
    page = tensors[0][0].numel() * 2
    groups = groups or [[page] * layers]  # per group, the bytes each layer uses of its tensor's page
    try:
        from vllm.v1.kv_offload import base

        tensor, ref, caches = base.CanonicalKVCacheTensor, base.CanonicalKVCacheRef, base.CanonicalKVCaches
    except ImportError:
        tensor, ref, caches = NS, NS, NS
    return caches(
        tensors=[tensor(tensor=t, page_size_bytes=page) for t in tensors],
        group_data_refs=[[ref(tensor_idx=i, page_size_bytes=n) for i, n in enumerate(g)] for g in groups],
    )


def _spec(block_ids, group_sizes=None, block_indices=None):
    try:
        from vllm.v1.kv_offload.base import GPULoadStoreSpec
        from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec
    except ImportError:
        GPULoadStoreSpec = CPULoadStoreSpec = None
    if group_sizes is None:
        return (
            CPULoadStoreSpec(block_ids) if CPULoadStoreSpec else NS(block_ids=np.array(block_ids, np.int32))
        )
    if GPULoadStoreSpec:
        return GPULoadStoreSpec(block_ids, group_sizes, block_indices)
    return NS(block_ids=np.array(block_ids, np.int32), group_sizes=group_sizes, block_indices=block_indices)


def _reference(src, dst, groups, gpu_spec, chunk_ids, bpc, store):
    """What vLLM's worker copies (its compute_sub_block_ptrs arithmetic, on
    byte arrays): per group, sub-blocks from ``block_index % factor`` of the
    first chunk, ``page_size_bytes`` of each layer's page."""
    src_f, dst_f = (1, bpc) if store else (bpc, 1)
    src_ids, dst_ids = (gpu_spec.block_ids, chunk_ids) if store else (chunk_ids, gpu_spec.block_ids)
    s_at = d_at = 0
    for size, index, used in zip(gpu_spec.group_sizes, gpu_spec.block_indices, groups):
        if size == 0:
            continue
        s_skip, d_skip = index % src_f, index % dst_f
        s_n, d_n = -(-(size + s_skip) // src_f), -(-(size + d_skip) // dst_f)
        for t, nbytes in enumerate(used):
            so = [
                b * src[t].shape[1] + j * (src[t].shape[1] // src_f)
                for b in src_ids[s_at : s_at + s_n]
                for j in range(src_f)
            ]
            do = [
                b * dst[t].shape[1] + j * (dst[t].shape[1] // dst_f)
                for b in dst_ids[d_at : d_at + d_n]
                for j in range(dst_f)
            ]
            s_bytes, d_bytes = src[t].reshape(-1), dst[t].reshape(-1)
            for a, b in zip(so[s_skip : s_skip + size], do[d_skip : d_skip + size]):
                d_bytes[b : b + nbytes] = s_bytes[a : a + nbytes]
        s_at, d_at = s_at + s_n, d_at + d_n


def _gpu_bytes(kv):
    return [cv.page_rows(t.tensor, t.page_size_bytes).cpu().numpy().copy() for t in kv.tensors]


def _finish(worker, job_ids):
    worker.wait(set(job_ids))
    results = worker.get_finished()
    assert sorted(r.job_id for r in results) == sorted(job_ids)
    return {r.job_id: r for r in results}


SHAPES = {
    # Llama-3-8B: 32 layers of [blocks, K/V, 16 tokens, 8 heads, 128] bf16: 64 KiB pages
    "llama3-8b": dict(block=(2, 16, 8, 128), layers=32, groups=None),
    # DeepSeek-V3 MLA: 61 layers of [blocks, 64 tokens, 576] bf16: 72 KiB pages
    "deepseek-v3-mla": dict(block=(64, 576), layers=61, groups=None),
    # A hybrid model's two groups on shared tensors: 64 KiB pages, the second group using 40 KiB of each
    "hybrid-2-groups": dict(block=(2, 16, 8, 128), layers=8, groups=[[65536] * 8, [40960] * 8]),
}


@pytest.mark.parametrize("bpc", [1, 4])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_vllm_worker_store_and_load_bit_exact(shape, bpc):
    geometry, num_blocks, num_chunks = SHAPES[shape], 96, 48
    kv = _kv_caches(geometry["block"], geometry["layers"], num_blocks, geometry["groups"])
    groups = [[r.page_size_bytes for r in g] for g in kv.group_data_refs]
    worker = cv.make_worker(kv, bpc, num_chunks)
    gpu, cpu = _gpu_bytes(kv), [np.array(c, copy=True) for c in worker.cpu_chunks]
    rng = np.random.default_rng(3)
    n = len(groups)
    sizes, starts = [13] * n, [3] * n  # 13 blocks from block 3 of a request: unaligned first and last chunks
    gpu_ids = rng.permutation(num_blocks)[: sum(sizes)].tolist()
    chunk_ids = rng.permutation(num_chunks)[: n * -(-(13 + 3 % bpc) // bpc)].tolist()
    store = _spec(gpu_ids, sizes, starts), _spec(chunk_ids)
    assert worker.submit_store(1, *store)
    result = _finish(worker, [1])[1]
    assert (
        result.success
        and result.transfer_size == sum(13 * sum(g) for g in groups)
        and result.transfer_time > 0
    )
    _reference(gpu, cpu, groups, store[0], store[1].block_ids, bpc, True)
    for got, want in zip(worker.cpu_chunks, cpu):
        assert np.array_equal(got, want)
    for t in kv.tensors:
        t.tensor.zero_()  # evicted; load back into other blocks
    gpu = [np.zeros_like(a) for a in gpu]
    back = rng.permutation(num_blocks)[: sum(sizes)].tolist()
    load = _spec(chunk_ids), _spec(back, sizes, starts)
    assert worker.submit_load(2, *load)
    assert _finish(worker, [2])[2].success
    _reference(cpu, gpu, groups, load[1], load[0].block_ids, bpc, False)
    for got, want in zip(_gpu_bytes(kv), gpu):
        assert np.array_equal(got, want)
    worker.shutdown()


@pytest.mark.parametrize("shape", ["llama3-8b", "hybrid-2-groups"])
def test_vllm_bad_block_id_is_success_false_and_writes_nothing(shape):
    """One op (Llama): the launch refuses the rows; two ops (the hybrid's
    groups): the host refuses them before either call."""
    geometry, num_blocks, num_chunks = SHAPES[shape], 64, 32
    kv = _kv_caches(geometry["block"], geometry["layers"], num_blocks, geometry["groups"])
    n = len(kv.group_data_refs)
    worker = cv.make_worker(kv, 2, num_chunks)
    gpu, cpu = _gpu_bytes(kv), [np.array(c, copy=True) for c in worker.cpu_chunks]
    bad_gpu = _spec([1, 2, num_blocks] + list(range(10, 10 + 3 * (n - 1))), [3] * n, [0] * n)
    worker.submit_store(1, bad_gpu, _spec(list(range(2 * n))))  # GPU block 64 of 64
    bad_chunks = _spec([0, num_chunks] * n)  # chunk 32 of 32
    worker.submit_load(2, bad_chunks, _spec(list(range(20, 20 + 4 * n)), [4] * n, [0] * n))
    results = _finish(worker, [1, 2])
    assert not results[1].success and not results[2].success
    assert results[1].transfer_size is None and results[1].transfer_time is None
    assert all(np.array_equal(got, want) for got, want in zip(worker.cpu_chunks, cpu))
    assert all(np.array_equal(got, want) for got, want in zip(_gpu_bytes(kv), gpu))
    worker.shutdown()


def test_vllm_a_failure_does_not_fail_the_next_transfer():
    kv = _kv_caches((64, 576), 4, 32)
    worker = cv.make_worker(kv, 1, 32)
    worker.submit_store(1, _spec([1, 99], [2], [0]), _spec([1, 2]))
    worker.submit_store(2, _spec([3, 4], [2], [0]), _spec([3, 4]))  # submitted before 1 is reported
    worker.submit_store(3, _spec([5], [1], [0]), _spec([5]))
    results = _finish(worker, [1, 2, 3])
    assert [results[j].success for j in (1, 2, 3)] == [False, True, True]
    gpu = _gpu_bytes(kv)
    assert all(np.array_equal(c[[3, 4, 5]], g[[3, 4, 5]]) for c, g in zip(worker.cpu_chunks, gpu))
    worker.shutdown()


def test_vllm_stores_wait_for_the_current_streams_compute():
    """A store submitted while the compute stream is still writing its
    blocks copies what the compute wrote (vLLM: stream.wait_stream(current))."""
    kv = _kv_caches((2, 16, 8, 128), 4, 16)
    worker = cv.make_worker(kv, 1, 16)
    current = torch.cuda.current_stream()
    spin(cp.cuda.ExternalStream(current.cuda_stream), 200)  # compute still running
    for t in kv.tensors:
        t.tensor[3].fill_(7.0)  # queued behind it on the current stream
    worker.submit_store(1, _spec([3], [1], [0]), _spec([9]))
    assert _finish(worker, [1])[1].success
    want = _gpu_bytes(kv)
    assert all(np.array_equal(c[9], g[3]) for c, g in zip(worker.cpu_chunks, want))
    worker.shutdown()


def test_vllm_results_in_submission_order_with_an_empty_transfer():
    kv = _kv_caches((64, 576), 2, 32)
    worker = cv.make_worker(kv, 1, 32)
    spin(cp.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream), 100)
    worker.submit_store(1, _spec(list(range(16)), [16], [0]), _spec(list(range(16))))
    worker.submit_store(2, _spec([], [0], [0]), _spec([]))
    worker.submit_store(3, _spec([20], [1], [0]), _spec([20]))
    seen = []
    while len(seen) < 3:
        seen += [(r.job_id, r.success) for r in worker.get_finished()]
    assert seen == [(1, True), (2, True), (3, True)]
    worker.shutdown()


def test_vllm_event_kit_events_exist_when_made():
    """torch creates a CUDA event at its first record(): the kit's events
    are recorded once when made, so the worker's records create none."""
    kit = cv.TorchEvents(torch.cuda.current_device())
    events = [kit.new(timing) for timing in (False, True, True)]
    assert all(e.cuda_event != 0 for e in events)
    for e in events:  # recorded on an idle stream: done once the record ran
        kit.wait(e)
    assert all(kit.done(e) for e in events)
    kv = _kv_caches((64, 576), 2, 16)
    worker = cv.make_worker(kv, 1, 16)
    worker.submit_store(1, _spec([1], [1], [0]), _spec([1]))
    (result,) = _finish(worker, [1]).values()
    assert result.success and result.transfer_time is not None and result.transfer_time >= 0
    worker.shutdown()


def test_vllm_classes_where_vllm_imports():
    base = pytest.importorskip("vllm.v1.kv_offload.base", reason="vLLM is not installed here")
    kv = _kv_caches((64, 576), 2, 16)
    worker = cv.make_worker(kv, 1, 16)
    assert isinstance(worker, base.OffloadingWorker)
    worker.submit_store(1, _spec([1], [1], [0]), _spec([1]))
    (result,) = _finish(worker, [1]).values()
    assert isinstance(result, base.TransferResult) and result.success
    worker.shutdown()


# -- SGLang ---------------------------------------------------------------------------

L, H, D, P = 32, 8, 128, 16  # Llama-3-8B: layers, KV heads, head_dim; 16-token pages
TOKENS, HOST_TOKENS = 64 * P, 128 * P
ITEM = H * D * 2


def _bits(t):
    return t.view(torch.int16).cpu().numpy()


def _device_pool(layers=L, heads=H, dim=D):
    g = torch.Generator(device="cuda").manual_seed(5)
    return [
        torch.randint(
            -(2**15), 2**15, (TOKENS, heads, dim), generator=g, device="cuda", dtype=torch.int16
        ).view(torch.bfloat16)
        for _ in range(layers)
    ]


def _pages(rng, n_pages, total_pages):
    """Token indices of whole pages, as HiCache moves them: int64 CUDA tensors."""
    pages = rng.permutation(total_pages)[:n_pages]
    tokens = (pages[:, None] * P + np.arange(P)).reshape(-1)
    return torch.from_numpy(tokens).to("cuda")


def _host(shape):
    return torch.zeros(shape, dtype=torch.bfloat16).pin_memory()


@pytest.mark.parametrize("layout", ["layer_first", "page_first", "page_head"])
def test_sglang_backup_all_layers_and_load_per_layer_bit_exact(layout):
    rng = np.random.default_rng(1)
    dev_k, dev_v = _device_pool(), _device_pool()
    dev_idx, host_idx = _pages(rng, 24, TOKENS // P), _pages(rng, 24, HOST_TOKENS // P)
    layout_dim = ITEM * L
    if layout == "layer_first":
        host = _host((2, L, HOST_TOKENS, H, D))
        sg.transfer_kv_all_layer(dev_k, list(host[0]), dev_v, list(host[1]), dev_idx, host_idx, ITEM, L)
    elif layout == "page_first":
        host = _host((2, HOST_TOKENS, L, H, D))
        sg.transfer_kv_all_layer_lf_pf(dev_k, host[0], dev_v, host[1], dev_idx, host_idx, ITEM, layout_dim, L)
    else:
        host = _host((2, HOST_TOKENS // P, H, P, L, D))
        sg.transfer_kv_all_layer_lf_ph(
            dev_k, host[0], dev_v, host[1], dev_idx, host_idx, ITEM, layout_dim, L, P, H
        )
    for event in sg.last_events():
        event.synchronize()
    hi, di = host_idx.cpu().numpy(), dev_idx.cpu().numpy()

    def host_tokens(kv, layer):  # [tokens, H, D] of one layer, whatever the layout
        if layout == "layer_first":
            return _bits(host[kv, layer])
        if layout == "page_first":
            return _bits(host[kv, :, layer])
        return _bits(host[kv, :, :, :, layer].permute(0, 2, 1, 3).reshape(HOST_TOKENS, H, D))

    for layer in range(L):
        for kv, dev in enumerate((dev_k, dev_v)):
            got = host_tokens(kv, layer)
            assert np.array_equal(got[hi], _bits(dev[layer])[di])
            rest = np.setdiff1d(np.arange(HOST_TOKENS), hi)
            assert not got[rest].any()
    back_k, back_v = [torch.zeros_like(dev_k[0]) for _ in range(2)]
    back_idx = _pages(rng, 24, TOKENS // P)
    for layer in range(L):
        back_k.zero_()
        back_v.zero_()
        if layout == "layer_first":
            sg.transfer_kv_per_layer(host[0, layer], back_k, host[1, layer], back_v, host_idx, back_idx, ITEM)
        elif layout == "page_first":
            sg.transfer_kv_per_layer_pf_lf(
                host[0], back_k, host[1], back_v, host_idx, back_idx, layer, ITEM, layout_dim
            )
        else:
            sg.transfer_kv_per_layer_ph_lf(
                host[0], back_k, host[1], back_v, host_idx, back_idx, layer, ITEM, layout_dim, P, H
            )
        torch.cuda.current_stream().synchronize()
        bi = back_idx.cpu().numpy()
        assert np.array_equal(_bits(back_k)[bi], _bits(dev_k[layer])[di])
        assert np.array_equal(_bits(back_v)[bi], _bits(dev_v[layer])[di])


def test_sglang_page_head_load_keeps_its_rows_per_stream_and_index_write(monkeypatch):
    """A page-head load keeps the source rows it made at its first layer for
    the next layers on that stream; on another stream it makes them again
    (reading them there would race with their making: the first stream is
    held busy here), and after a torch write to the indices it makes the
    new indices' rows.  Every layer bit-exact."""
    rng = np.random.default_rng(7)
    made = []
    page_rows = sg._page_rows
    monkeypatch.setattr(sg, "_page_rows", lambda *a: made.append(1) or page_rows(*a))
    g = torch.Generator(device="cuda").manual_seed(8)
    shape = (2, HOST_TOKENS // P, H, P, L, D)
    host = torch.randint(-(2**15), 2**15, shape, generator=g, device="cuda", dtype=torch.int16)
    host = host.cpu().pin_memory().view(torch.bfloat16)
    host_idx, back_idx = _pages(rng, 24, HOST_TOKENS // P), _pages(rng, 24, TOKENS // P)
    back_k, back_v = [torch.zeros((TOKENS, H, D), dtype=torch.bfloat16, device="cuda") for _ in range(2)]
    first, other = torch.cuda.current_stream(), torch.cuda.Stream()
    torch.cuda.synchronize()

    def load(layer, stream):
        with torch.cuda.stream(stream):
            back_k.zero_()
            back_v.zero_()
            spin(cp.cuda.ExternalStream(stream.cuda_stream), 50)  # the rows are made behind this
            sg.transfer_kv_per_layer_ph_lf(
                host[0], back_k, host[1], back_v, host_idx, back_idx, layer, ITEM, ITEM * L, P, H
            )
            stream.synchronize()
        hi, bi = host_idx.cpu().numpy(), back_idx.cpu().numpy()
        for kv, back in enumerate((back_k, back_v)):
            want = _bits(host[kv, :, :, :, layer].permute(0, 2, 1, 3).reshape(HOST_TOKENS, H, D))[hi]
            assert np.array_equal(_bits(back)[bi], want), (layer, kv)

    for layer, stream in ((0, first), (1, first), (2, other), (3, other)):
        load(layer, stream)
    assert len(made) == 2  # once per stream
    with torch.cuda.stream(other):
        host_idx.copy_(_pages(rng, 24, HOST_TOKENS // P))  # a write torch counts
    load(4, other)
    load(5, other)
    assert len(made) == 3


def test_sglang_mla_deepseek_v3_bit_exact():
    rng = np.random.default_rng(2)
    layers, dim = 61, 576
    item = dim * 2
    dev = _device_pool(layers, 1, dim)
    dev_idx, host_idx = _pages(rng, 20, TOKENS // P), _pages(rng, 20, HOST_TOKENS // P)
    host_lf, host_pf = _host((layers, HOST_TOKENS, 1, dim)), _host((HOST_TOKENS, layers, 1, dim))
    sg.transfer_kv_all_layer_mla(dev, list(host_lf), dev_idx, host_idx, item, layers)
    sg.transfer_kv_all_layer_mla_lf_pf(dev, host_pf, dev_idx, host_idx, item, item * layers, layers)
    torch.cuda.current_stream().synchronize()
    hi, di = host_idx.cpu().numpy(), dev_idx.cpu().numpy()
    for j in range(layers):
        want = _bits(dev[j])[di]
        assert np.array_equal(_bits(host_lf[j])[hi], want) and np.array_equal(_bits(host_pf[:, j])[hi], want)
    back = torch.zeros_like(dev[0])
    for j in (0, 30, 60):
        for how in ("lf", "pf"):
            back.zero_()
            if how == "lf":
                sg.transfer_kv_per_layer_mla(host_lf[j], back, host_idx, dev_idx, item)
            else:
                sg.transfer_kv_per_layer_mla_pf_lf(host_pf, back, host_idx, dev_idx, j, item, item * layers)
            torch.cuda.current_stream().synchronize()
            assert np.array_equal(_bits(back)[di], _bits(dev[j])[di])


def test_sglang_direct_variants_bit_exact():
    rng = np.random.default_rng(3)
    dev = _device_pool(2 * L)  # K layers then V layers
    dev_idx, host_idx = _pages(rng, 12, TOKENS // P), _pages(rng, 12, HOST_TOKENS // P)
    host = _host((2, HOST_TOKENS // P, L, P, H, D))  # page_first_direct
    sg.transfer_kv_all_layer_direct_lf_pf(dev, [host[0], host[1]], dev_idx, host_idx, P)
    torch.cuda.current_stream().synchronize()
    pages, starts = host_idx.cpu().numpy()[::P] // P, dev_idx.cpu().numpy()[::P]
    for j in (0, 17, L - 1):
        for kv in range(2):
            for page, start in zip(pages, starts):
                assert np.array_equal(_bits(host[kv, page, j]), _bits(dev[kv * L + j])[start : start + P])
    back = [torch.zeros_like(dev[0]) for _ in range(2)]
    sg.transfer_kv_per_layer_direct_pf_lf([host[0], host[1]], back, host_idx, dev_idx, 5, P)
    torch.cuda.current_stream().synchronize()
    di = dev_idx.cpu().numpy()
    assert np.array_equal(_bits(back[0])[di], _bits(dev[5])[di]) and np.array_equal(
        _bits(back[1])[di], _bits(dev[L + 5])[di]
    )
    lf = [torch.zeros((HOST_TOKENS, H, D), dtype=torch.bfloat16).pin_memory() for _ in range(2)]
    sg.transfer_kv_direct(dev[:1] + dev[L : L + 1], lf, dev_idx, host_idx, P)
    torch.cuda.current_stream().synchronize()
    hi = host_idx.cpu().numpy()
    assert np.array_equal(_bits(lf[0])[hi], _bits(dev[0])[di]) and np.array_equal(
        _bits(lf[1])[hi], _bits(dev[L])[di]
    )


def test_sglang_bad_index_raises_and_writes_nothing():
    dev_k, dev_v = _device_pool(1), _device_pool(1)
    host = _host((2, 1, HOST_TOKENS, H, D))
    bad = torch.tensor([1, TOKENS], dtype=torch.int64, device="cuda")  # token 1024 of 1024
    ok = torch.tensor([5, 6], dtype=torch.int64, device="cuda")
    sg.transfer_kv_per_layer(dev_k[0], host[0, 0], dev_v[0], host[1, 0], bad, ok, ITEM)
    (event,) = sg.last_events()
    with pytest.raises(IndexError, match="out of range"):
        event.synchronize()
    assert not host.any()


def test_sglang_a_bad_index_in_a_split_transfer_raises_and_writes_nothing():
    """GPU indices past one call's rows: checked whole (a min/max read to the
    host) before the first launch; a bad one in the last slice raises from
    the call and nothing is written."""
    from cupy_swap import BlockSwapper

    sw = BlockSwapper(max_blocks=64)
    sg.use_swapper(sw)
    try:
        dev_k, dev_v = _device_pool(1), _device_pool(1)
        host = _host((2, 1, HOST_TOKENS, H, D))
        idx = torch.arange(150, dtype=torch.int64, device="cuda")
        bad = idx.clone()
        bad[140] = TOKENS  # token 1024 of 1024, in the third call's rows
        with pytest.raises(IndexError, match="source row 1024 .*nothing was copied"):
            sg.transfer_kv_per_layer(dev_k[0], host[0, 0], dev_v[0], host[1, 0], bad, idx, ITEM)
        assert sg.last_events() == [] and not host.any()
        sg.transfer_kv_per_layer(dev_k[0], host[0, 0], dev_v[0], host[1, 0], idx, idx, ITEM)
        assert len(sg.last_events()) == 3
        for event in sg.last_events():
            event.synchronize()
        assert np.array_equal(_bits(host[0, 0])[:150], _bits(dev_k[0])[:150])
    finally:
        sg.use_swapper(None)
        sw.close()


def test_sglang_against_sgl_kernel_where_it_imports():
    """sgl-kernel's own kernels and these functions, on the same inputs,
    give the same bytes."""
    kvcacheio = pytest.importorskip("sgl_kernel.kvcacheio", reason="sgl-kernel is not installed here")
    rng = np.random.default_rng(4)
    dev_k, dev_v = _device_pool(), _device_pool()
    dev_idx, host_idx = _pages(rng, 16, TOKENS // P), _pages(rng, 16, HOST_TOKENS // P)
    ptrs = lambda ts: torch.tensor([t.data_ptr() for t in ts], dtype=torch.uint64, device="cuda")  # noqa: E731
    ours, theirs = _host((2, L, HOST_TOKENS, H, D)), _host((2, L, HOST_TOKENS, H, D))
    for host, fn in ((ours, sg.transfer_kv_all_layer), (theirs, kvcacheio.transfer_kv_all_layer)):
        dk, dv = ptrs(dev_k), ptrs(dev_v)
        hk, hv = ptrs(list(host[0])), ptrs(list(host[1]))
        if fn is sg.transfer_kv_all_layer:
            for table, layers in ((dk, dev_k), (dv, dev_v), (hk, list(host[0])), (hv, list(host[1]))):
                sg.register_layers(table, layers)
        fn(dk, hk, dv, hv, dev_idx, host_idx, ITEM, L)
        torch.cuda.synchronize()
    assert torch.equal(ours.view(torch.int16), theirs.view(torch.int16))
