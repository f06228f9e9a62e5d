"""Issue 32's figures that no test asserts, from one device run:

1. A swap of 100 host rows (a ring slot, checked in the launch) on one
   stream while another stream's slot swap waits behind a gate: host time of
   the call (goal: under 100 us; strict round robin waited for the gate).
2. What a dropped pool's release blocks while the swap that wrote it is
   still queued (the releaser waits inside cudaHostUnregister/cudaFreeHost):
   each call below runs on its own thread and is reported as returned (us)
   or still blocked when the gate opens.

    PYTHONPATH=$PWD python3 benchmarks/probes/trust_probe.py
"""

from __future__ import annotations

import statistics
import sys
import threading
import time

import numpy as np

sys.path.insert(0, ".")

import cupy as cp  # noqa: E402

import cupy_swap as cs  # noqa: E402
from cupy_swap.cuda import release  # noqa: E402
from cupy_swap.tools.bench import random_mapping  # noqa: E402
from tests.gpu_helpers import Gate  # noqa: E402


def busy_slot(rng) -> None:
    sw = cs.BlockSwapper(max_blocks=128)
    host = cs.empty_pinned((4096, 4096), np.uint8)
    gpu = cp.empty((4096, 4096), cp.uint8)
    op = sw.prepare(host, gpu)
    a, b = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    m = random_mapping(100, 4096, 4096, rng)
    for _ in range(20):
        op(m, stream=b)
    b.synchronize()
    gate = Gate(a)
    op(m, stream=a)
    samples = []
    for _ in range(200):
        t0 = time.perf_counter()
        op(m, stream=b)
        samples.append(time.perf_counter() - t0)
        b.synchronize()
    closed = gate.closed
    gate.open()
    cp.cuda.Device().synchronize()
    us = sorted(s * 1e6 for s in samples)
    print(
        f"slot swap of 100 rows while another stream's slot waits behind a gate: median {statistics.median(us):.1f} us, "
        f"p99 {us[int(0.99 * len(us))]:.1f} us, max {us[-1]:.1f} us; gate still closed: {closed}; "
        f"ring waits {sw.ring_waits}"
    )


def release_blocks(rng) -> None:
    sw = cs.BlockSwapper(max_blocks=64)
    gpu = cp.empty((64, 4096), cp.uint8)
    small_host = cs.empty_pinned((8, 4096), np.uint8)
    small_gpu = cp.empty((8, 4096), cp.uint8)
    op = sw.prepare(small_host, small_gpu)
    op([(0, 1)]).synchronize()
    for kind in ("empty_pinned", "register_host"):
        pool = (
            cs.empty_pinned((64, 4096), np.uint8)
            if kind == "empty_pinned"
            else np.zeros((64, 4096), np.uint8)
        )
        if kind == "register_host":
            cs.register_host(pool)
        cp.cuda.Device().synchronize()
        s = cp.cuda.Stream(non_blocking=True)
        gate = Gate(s)
        sw.swap_out(gpu, pool, random_mapping(16, 64, 64, rng), stream=s)
        if kind == "register_host":
            threading.Thread(target=cs.unregister_host, args=(pool,), daemon=True).start()
        del pool
        time.sleep(0.5)  # the releaser (or the unregistering thread) is inside its wait now
        other = cp.cuda.Stream(non_blocking=True)
        calls = {
            "empty_pinned(1)": lambda: cs.empty_pinned(1, np.uint8),
            "cupy.cuda.Event()": lambda: cp.cuda.Event(),
            "cupy.empty (pool)": lambda: cp.empty(1 << 20, cp.uint8),
            "register_host(4 KiB)": lambda: cs.register_host(np.zeros(4096, np.uint8)),
            "prepared swap, 1 row": lambda other=other: op([(2, 3)], stream=other),
            "prepared swap, 8 rows in the launch": lambda other=other: op(
                random_mapping(8, 8, 8, rng), stream=other, check="launch"
            ),
        }
        results = {}
        for name, call in calls.items():
            done = threading.Event()

            def run(call=call, name=name, done=done, results=results):
                t0 = time.perf_counter()
                try:
                    call()
                    results[name] = (time.perf_counter() - t0) * 1e6
                except Exception as e:
                    results[name] = f"raised {type(e).__name__}: {e}"
                done.set()

            threading.Thread(target=run, daemon=True).start()
            done.wait(1.0)
            if not done.is_set():
                results.setdefault(name, None)
        gate.open()
        release.drain(30)
        cp.cuda.Device().synchronize()
        for name, us in results.items():
            text = "blocked (> 1 s)" if us is None else us if isinstance(us, str) else f"{us:.0f} us"
            print(f"{kind} pool dropped, its swap gated: {name}: {text}")


if __name__ == "__main__":
    rng = np.random.default_rng(0)
    busy_slot(rng)
    release_blocks(rng)
