"""The contenders cupy_swap is measured against (``bench --peers``), all
on the same buffers, the same mapping and the same stream, in one run,
each checked bit-exactly after it is timed.

Contenders that need no other project:

* **reference kernel, mapping uploaded per call**: the design of the pull
  request this project grew from, as it runs: a pinned buffer and a device
  buffer for the mapping, allocated once (sized for the case's pairs); a
  call writes the mapping into the pinned buffer, copies it to the device
  buffer with one ``cudaMemcpyAsync`` and launches the kernel, one CTA of
  1024 threads per block (so every SM), 8-byte words, through
  ``cupy.RawKernel``, with no checks.
* **reference kernel, mapping already on the GPU**: the same launch with
  the mapping in device memory (an upper bound for that design).
* **per-block memcpy, CUDA graph**: one ``cudaMemcpyAsync`` per block,
  captured once into a CUDA graph and replayed (no per-call Python).
* **cuMemcpyBatchAsync**: one batch call over prebuilt pointer arrays,
  one copy per block.

and cupy_swap itself through ``swap()`` and through a prepared op
(:meth:`BlockSwapper.prepare`), both in ``auto`` mode.  The identifiers
(``seed_upload``, ``seed_resident``, ...) are the JSON keys of the rows;
:data:`CONTENDER_COLUMNS` and :data:`CONTENDER_LABELS` are what people see.
"""

from __future__ import annotations

import numpy as np

from ..cuda import memory
from .bench import CaseBuffers, SwapCase, memcpy_ceiling, time_blocking

__all__ = [
    "SEED_KERNEL_SOURCE",
    "CONTENDERS",
    "CONTENDER_COLUMNS",
    "CONTENDER_LABELS",
    "PEER_CASES",
    "PEER_BLOCK_BYTES",
    "PEER_COUNTS",
    "peer_cases",
    "contender_calls",
    "upload_contender",
    "run_peers_case",
]

SEED_KERNEL_SOURCE = r"""
extern "C" __global__ void __launch_bounds__(1024)
seed_swap_blocks(const long long* __restrict__ src, long long* __restrict__ dst,
                 const long long* __restrict__ mapping, long long words_per_block) {
    const long long s = mapping[2 * blockIdx.x];
    const long long d = mapping[2 * blockIdx.x + 1];
    const long long* from = src + s * words_per_block;
    long long* to = dst + d * words_per_block;
    for (long long i = threadIdx.x; i < words_per_block; i += blockDim.x) {
        to[i] = from[i];
    }
}
"""

# Column order of the table; "lead" marks the best of these per row.
CONTENDERS = (
    "seed_upload",
    "seed_resident",
    "graph_memcpy",
    "batch_memcpy",
    "cupy_swap",
    "cupy_swap_prepared",
)
# Table column headers, and the legend's names (the reference kernel is the
# design of the pull request this project grew from).
CONTENDER_COLUMNS = {
    "seed_upload": "ref+map",
    "seed_resident": "ref",
    "graph_memcpy": "graph",
    "batch_memcpy": "batch",
    "cupy_swap": "swap()",
    "cupy_swap_prepared": "prepared",
}
CONTENDER_LABELS = {
    "seed_upload": "reference kernel, mapping via a pinned buffer + one memcpy per call",
    "seed_resident": "reference kernel, mapping already on the GPU",
    "graph_memcpy": "one cudaMemcpyAsync per block, replayed from a CUDA graph",
    "batch_memcpy": "cuMemcpyBatchAsync, prebuilt arrays",
    "cupy_swap": "cupy_swap swap()",
    "cupy_swap_prepared": "cupy_swap prepared op",
}
KIB, MIB = 1 << 10, 1 << 20
PEER_BLOCK_BYTES = (4 * KIB, 32 * KIB, 256 * KIB, 2 * MIB)
PEER_COUNTS = (1, 16, 1250)


def peer_cases(directions=("in", "out"), block_bytes=PEER_BLOCK_BYTES, counts=PEER_COUNTS, contiguous=False):
    """The cases of ``bench --peers``: every direction x block size x count,
    one part each (the contenders copy one array).

    Returns
    -------
    list of SwapCase
        Direction outermost, then block size, then count.
    """
    return [SwapCase(d, b, n, 1, contiguous) for d in directions for b in block_bytes for n in counts]


PEER_CASES = peer_cases()


def _device_address(part) -> int:
    """Device-visible address of a part's block 0 (host: its alias)."""
    if isinstance(part, np.ndarray):
        alias = memory.host_alias(part.ctypes.data, part.nbytes)
        if not alias:
            raise ValueError("peers: expected mapped pinned host memory (the reference kernel needs it)")
        return alias
    return part.data.ptr


def _raw_address(part) -> int:
    return part.ctypes.data if isinstance(part, np.ndarray) else part.data.ptr


def upload_contender(kernel, addresses, words, mapping, stream):
    """The reference kernel as the pull request runs it: ``fn()`` writes
    ``mapping`` into a pinned buffer, copies it into a device buffer with one
    ``cudaMemcpyAsync`` and launches ``kernel`` over it, one CTA of 1024
    threads per row, all on ``stream``.  Both buffers are allocated here,
    once, sized for ``mapping``'s rows.

    The pinned buffer is rewritten only after the previous call's memcpy
    has read it: each call records an event after its memcpy and the next
    call waits for it before writing.  The timed calls synchronize the
    stream anyway, so the wait returns at once there; the warm-up calls do
    not, and neither does a caller that issues calls back to back.

    Parameters
    ----------
    kernel : cupy.RawKernel
        :data:`SEED_KERNEL_SOURCE`'s ``seed_swap_blocks``.
    addresses : (numpy.uint64, numpy.uint64)
        Device-visible addresses of block 0 of the source and destination.
    words : numpy.int64
        8-byte words per block.
    mapping : numpy.ndarray of shape (n, 2), integers
    stream : cupy.cuda.Stream
    """
    import cupy
    import cupyx
    from cupy.cuda import runtime

    n = len(mapping)
    pinned = cupyx.empty_pinned((max(n, 1), 2), np.int64)  # the pull request's pinned mapping
    with stream:  # from the pool of the stream that reads it, as the resident mapping
        on_gpu = cupy.empty((max(n, 1), 2), np.int64)
    gate = cupy.cuda.Event(disable_timing=True)  # recorded once the memcpy has read ``pinned``
    host_ptr, gpu_ptr, gate_ptr, stream_ptr = pinned.ctypes.data, on_gpu.data.ptr, gate.ptr, stream.ptr
    wait, record, copy, h2d = (
        runtime.eventSynchronize,
        runtime.eventRecord,
        runtime.memcpyAsync,
        runtime.memcpyHostToDevice,
    )
    src_dev, dst_dev = addresses

    def seed_upload():
        wait(gate_ptr)  # the previous call's memcpy is done with the pinned buffer
        pinned[:n] = mapping
        copy(gpu_ptr, host_ptr, 16 * n, h2d, stream_ptr)
        record(gate_ptr, stream_ptr)
        with stream:
            kernel((n,), (1024,), (src_dev, dst_dev, on_gpu, words))

    seed_upload.gate = gate  # the event must outlive the calls that wait on its handle
    return seed_upload


def contender_calls(bufs: CaseBuffers, stream, swapper) -> dict:
    """``name -> fn`` that enqueues one swap of the case on ``stream``."""
    import cupy
    from cupy.cuda import runtime

    from ..cuda.copy_engine import DmaCopier

    case = bufs.case
    (src,), (dst,) = bufs.src, bufs.dst
    m = bufs.mapping
    n, block = len(m), case.block_bytes
    kernel = cupy.RawKernel(SEED_KERNEL_SOURCE, "seed_swap_blocks")
    words = np.int64(block // 8)
    src_dev, dst_dev = np.uint64(_device_address(src)), np.uint64(_device_address(dst))
    with stream:
        resident = cupy.asarray(m)
    stream.synchronize()
    seed_upload = upload_contender(kernel, (src_dev, dst_dev), words, m, stream)

    def seed_resident():
        with stream:
            kernel((n,), (1024,), (src_dev, dst_dev, resident, words))

    kind = runtime.memcpyHostToDevice if case.direction == "in" else runtime.memcpyDeviceToHost
    s_base, d_base = _raw_address(src), _raw_address(dst)
    s_stride, d_stride = src.strides[0], dst.strides[0]
    srcs = (s_base + m[:, 0] * s_stride).astype(np.uint64)
    dsts = (d_base + m[:, 1] * d_stride).astype(np.uint64)
    sizes = np.full(n, block, dtype=np.uint64)
    stream.begin_capture()
    for d, s in zip(dsts.tolist(), srcs.tolist()):
        runtime.memcpyAsync(d, s, block, kind, stream.ptr)
    graph = stream.end_capture()
    if hasattr(graph, "upload"):
        graph.upload(stream)  # instantiate now, not inside the first timed launch

    def graph_memcpy():
        graph.launch(stream)

    copier = DmaCopier()

    def batch_memcpy():
        copier.issue(dsts, srcs, sizes, stream.ptr, kind)

    op = swapper.prepare(src, dst)
    src_list, dst_list = bufs.src, bufs.dst

    def cupy_swap():
        swapper.swap(src_list, dst_list, m, stream=stream)

    def cupy_swap_prepared():
        op(m, stream=stream)

    calls = {
        "seed_upload": seed_upload,
        "seed_resident": seed_resident,
        "graph_memcpy": graph_memcpy,
        "batch_memcpy": batch_memcpy,
        "cupy_swap": cupy_swap,
        "cupy_swap_prepared": cupy_swap_prepared,
    }
    assert tuple(calls) == CONTENDERS
    return calls


def _poison(part) -> None:
    if isinstance(part, np.ndarray):
        part[...] = 0xA5
    else:
        part.fill(0xA5)


def run_peers_case(case: SwapCase, *, reps: int = 20, seed: int = 0, max_ctas: int | None = None) -> dict:
    """Every contender on one case: blocking GB/s (submit + synchronize,
    median of ``reps``), the memcpy ceiling, bit-exactness, and the leader.
    ``max_ctas`` is cupy_swap's CTA budget (None: the library's default).

    Returns
    -------
    dict
        ``direction, block_bytes, num_blocks, contiguous, bytes, ceiling_gbps`` and, per
        contender ``name``: ``name`` (GB/s), ``name + "_ok"`` (bool);
        ``lead``: the fastest contender that copied bit-exactly; ``path``:
        what cupy_swap's ``auto`` chose; ``batch_api``: the call behind the
        ``batch_memcpy`` column.
    """
    import cupy

    from ..swapper import BlockSwapper

    if case.parts != 1:
        raise ValueError(f"case: expected one part (the peers copy one array), got {case.parts}")
    rng = np.random.default_rng(seed)
    bufs = CaseBuffers(case, rng, spare=2 if case.total_bytes < (1 << 30) else 1)
    stream = cupy.cuda.Stream(non_blocking=True)
    swapper = BlockSwapper(max_blocks=max(case.num_blocks, 1), max_ctas=max_ctas)
    calls = contender_calls(bufs, stream, swapper)
    row = case.describe()
    ceiling = memcpy_ceiling(bufs, stream, reps)
    row["ceiling_gbps"] = case.total_bytes / ceiling["latency_s"] / 1e9
    for name, fn in calls.items():
        for part in bufs.dst:
            _poison(part)
        cupy.cuda.Device().synchronize()  # the fill ran on the default stream
        t = time_blocking(fn, stream, reps)
        row[name] = case.total_bytes / t["latency_s"] / 1e9
        row[name + "_ok"] = bufs.verify()
    row["path"] = swapper.last_path
    from ..cuda.copy_engine import batch_available

    # DmaCopier sends a single copy through cudaMemcpyAsync, and so does a driver without the batch call.
    row["batch_api"] = (
        "cuMemcpyBatchAsync" if batch_available() and case.num_blocks > 1 else "cudaMemcpyAsync"
    )
    passed = [name for name in CONTENDERS if row[name + "_ok"]]
    row["lead"] = max(passed, key=lambda name: row[name]) if passed else None
    return row
