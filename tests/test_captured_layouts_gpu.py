"""Issue 40 on the GPU: a swap captured into the caller's CUDA graph, over
every layout prepared ops take (64 parts, 61 MLA parts, 2 MiB blocks, views
of one block-first pool) and every direction, replayed 1000 times with
random rows and counts from 0 to max_rows written *in the replay* by a slow
producer kernel; every replay checked bit for bit against a NumPy model of
the destination; bad replays write nothing and are reported once; the
completion word, another captured stream, torch.cuda.graph, layer-by-layer
loads and a second thread's capture."""

import threading

import numpy as np
import pytest

import cupy_swap as cs
from cupy_swap.cuda import capture

from .gpu_helpers import rand_fill, require_gpu, to_host

pytestmark = pytest.mark.gpu

cp = require_gpu()

REPLAYS = 1000

# A producer as an engine's would be: it spins (slow), then writes this
# replay's rows and count where the swap reads them.  The swap must read
# what it wrote (same stream, later node), never the previous replay's.
_PRODUCE = cp.RawKernel(
    r"""
extern "C" __global__ void produce(const long long* staged, const long long* staged_count,
                                   long long* src, long long* dst, long long step,
                                   long long* count, long long rows, unsigned long long spin_ns) {
    if (threadIdx.x == 0) {
        unsigned long long s, t;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(s));
        do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - s < spin_ns);
    }
    __syncthreads();
    for (long long i = threadIdx.x; i < rows; i += blockDim.x) {
        src[i * step] = staged[2 * i];
        dst[i * step] = staged[2 * i + 1];
    }
    if (threadIdx.x == 0) *count = *staged_count;
}
""",
    "produce",
)

# A consumer: out[r] = layer[rows[r, 1]] for the rows of this replay
# (no allocation inside a capture, unlike CuPy's fancy indexing).
_GATHER = cp.RawKernel(
    r"""
extern "C" __global__ void gather(const unsigned char* layer, const long long* rows, unsigned char* out,
                                  long long n_rows, long long nbytes) {
    for (long long r = blockIdx.x; r < n_rows; r += gridDim.x) {
        const long long block = rows[2 * r + 1];
        if (block < 0) continue;
        for (long long i = threadIdx.x; i < nbytes; i += blockDim.x) out[r * nbytes + i] = layer[block * nbytes + i];
    }
}
""",
    "gather",
)

# (parts, blocks, bytes per block, max_rows, pool views)
LAYOUTS = {
    "64 parts": (64, 96, 256, 32, False),
    "61 MLA parts": (61, 96, 576, 32, False),
    "2 MiB blocks": (1, 12, 2 << 20, 8, False),
    "pool views": (16, 96, 1024, 32, True),
}


def _side(kind, parts, blocks, nbytes, pool, rng):
    """The parts of one side: ``parts`` arrays of ``(blocks, nbytes)`` bytes
    (or views of one block-first pool), random."""
    if pool:
        shape = (blocks, parts, nbytes)
        whole = cs.empty_pinned(shape, np.uint8) if kind == "host" else cp.empty(shape, cp.uint8)
        rand_fill(whole, rng)
        return [whole[:, p] for p in range(parts)]
    made = []
    for _ in range(parts):
        a = (
            cs.empty_pinned((blocks, nbytes), np.uint8)
            if kind == "host"
            else cp.empty((blocks, nbytes), cp.uint8)
        )
        rand_fill(a, rng)
        made.append(a)
    return made


class _Producer:
    """Staged rows and count (set from the host before a replay) and the
    producer launch that moves them into the swap's buffers in the replay."""

    def __init__(self, max_rows, rows, count):
        self.max_rows = max_rows
        self.staged = cp.full((max_rows, 2), -1, cp.int64)
        self.staged_count = cp.zeros((), cp.int64)
        if isinstance(rows, tuple):
            self.src, self.dst, self.step = rows[0], rows[1], 1
        else:
            self.src, self.dst, self.step = rows[:, 0], rows[:, 1], 2
        self.count = count
        # Load the producer's module now: loading it inside a capture is
        # not a launch.  Zero rows; writes the staged count (0) into count.
        self.launch(cp.cuda.Stream.null, spin_ns=0, rows=0)
        cp.cuda.Device().synchronize()

    def stage(self, m, n, stream):
        full = np.full((self.max_rows, 2), -1, np.int64)
        full[: len(m)] = m
        self.staged.set(full, stream=stream)
        self.staged_count.set(np.array(n, np.int64), stream=stream)

    def launch(self, stream, spin_ns=20000, rows=None):
        _PRODUCE(
            (1,),
            (128,),
            (
                self.staged,
                self.staged_count,
                self.src,
                self.dst,
                np.int64(self.step),
                self.count,
                np.int64(self.max_rows if rows is None else rows),
                np.uint64(spin_ns),
            ),
            stream=stream,
        )


def _replay_rows(rng, k, blocks, max_rows):
    """Replay ``k``'s rows: a random count from 0 to max_rows, padding in
    some, a bad row in some.  Returns (rows, count, bad)."""
    n = int(rng.integers(0, max_rows + 1))
    m = np.stack([rng.choice(blocks, n, replace=False), rng.choice(blocks, n, replace=False)], 1).astype(
        np.int64
    )
    bad = False
    if n >= 3 and k % 5 == 0:
        m[1, rng.integers(0, 2)] = -1  # padding: skipped
    if n >= 2 and k % 97 == 0:  # a bad row (never row 1, the padded one)
        bad = True
        if k % 2:
            m[n - 1, 1] = m[0, 1]  # a destination twice
        else:
            m[n - 1, 0] = blocks + 3  # a source out of range
    return m, n, bad


@pytest.mark.parametrize("direction", ["in", "out", "gpu"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_a_thousand_replays_copy_the_rows_their_producer_wrote(rng, layout, direction):
    parts, blocks, nbytes, max_rows, pool = LAYOUTS[layout]
    src_kind, dst_kind = {"in": ("host", "gpu"), "out": ("gpu", "host"), "gpu": ("gpu", "gpu")}[direction]
    src = _side(src_kind, parts, blocks, nbytes, pool, rng)
    dst = _side(dst_kind, parts, blocks, nbytes, pool, rng)
    sw = cs.BlockSwapper(max_blocks=max_rows)
    op = sw.prepare(src if parts > 1 else src[0], dst if parts > 1 else dst[0])
    their = (
        direction == "gpu"
    )  # the caller's own buffers (pair form) on one direction, the swap's on the others
    if their:
        rows = (cp.full(max_rows, -1, cp.int64), cp.full(max_rows, -1, cp.int64))
        count = cp.zeros((1,), cp.int64)
        cap = op.captured(max_rows, ring=4, rows=rows, count=count)
    else:
        cap = op.captured(max_rows, ring=4)
    producer = _Producer(max_rows, cap.rows, cap.count)
    stream = cp.cuda.Stream(non_blocking=True)
    stream.begin_capture()
    producer.launch(stream)
    cap.launch(stream)
    graph = stream.end_capture()
    src_h = [to_host(a) for a in src]
    model = [to_host(a) for a in dst]
    bad_seen = 0
    for k in range(1, REPLAYS + 1):
        m, n, bad = _replay_rows(rng, k, blocks, max_rows)
        producer.stage(m, n, stream)
        graph.launch(stream)
        stream.synchronize()
        found = cap.failures()
        if bad:
            bad_seen += 1
            assert len(found) == 1 and found[0].replay == k, (k, found)
        else:
            assert found == [], (k, found)
            for s, d in m[:n]:
                if s >= 0 and d >= 0:
                    for p in range(parts):
                        model[p][d] = src_h[p][s]
        # Three parts each replay (the one part once), every part at the end.
        for p in sorted({0, parts // 2, parts - 1}):
            assert np.array_equal(to_host(dst[p]), model[p]), (k, p)
    for p in range(parts):
        assert np.array_equal(to_host(dst[p]), model[p]), p
    assert bad_seen >= 5
    done = cp.ndarray((), cp.int64, cp.cuda.MemoryPointer(cp.cuda.UnownedMemory(cap.done_ptr, 8, cap), 0))
    assert int(done.get()) == REPLAYS


def _one_part(rng, blocks=64, nbytes=4096):
    host = cs.empty_pinned((blocks, nbytes), np.uint8)
    rand_fill(host, rng)
    gpu = cp.zeros((blocks, nbytes), cp.uint8)
    return host, gpu


def test_the_completion_word_lets_a_stream_outside_the_graph_wait_on_the_gpu(rng):
    host, gpu = _one_part(rng)
    sw = cs.BlockSwapper(max_blocks=16)
    cap = sw.prepare(host, gpu).captured(16)
    a, b = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    producer = _Producer(16, cap.rows, cap.count)
    a.begin_capture()
    producer.launch(a, spin_ns=2_000_000)  # 2 ms: b must wait for it on the GPU
    cap.launch(a)
    graph = a.end_capture()
    out = cp.zeros_like(gpu)
    for k in range(1, 6):
        m = np.stack([rng.choice(64, 16, replace=False), rng.choice(64, 16, replace=False)], 1)
        producer.stage(m, 16, a)
        a.synchronize()
        graph.launch(a)
        cap.wait_done(b, k)  # no host wait: b's copy below runs after replay k copied
        out.data.copy_from_device_async(gpu.data, gpu.nbytes, stream=b)
        b.synchronize()
        got = to_host(out)
        assert np.array_equal(got[m[:, 1]], host[m[:, 0]]), k
        a.synchronize()
    assert cap.failures() == []


def test_another_captured_stream_joins_through_a_captured_event(rng):
    host, gpu = _one_part(rng)
    sw = cs.BlockSwapper(max_blocks=16)
    cap = sw.prepare(host, gpu).captured(16)
    a, b = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    producer = _Producer(16, cap.rows, cap.count)
    loaded, joined = cp.cuda.Event(disable_timing=True), cp.cuda.Event(disable_timing=True)
    out = cp.zeros_like(gpu)
    a.begin_capture()
    producer.launch(a)
    cap.launch(a)
    loaded.record(a)
    b.wait_event(loaded)  # the consumer on b sees the blocks
    out.data.copy_from_device_async(gpu.data, gpu.nbytes, stream=b)
    joined.record(b)
    a.wait_event(joined)
    graph = a.end_capture()
    for k in range(20):
        m = np.stack([rng.choice(64, 16, replace=False), rng.choice(64, 16, replace=False)], 1)
        producer.stage(m, 16, a)
        graph.launch(a)
        a.synchronize()
        assert np.array_equal(to_host(out)[m[:, 1]], host[m[:, 0]]), k
    assert cap.failures() == []


def test_layer_by_layer_loads_inside_one_graph(rng):
    """One load per layer on a side stream, layer i's compute waiting only
    for load i (SGLang's load_to_device_per_layer, captured); all layers
    read one row buffer the producer writes."""
    layers, blocks, nbytes, max_rows = 6, 64, 2048, 16
    hosts = [_one_part(rng, blocks, nbytes)[0] for _ in range(layers)]
    gpus = [cp.zeros((blocks, nbytes), cp.uint8) for _ in range(layers)]
    outs = [cp.zeros((max_rows, nbytes), cp.uint8) for _ in range(layers)]
    sw = cs.BlockSwapper(max_blocks=max_rows)
    rows, count = cp.full((max_rows, 2), -1, cp.int64), cp.zeros((), cp.int64)
    caps = [sw.prepare(h, g).captured(max_rows, rows=rows, count=count) for h, g in zip(hosts, gpus)]
    producer = _Producer(max_rows, rows, count)
    _GATHER((1,), (1,), (gpus[0], rows, outs[0], np.int64(0), np.int64(0)))  # loaded before the capture
    main, side = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    picked = cp.cuda.Event(disable_timing=True)
    loaded = [cp.cuda.Event(disable_timing=True) for _ in range(layers)]
    done = cp.cuda.Event(disable_timing=True)
    main.begin_capture()
    producer.launch(main)
    picked.record(main)
    side.wait_event(picked)
    for i in range(layers):
        caps[i].launch(side)
        loaded[i].record(side)
    for i in range(layers):
        main.wait_event(loaded[i])  # layer i's compute: gather its blocks (after load i only)
        _GATHER(
            (max_rows,), (256,), (gpus[i], rows, outs[i], np.int64(max_rows), np.int64(nbytes)), stream=main
        )
    done.record(side)
    main.wait_event(done)
    graph = main.end_capture()
    for k in range(30):
        m = np.stack(
            [rng.choice(blocks, max_rows, replace=False), rng.choice(blocks, max_rows, replace=False)], 1
        )
        producer.stage(m, max_rows, main)
        graph.launch(main)
        main.synchronize()
        for i in range(layers):
            assert np.array_equal(to_host(outs[i]), hosts[i][m[:, 0]]), (k, i)
    assert all(c.failures() == [] for c in caps)


@pytest.mark.torch
def test_captured_from_torch_cuda_graph(rng):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs PyTorch with CUDA")
    host = _one_part(rng)[0]
    gpu = torch.zeros((64, 4096), dtype=torch.uint8, device="cuda")
    sw = cs.BlockSwapper(max_blocks=16)
    rows = torch.full((16, 2), -1, dtype=torch.int64, device="cuda")
    count = torch.zeros((), dtype=torch.int64, device="cuda")
    staged, staged_count = torch.full_like(rows, -1), torch.zeros_like(count)
    cap = sw.prepare(host, gpu).captured(16, rows=rows, count=count)  # made before the capture
    gpu.to(torch.int64).sum(dim=1)  # warm the consumer's kernels outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # torch's own capture stream, global mode
        rows.copy_(staged)  # the "picker": this replay's rows
        count.copy_(staged_count)
        cap.launch(torch.cuda.current_stream())
        checksum = gpu.to(torch.int64).sum(dim=1)  # a consumer after the swap
    for k in range(1, 51):
        m = np.stack([rng.choice(64, 16, replace=False), rng.choice(64, 16, replace=False)], 1)
        n = int(rng.integers(0, 17))
        staged.copy_(torch.from_numpy(np.where(np.arange(16)[:, None] < n, m, -1)))
        staged_count.fill_(n)
        graph.replay()
        torch.cuda.synchronize()
        got = gpu.cpu().numpy()
        assert np.array_equal(got[m[:n, 1]], host[m[:n, 0]]), k
        assert np.array_equal(checksum.cpu().numpy(), got.astype(np.int64).sum(axis=1)), k
    assert cap.failures() == []


def test_capturing_it_breaks_no_other_threads_capture(rng):
    """Two threads capture at once in global mode (the strictest): one a
    captured swap, the other its own kernels; an allocation or unsafe call
    in either would invalidate a capture."""
    host, gpu = _one_part(rng)
    sw = cs.BlockSwapper(max_blocks=16)
    cap = sw.prepare(host, gpu).captured(16)
    producer = _Producer(16, cap.rows, cap.count)
    x = cp.arange(1 << 16, dtype=cp.float32)
    y = cp.empty_like(x)
    cp.multiply(x, 2, out=y)  # its kernel loaded before the captures
    cp.cuda.Device().synchronize()
    mode = cp.cuda.runtime.streamCaptureModeGlobal
    # A timeout: a thread that failed before a barrier leaves no other waiting forever.
    barrier, errors, graphs = threading.Barrier(2, timeout=60), [], {}

    def end(stream):
        # Ending a capture instantiates its graph, which may be an unsafe call
        # while the other thread still captures in global mode: the test's own
        # call, not the swap's, so made in relaxed mode.
        with capture.relaxed():
            return stream.end_capture()

    def other():
        s = cp.cuda.Stream(non_blocking=True)
        try:
            barrier.wait()
            s.begin_capture(mode)
            barrier.wait()
            with s:
                cp.multiply(x, 2, out=y)
            graphs["other"] = end(s)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    t = threading.Thread(target=other, daemon=True)
    t.start()
    s = cp.cuda.Stream(non_blocking=True)
    barrier.wait()
    s.begin_capture(mode)
    barrier.wait()
    producer.launch(s)
    cap.launch(s)
    graph = end(s)
    t.join(60)
    assert not t.is_alive() and errors == []
    m = np.stack([np.arange(16), np.arange(16) + 32], 1)
    producer.stage(m, 16, s)
    graph.launch(s)
    graphs["other"].launch(s)
    s.synchronize()
    assert np.array_equal(to_host(gpu)[32:48], host[:16])
    assert np.array_equal(to_host(y), to_host(x) * 2)
    assert cap.failures() == []
