"""A swap inside your own CUDA graph, loading in each replay the blocks the GPU picked in it.

Engines replay a whole decode step as one CUDA graph, so no step may wait for the host. A
kernel picks the host blocks scoring above a threshold and writes their rows into the captured
swap's buffers (``op.captured(max_rows)``), the swap loads them host -> GPU, and a consumer
kernel reads them. Every replay picks from new scores and is checked bit for bit with NumPy.

    python examples/inside_cuda_graph.py [--replays 200] [--max-rows 64]
"""

import argparse
import sys

import numpy as np

import cupy_swap

HOST_BLOCKS, BLOCK, THRESHOLD = 512, (16, 8, 128), 0.9  # blocks of 32 KiB in fp16
WORDS = int(np.prod(BLOCK)) // 2  # a block as the consumer reads it: 32-bit words

SOURCE = r"""
// A host block h scoring above the threshold takes the next row (an atomic counter: rows come
// in any order); row i loads host block h into GPU slot i.
extern "C" __global__ void pick(const float* scores, int n_host, float threshold,
                                long long* rows, long long* count, int max_rows) {
    int h = blockIdx.x * blockDim.x + threadIdx.x;
    if (h >= n_host || !(scores[h] > threshold)) return;
    long long i = (long long)atomicAdd((unsigned long long*)count, 1ULL);
    if (i < max_rows) { rows[2 * i] = h; rows[2 * i + 1] = i; }
}
// More picks than rows: load the first max_rows (a count above max_rows fails the replay).
extern "C" __global__ void clamp(long long* count, long long max_rows) {
    if (*count > max_rows) *count = max_rows;
}
// One CTA per GPU slot: a weighted sum of its words mod 2**32 (the same bits in any order of
// additions), 0 for the slots this replay did not load.
extern "C" __global__ void consume(const unsigned int* gpu, long long words,
                                   const long long* count, unsigned int* out) {
    __shared__ unsigned int sum;  // this slot's checksum
    if (threadIdx.x == 0) sum = 0;
    __syncthreads();
    if (blockIdx.x < *count) {
        unsigned int part = 0;
        for (long long j = threadIdx.x; j < words; j += blockDim.x)
            part += (unsigned int)(j + 1) * gpu[blockIdx.x * words + j];
        atomicAdd(&sum, part);
    }
    __syncthreads();
    if (threadIdx.x == 0) out[blockIdx.x] = sum;
}
"""


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description="A swap inside a captured decode step, replayed with new picks.")
    p.add_argument("--replays", type=int, default=200, help="graph replays, each with new scores")
    p.add_argument("--max-rows", type=int, default=64, help="most blocks one replay loads (GPU slots)")
    args = p.parse_args(argv)
    try:  # CuPy imported once the arguments are parsed: --help works without it
        import cupy
    except ImportError as e:  # CuPy comes with the cuda12 or cuda13 extra: one line, exit 3 (below)
        msg = f"needs CuPy ({e}); install cupy_swap with its cuda12 or cuda13 extra"
        raise cupy_swap.CudaUnavailableError(msg) from e
    rng, m = np.random.default_rng(0), args.max_rows
    host = cupy_swap.empty_pinned((HOST_BLOCKS, *BLOCK), np.float16)  # pinned host cache
    host.view(np.uint16)[...] = rng.integers(0, 1 << 16, host.shape, dtype=np.uint16)
    sw = cupy_swap.BlockSwapper(max_blocks=m)
    gpu = cupy.zeros((m, *BLOCK), cupy.float16)  # the GPU slots a replay loads into
    cap = sw.prepare(host, gpu).captured(m)  # owns cap.rows, cap.count and the completion word

    # Everything the graph touches exists before the capture: a capture must not allocate.
    mod = cupy.RawModule(code=SOURCE)
    pick, clamp, consume = (mod.get_function(k) for k in ("pick", "clamp", "consume"))  # compiled now
    scores = cupy.zeros(HOST_BLOCKS, cupy.float32)  # rewritten before each replay
    out = cupy.zeros(m, cupy.uint32)  # the consumer's result: one checksum per slot
    stream = cupy.cuda.Stream(non_blocking=True)  # no implicit sync with the legacy default stream
    cupy.cuda.Device().synchronize()  # the zeros above are written before the stream runs

    # Capture once: these five steps become one graph (nothing runs yet).
    stream.begin_capture()
    with stream:  # CuPy launches RawKernels on its current stream
        cupy.cuda.runtime.memsetAsync(cap.count.data.ptr, 0, 8, stream.ptr)  # count = 0, in the graph
        pick_args = (scores, np.int32(HOST_BLOCKS), np.float32(THRESHOLD), cap.rows, cap.count, np.int32(m))
        pick(((HOST_BLOCKS + 255) // 256,), (256,), pick_args)
        clamp((1,), (1,), (cap.count, np.int64(m)))
        cap.launch(stream)  # the swap: copies the first `count` rows of `rows` as a replay finds them
        consume((m,), (256,), (gpu, np.int64(WORDS), cap.count, out))  # after the swap: sees its blocks
    graph = stream.end_capture()

    words = host.view(np.uint32).reshape(HOST_BLOCKS, WORDS)  # the host blocks as the consumer reads them
    weights, moved = np.arange(1, WORDS + 1, dtype=np.uint32), 0
    for replay in range(1, args.replays + 1):
        s = (rng.random(HOST_BLOCKS) * rng.uniform(0.85, 1.1)).astype(np.float32)  # 0 to over m picks
        with stream:  # outside the graph, before the replay, on its stream
            scores.set(s)
            gpu.fill(0)  # only for the check: a slot the swap missed keeps no older replay's block
        graph.launch(stream)
        stream.synchronize()
        failed = cap.failures()  # bad replays, each reported once (a bad replay writes nothing)
        assert not failed, f"replay {replay}: {failed}"
        chosen = np.flatnonzero(s > np.float32(THRESHOLD))
        n = int(cap.count.get())
        rows = cap.rows[:n].get()  # in any order: the atomic counter decided it
        assert n == min(len(chosen), m), (replay, n, len(chosen))
        assert np.array_equal(rows[:, 1], np.arange(n))  # row i went to slot i
        assert np.isin(rows[:, 0], chosen).all() and len(np.unique(rows[:, 0])) == n
        want = np.zeros(m, np.uint32)
        want[:n] = (words[rows[:, 0]] * weights).sum(axis=1, dtype=np.uint32)  # wraps as on the GPU
        assert np.array_equal(out.get(), want), f"replay {replay}: the consumer read other bytes"
        moved += n
    done = np.zeros(1, np.int64)  # the completion word: the last replay whose copy finished
    cupy.cuda.runtime.memcpy(done.ctypes.data, cap.done_ptr, 8, cupy.cuda.runtime.memcpyDeviceToHost)
    assert done[0] == args.replays, done
    print(f"ok: {args.replays} replays of one graph (pick, swap, consume), {moved} blocks loaded: bit-exact")


if __name__ == "__main__":
    try:
        sys.exit(main())
    except cupy_swap.CudaUnavailableError as e:  # no GPU, driver or CuPy here: one line, exit 3
        print(f"{sys.argv[0]}: {e}", file=sys.stderr)
        sys.exit(3)
