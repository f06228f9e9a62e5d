"""The reproductions of the ownership and routing defects, as figures: run
on a GPU machine, prints one line per case (what happened, and how long the
call took where that was the defect).  ``tests/test_lifetimes_gpu.py``
asserts the same behaviour; this script shows the numbers.

    python benchmarks/lifetime_repros.py [--json out.json]
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time

import numpy as np

import cupy_swap as cs
from cupy_swap.cuda import release
from cupy_swap.tools.bench import random_mapping

_SPIN = r"""
extern "C" __global__ void spin(unsigned long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now)); } while (now - start < ns);
}
"""


def spin(cp, stream, ms: float) -> None:
    kernel = cp.RawKernel(_SPIN, "spin")
    with stream:
        kernel((1,), (1,), (np.uint64(ms * 1e6),))


def graph_replay(cp, rng) -> dict:
    """Blocks a graph_swap made behind a busy legacy stream copies (of 16)."""
    sw = cs.BlockSwapper(max_blocks=64)
    host = cs.empty_pinned((64, 4096), np.uint8)
    host[...] = rng.integers(0, 256, host.shape, dtype=np.uint8)
    gpu = cp.zeros((64, 4096), cp.uint8)
    cp.cuda.Device().synchronize()
    s = cp.cuda.Stream(non_blocking=True)
    spin(cp, cp.cuda.Stream.null, 200)
    gs = sw.graph_swap(host, gpu)
    m = random_mapping(16, 64, 64, rng)
    gs.set_mapping(m, stream=s)
    spin(cp, s, 10)
    s.begin_capture()
    gs.launch(stream=s)
    s.end_capture().launch(s)
    cp.cuda.Device().synchronize()
    got = cp.asnumpy(gpu)
    copied = sum(bool(np.array_equal(got[d], host[s_])) for s_, d in m)
    return {"case": "graph replay behind a busy creation stream", "blocks_copied": copied, "of": 16}


def dropped_swapper(cp, rng) -> dict:
    """Whether an allocation right after dropping a swapper with a ring
    swap queued lands on the ring, and whether the swap's bytes survive."""
    host = cs.empty_pinned((4096, 4096), np.uint8)
    host[...] = rng.integers(0, 256, host.shape, dtype=np.uint8)
    gpu = cp.zeros((4096, 4096), cp.uint8)
    cp.cuda.Device().synchronize()
    m = random_mapping(1000, 4096, 4096, rng)
    s = cp.cuda.Stream(non_blocking=True)
    sw = cs.BlockSwapper(max_blocks=4096)
    slots = sw._launcher._slots
    ring = (slots[0].device_ptr, slots[-1].device_ptr + sw._launcher.slot_words * 8)
    spin(cp, s, 200)
    ev = sw.swap_in(host, gpu, m, stream=s)
    del sw
    gc.collect()
    junk = [cp.empty(ring[1] - ring[0], cp.uint8) for _ in range(8)]
    hit = any(a.data.ptr < ring[1] and ring[0] < a.data.ptr + a.nbytes for a in junk)
    queued = not ev.done
    for a in junk:
        a.fill(0x5A)
    ev.synchronize()
    cp.cuda.Device().synchronize()
    exact = bool(np.array_equal(cp.asnumpy(gpu)[m[:, 1]], host[m[:, 0]]))
    return {
        "case": "drop a swapper with a ring swap queued, then allocate",
        "swap_still_queued": queued,
        "new_array_on_ring": hit,
        "swap_bit_exact": exact,
    }


def dropped_pool(cp, rng) -> dict:
    """Host time of empty_pinned(1) right after dropping a pool that a
    queued swap (behind a 500 ms spin) writes."""
    sw = cs.BlockSwapper(max_blocks=64)
    gpu = cp.zeros((64, 4096), cp.uint8)
    pool = cs.empty_pinned((64, 4096), np.uint8)
    s = cp.cuda.Stream(non_blocking=True)
    spin(cp, s, 500)
    ev = sw.swap_out(gpu, pool, random_mapping(16, 64, 64, rng), stream=s)
    del pool
    t0 = time.perf_counter()
    cs.empty_pinned(1, np.uint8)
    took = time.perf_counter() - t0
    queued = not ev.done
    ev.synchronize()
    release.drain(30)
    return {
        "case": "empty_pinned(1) after dropping a pool with a swap queued",
        "call_ms": round(took * 1e3, 3),
        "swap_still_queued_after_call": queued,
    }


def mixed_routing(cp, rng, reps: int = 5) -> dict:
    """auto against kernel for one 2 MiB part beside 63 parts of 4 KiB."""
    blocks = 1300
    host = [cs.empty_pinned((blocks, 2 << 20), np.uint8)] + [
        cs.empty_pinned((blocks, 4096), np.uint8) for _ in range(63)
    ]
    gpu = [cp.empty((blocks, 2 << 20), cp.uint8)] + [cp.empty((blocks, 4096), cp.uint8) for _ in range(63)]
    sw = cs.BlockSwapper(max_blocks=2048)
    m = random_mapping(1250, blocks, blocks, rng)
    out = {"case": "1 part of 2 MiB + 63 parts of 4 KiB, 1250 random pairs, swap-in"}
    for mode in ("auto", "kernel", "dma"):
        times, path = [], None
        for _ in range(reps + 1):
            t0 = time.perf_counter()
            ev = sw.swap_in(host, gpu, m, mode=None if mode == "auto" else mode)
            ev.synchronize()
            times.append(time.perf_counter() - t0)
            path = ev.path
        out[mode] = {"ms": round(statistics.median(times[1:]) * 1e3, 2), "path": path}
    return out


def fresh_views(cp, rng, reps: int = 30) -> dict:
    """Host time per call, 64 parts, n=16: fresh views each call, the same
    list of views, a prepared op."""
    layers = 32
    host = cs.empty_pinned((256, layers, 2, 16, 8, 128), np.float16)
    gpu = [cp.empty((2, 256, 16, 8, 128), cp.float16) for _ in range(layers)]
    sw = cs.BlockSwapper(max_blocks=256)
    m = random_mapping(16, 256, 256, rng)

    def views():
        return [host[:, layer, kv] for layer in range(layers) for kv in range(2)]

    gpu_parts = [gpu[layer][kv] for layer in range(layers) for kv in range(2)]
    same = views()
    op = sw.prepare(same, gpu_parts)
    cases = {
        "fresh_views": lambda: sw.swap_in(views(), [g[kv] for g in gpu for kv in range(2)], m),
        "same_list": lambda: sw.swap_in(same, gpu_parts, m),
        "prepared": lambda: op(m),
    }
    out = {"case": "64 parts, n=16, swap-in, host us per call (synchronized between calls)"}
    for name, call in cases.items():
        call().synchronize()
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            ev = call()
            times.append(time.perf_counter() - t0)
            ev.synchronize()
        out[name] = round(statistics.median(times) * 1e6, 1)
    return out


def main() -> None:
    import cupy as cp

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json")
    args = parser.parse_args()
    rng = np.random.default_rng(7)
    results = [f(cp, rng) for f in (graph_replay, dropped_swapper, dropped_pool, mixed_routing, fresh_views)]
    for r in results:
        print(json.dumps(r))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
