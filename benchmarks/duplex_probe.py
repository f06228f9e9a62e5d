"""Where full duplex is lost: swap-in and swap-out of ``N`` blocks each way,
in flight together on two streams, served by every combination of paths
(kernel, copy engines, staged = kernel gather/scatter + one copy-engine
transfer), against the bare copy-engine ceiling measured several ways.

    PYTHONPATH=$PWD python3 benchmarks/duplex_probe.py [--json FILE]

Figures are blocking latency (submit both + synchronize both, median), as
``bench --bidir`` measures them, in GB/s of both directions together.
"""

import argparse
import json
import statistics
import time

import cupy
import numpy as np
from cupy.cuda import runtime

from cupy_swap import BlockSwapper, memory
from cupy_swap.tools.bench import fill_random

H2D, D2H, DEFAULT = 1, 2, 4


class Side:
    """One direction's pools: ``2 N`` random blocks on each side, a
    ``N``-block staging buffer on the GPU, and flat buffers for the ceiling."""

    def __init__(self, n, block, rng):
        self.n, self.block = n, block
        self.host = memory.empty_pinned((2 * n, block), np.uint8)
        fill_random(self.host, rng)
        self.gpu = cupy.empty((2 * n, block), dtype=cupy.uint8)
        fill_random(self.gpu, rng)
        self.stage = cupy.empty((n, block), dtype=cupy.uint8)
        self.flat_host = memory.empty_pinned((n * block,), np.uint8)
        self.flat_gpu = cupy.empty((n * block,), dtype=cupy.uint8)
        self.gpu_ids = rng.choice(2 * n, size=n, replace=False).astype(np.int64)
        self.host_ids = rng.choice(2 * n, size=n, replace=False).astype(np.int64)
        self.h0 = int(rng.integers(0, n))  # start of a contiguous host run
        self.iota = np.arange(n, dtype=np.int64)
        self.host_run = self.iota + self.h0


def timed(fn, streams, reps):
    for _ in range(3):
        fn()
    for s in streams:
        s.synchronize()
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        for s in streams:
            s.synchronize()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=1250)
    ap.add_argument("--block-bytes", type=int, default=32768)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--json")
    args = ap.parse_args()
    n, block = args.blocks, args.block_bytes
    rng = np.random.default_rng(0)
    a, b = Side(n, block, rng), Side(n, block, rng)  # a: swap-in, b: swap-out
    nbytes = n * block
    s_in, s_out = cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)
    extra = [cupy.cuda.Stream(non_blocking=True) for _ in range(8)]
    sw = {c: BlockSwapper(max_blocks=n, max_ctas=c) for c in (8, 32, 132)}
    sw_in, sw_out = BlockSwapper(max_blocks=n), BlockSwapper(max_blocks=n)
    results = {}

    def rec(name, fn, streams, total):
        t = timed(fn, streams, args.reps)
        results[name] = {"latency_us": t * 1e6, "gbps": total / t / 1e9}
        print(f"{name:<58} {t * 1e6:9.1f} us {total / t / 1e9:7.1f} GB/s", flush=True)

    # ---- pieces, one direction at a time
    def memcpy_in(stream=s_in, kind=H2D, host=None):
        src = a.flat_host.ctypes.data if host is None else host
        runtime.memcpyAsync(a.flat_gpu.data.ptr, src, nbytes, kind, stream.ptr)

    def memcpy_out(stream=s_out, kind=D2H, host=None):
        dst = b.flat_host.ctypes.data if host is None else host
        runtime.memcpyAsync(dst, b.flat_gpu.data.ptr, nbytes, kind, stream.ptr)

    m_in_random = np.column_stack((a.host_ids, a.gpu_ids))
    m_out_random = np.column_stack((b.gpu_ids, b.host_ids))
    m_in_runhost = np.column_stack((a.host_run, a.gpu_ids))  # contiguous host, random GPU
    m_out_runhost = np.column_stack((b.gpu_ids, b.host_run))

    def kernel_in(m=m_in_random, s=s_in, swp=sw_in):
        swp.swap(a.host, a.gpu, m, stream=s, mode="kernel")

    def kernel_out(m=m_out_random, s=s_out, swp=sw_out):
        swp.swap(b.gpu, b.host, m, stream=s, mode="kernel")

    def dma_split(side_src, side_dst, m, streams):
        k = len(streams)
        for i, st in enumerate(streams):
            sw_in.swap(side_src, side_dst, m[i::k], stream=st, mode="dma")

    def staged_in(ctas=32, s=s_in):
        # one H2D transfer of the contiguous host run, then a scatter on the GPU
        runtime.memcpyAsync(a.stage.data.ptr, a.host[a.h0 :].ctypes.data, nbytes, H2D, s.ptr)
        sw[ctas].swap(a.stage, a.gpu, m_scatter_in, stream=s, mode="kernel")

    m_gather_out = np.column_stack((b.gpu_ids, b.iota))
    m_scatter_in = np.column_stack((a.iota, a.gpu_ids))

    def staged_out(ctas=32, s=s_out):
        sw[ctas].swap(b.gpu, b.stage, m_gather_out, stream=s, mode="kernel")
        runtime.memcpyAsync(b.host[b.h0 :].ctypes.data, b.stage.data.ptr, nbytes, D2H, s.ptr)

    print(f"N = {n} blocks of {block} B each way ({nbytes / 1e6:.1f} MB per direction)")
    print("-- one direction")
    rec("in  memcpy contiguous (ceiling)", lambda: memcpy_in(), [s_in], nbytes)
    rec("out memcpy contiguous (ceiling)", lambda: memcpy_out(), [s_out], nbytes)
    rec(
        "in  memcpy from the pool's host run",
        lambda: memcpy_in(host=a.host[a.h0 :].ctypes.data),
        [s_in],
        nbytes,
    )
    rec("in  kernel random", kernel_in, [s_in], nbytes)
    rec("out kernel random", kernel_out, [s_out], nbytes)
    for k in (1, 2, 4, 8):
        rec(
            f"in  dma random, {k} stream(s)",
            lambda k=k: dma_split(a.host, a.gpu, m_in_random, extra[:k]),
            extra[:k],
            nbytes,
        )
    for k in (1, 4):
        rec(
            f"out dma random, {k} stream(s)",
            lambda k=k: dma_split(b.gpu, b.host, m_out_random, extra[:k]),
            extra[:k],
            nbytes,
        )
    for c in (8, 32, 132):
        rec(
            f"gpu gather {c} CTAs (into staging)",
            lambda c=c: sw[c].swap(b.gpu, b.stage, m_gather_out, stream=s_out),
            [s_out],
            2 * nbytes,
        )
    for c in (8, 32, 132):
        rec(f"in  staged ({c} CTA scatter)", lambda c=c: staged_in(c), [s_in], nbytes)
        rec(f"out staged ({c} CTA gather)", lambda c=c: staged_out(c), [s_out], nbytes)

    print("-- both directions together")
    both = [s_in, s_out]
    total = 2 * nbytes
    rec("ceiling: memcpy in then out", lambda: (memcpy_in(), memcpy_out()), both, total)
    rec("ceiling: memcpy out then in", lambda: (memcpy_out(), memcpy_in()), both, total)
    rec(
        "ceiling: memcpyDefault both",
        lambda: (memcpy_in(kind=DEFAULT), memcpy_out(kind=DEFAULT)),
        both,
        total,
    )
    rec(
        "ceiling: pool host runs instead of flat buffers",
        lambda: (memcpy_in(host=a.host[a.h0 :].ctypes.data), memcpy_out(host=b.host[b.h0 :].ctypes.data)),
        both,
        total,
    )

    def staggered():
        memcpy_in()
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 50e-6:
            pass
        memcpy_out()

    rec("ceiling: out submitted 50 us after in", staggered, both, total)
    rec(
        "dma both, contiguous both sides (one copy each, via swap)",
        lambda: (
            sw_in.swap(a.host, a.gpu, np.column_stack((a.host_run, a.iota)), stream=s_in, mode="dma"),
            sw_out.swap(b.gpu, b.host, np.column_stack((b.iota, b.host_run)), stream=s_out, mode="dma"),
        ),
        both,
        total,
    )
    rec("kernel in + kernel out, random", lambda: (kernel_in(), kernel_out()), both, total)
    rec(
        "kernel in + kernel out, host runs",
        lambda: (kernel_in(m_in_runhost), kernel_out(m_out_runhost)),
        both,
        total,
    )
    rec(
        "dma in (4 streams) + kernel out, random",
        lambda: (dma_split(a.host, a.gpu, m_in_random, extra[:4]), kernel_out()),
        both + extra[:4],
        total,
    )
    rec("memcpy in + kernel out random", lambda: (memcpy_in(), kernel_out()), both, total)
    rec("kernel in random + memcpy out", lambda: (kernel_in(), memcpy_out()), both, total)
    rec("memcpy in + kernel out, host runs", lambda: (memcpy_in(), kernel_out(m_out_runhost)), both, total)
    for c in (8, 32, 132):
        rec(f"staged in + staged out ({c} CTAs)", lambda c=c: (staged_in(c), staged_out(c)), both, total)
        rec(
            f"staged in ({c} CTAs) + kernel out, host runs",
            lambda c=c: (staged_in(c), kernel_out(m_out_runhost)),
            both,
            total,
        )
    # Correctness of the staged pieces (last run).
    s_in.synchronize()
    s_out.synchronize()
    ok_in = bool(np.array_equal(cupy.asnumpy(a.gpu[cupy.asarray(a.gpu_ids)]), a.host[a.h0 : a.h0 + n]))
    staged_out(32)
    s_out.synchronize()
    ok_out = bool(np.array_equal(b.host[b.h0 : b.h0 + n], cupy.asnumpy(b.gpu[cupy.asarray(b.gpu_ids)])))
    print(f"staged in verified: {ok_in}; staged out verified: {ok_out}")
    results["verified"] = {"staged_in": ok_in, "staged_out": ok_out}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
