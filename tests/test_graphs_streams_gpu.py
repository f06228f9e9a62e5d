"""CUDA-graph capture, stream ordering and concurrent swaps (GPU)."""

import numpy as np
import pytest

import cupy_swap as cs
from cupy_swap.tools.bench import random_mapping

from .gpu_helpers import capture_graph_swap, require_gpu

pytestmark = pytest.mark.gpu

cp = require_gpu()

POISON = 0x5A


def _setup(rng, host_blocks=600, gpu_blocks=500, block=4096):
    host = cs.empty_pinned((host_blocks, block), np.uint8)
    host[:] = rng.integers(0, 256, size=host.shape, dtype=np.uint8)
    gpu = cp.empty((gpu_blocks, block), dtype=cp.uint8)
    return host, gpu


def _expect(host, before, mapping):
    ref = before.copy()
    m = np.asarray(mapping, dtype=np.int64).reshape(-1, 2)
    ref[m[:, 1]] = host[m[:, 0]]
    return ref


def test_graph_capture_with_cupy_replays_new_mappings(rng):
    sw = cs.BlockSwapper(max_blocks=400)
    host, gpu = _setup(rng)
    gs = sw.graph_swap(host, gpu)
    stream = cp.cuda.Stream(non_blocking=True)
    graph = capture_graph_swap(gs, stream)
    for n in (0, 1, 17, 250, 400):  # N = 0 and N = max_blocks included
        gpu.fill(POISON)
        before = cp.asnumpy(gpu)
        mapping = random_mapping(n, 600, 500, rng) if n else np.empty((0, 2), np.int64)
        gs.set_mapping(mapping, stream=stream)
        graph.launch(stream)
        stream.synchronize()
        assert np.array_equal(cp.asnumpy(gpu), _expect(host, before, mapping)), n


def test_graph_replays_queued_back_to_back(rng):
    """Several (set_mapping, replay) rounds queued without waiting: each
    replay must see its own mapping (the staging copies are stream-ordered)."""
    sw = cs.BlockSwapper(max_blocks=64, ring_size=3)
    host, _ = _setup(rng)
    outs = [cp.empty((64, 4096), dtype=cp.uint8) for _ in range(10)]
    stream = cp.cuda.Stream(non_blocking=True)
    graphs, maps = [], []
    gs_list = [sw.graph_swap(host, out) for out in outs]
    for gs in gs_list:
        gs.set_mapping([], stream=stream)
        stream.begin_capture()
        gs.launch(stream=stream)
        graphs.append(stream.end_capture())
    for gs, graph in zip(gs_list, graphs):
        m = random_mapping(64, 600, 64, rng)
        maps.append(m)
        gs.set_mapping(m, stream=stream)
        graph.launch(stream)
    stream.synchronize()
    for out, m in zip(outs, maps):
        ref = np.empty((64, 4096), np.uint8)
        ref[m[:, 1]] = host[m[:, 0]]
        assert np.array_equal(cp.asnumpy(out), ref)


def test_graph_capture_with_torch(rng):
    torch = pytest.importorskip(
        "torch",
        reason='needs PyTorch: pip install torch, or the torch extra (pip install -e ".[cuda12,test,torch]")',
    )
    if not torch.cuda.is_available():
        pytest.skip("needs PyTorch with CUDA (this torch build or machine has none)")
    sw = cs.BlockSwapper(max_blocks=128)
    host = torch.empty((300, 2048), dtype=torch.float16).pin_memory()
    host.view(torch.int16).copy_(
        torch.from_numpy(rng.integers(-30000, 30000, size=(300, 2048), dtype=np.int16))
    )
    gpu = torch.empty((200, 2048), dtype=torch.float16, device="cuda")
    gs = sw.graph_swap(host, gpu)
    g = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        gs.set_mapping([], stream=side)
        side.synchronize()
        with torch.cuda.graph(g, stream=side):
            gs.launch(stream=torch.cuda.current_stream())
    host_np = host.view(torch.int16).numpy()
    for n in (0, 5, 128):
        gpu.view(torch.int16).fill_(POISON)
        mapping = random_mapping(n, 300, 200, rng) if n else np.empty((0, 2), np.int64)
        stream = torch.cuda.current_stream()
        gs.set_mapping(torch.from_numpy(mapping), stream=stream)
        g.replay()
        torch.cuda.synchronize()
        got = gpu.view(torch.int16).cpu().numpy()
        ref = np.full((200, 2048), POISON, dtype=np.int16)
        ref[mapping[:, 1]] = host_np[mapping[:, 0]]
        assert np.array_equal(got, ref), n


@pytest.mark.parametrize("mode", ["kernel", "dma"])
def test_swap_never_synchronizes_works_while_capturing(rng, mode):
    sw = cs.BlockSwapper(max_blocks=128, ring_size=4)
    host, gpu = _setup(rng)
    stream = cp.cuda.Stream(non_blocking=True)
    mapping = random_mapping(100, 600, 500, rng)
    stream.begin_capture()
    sw.swap_in(host, gpu, mapping, stream=stream, mode=mode)
    graph = stream.end_capture()
    # Later swaps reuse the ring; the captured one kept its own slot.
    for _ in range(10):
        sw.swap_in(host, cp.empty_like(gpu), random_mapping(100, 600, 500, rng), stream=stream)
    gpu.fill(POISON)
    before = cp.asnumpy(gpu)
    graph.launch(stream)
    stream.synchronize()
    assert np.array_equal(cp.asnumpy(gpu), _expect(host, before, mapping))


def test_wait_for_orders_after_producer(rng):
    sw = cs.BlockSwapper(max_blocks=64)
    compute = cp.cuda.Stream(non_blocking=True)
    copy = cp.cuda.Stream(non_blocking=True)
    gpu = cp.zeros((64, 1 << 16), dtype=cp.float32)
    host = cs.zeros_pinned((64, 1 << 16), np.float32)
    a = cp.ones((4096, 4096), dtype=cp.float32)
    with compute:
        for _ in range(4):
            a = a @ a / 4096.0  # keep the producer stream busy for a while
        gpu += a[0, 0] * 0 + 7.0  # the "model" writes the blocks
    mapping = [(i, i) for i in range(64)]
    ev = sw.swap_out(gpu, host, mapping, stream=copy, wait_for=compute)
    ev.synchronize()
    assert (host == 7.0).all()
    ev2 = sw.swap_out(gpu, host, mapping, stream=copy, wait_for=[compute.record()], timing=True)
    assert ev2.device_time() > 0 and ev2.gbps() > 0 and ev2.path in ("kernel", "dma")
    with pytest.raises(TypeError, match="wait_for: expected events or streams"):
        sw.swap_out(gpu, host, mapping, stream=copy, wait_for=["soon"])
    with pytest.raises(ValueError, match="not timed"):
        sw.swap_out(gpu, host, mapping, stream=copy).device_time()


def test_torch_streams_accepted(rng):
    torch = pytest.importorskip(
        "torch",
        reason='needs PyTorch: pip install torch, or the torch extra (pip install -e ".[cuda12,test,torch]")',
    )
    if not torch.cuda.is_available():
        pytest.skip("needs PyTorch with CUDA (this torch build or machine has none)")
    sw = cs.BlockSwapper(max_blocks=16)
    host, gpu = _setup(rng)
    s = torch.cuda.Stream()
    ev = sw.swap_in(host, gpu, [(1, 2), (3, 4)], stream=s)
    ev.synchronize()
    assert np.array_equal(cp.asnumpy(gpu[[2, 4]]), host[[1, 3]])


def test_duplex_stress_two_streams(rng):
    """Many alternating swap-ins and swap-outs on two streams, one swapper,
    random mappings; disjoint regions per stream, checked against a NumPy
    replay of each stream's order."""
    sw = cs.BlockSwapper(max_blocks=256, ring_size=8)
    block = 2048
    gpu = cp.empty((1000, block), dtype=cp.uint8)
    host = cs.empty_pinned((2000, block), np.uint8)
    gpu[:] = cp.asarray(rng.integers(0, 256, size=gpu.shape, dtype=np.uint8))
    host[:] = rng.integers(0, 256, size=host.shape, dtype=np.uint8)
    ref_gpu, ref_host = cp.asnumpy(gpu), host.copy()
    s_out, s_in = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    g_src, h_dst = gpu[:500], host[:1000]  # swap-outs: GPU 0..499 -> host 0..999
    h_src, g_dst = host[1000:], gpu[500:]  # swap-ins: host 1000..1999 -> GPU 500..999
    for i in range(300):
        n = int(rng.integers(1, 257))
        if i % 2:
            m = random_mapping(n, 500, 1000, rng)
            sw.swap_out(g_src, h_dst, m, stream=s_out)
            ref_host[m[:, 1]] = ref_gpu[m[:, 0]]
        else:
            m = random_mapping(n, 1000, 500, rng)
            sw.swap_in(h_src, g_dst, m, stream=s_in)
            ref_gpu[500 + m[:, 1]] = ref_host[1000 + m[:, 0]]
    s_out.synchronize()
    s_in.synchronize()
    assert np.array_equal(host, ref_host)
    assert np.array_equal(cp.asnumpy(gpu), ref_gpu)
