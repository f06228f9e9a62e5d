"""What the ring look (``Launcher.acquire``) of a prepared call of more than
16 rows spends on the device's host (issue 34, item 4; NOTES 58): each
driver call it makes timed alone, then a profile of whole calls at 16 and
64 rows (64 parts of 32 KiB, host -> GPU, the stream synchronized outside).

    python benchmarks/probes/ring_look_cost.py
"""

import cProfile
import io
import pstats
import statistics
import time

import cupy
import numpy as np
from cupy.cuda import runtime

import cupy_swap as cs
from cupy_swap.cuda import capture

KIB = 1024
PARTS, BLOCK, BLOCKS = 64, 32 * KIB, 80
REPS = 2000


def per_call(fn, reps: int = REPS) -> float:
    samples = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(reps):
            fn()
        samples.append((time.perf_counter() - t) / reps * 1e6)
    return statistics.median(samples)


def main() -> None:
    gpu = [cupy.empty((BLOCKS, BLOCK), cupy.uint8) for _ in range(PARTS)]
    host = [cs.empty_pinned((BLOCKS, BLOCK), np.uint8) for _ in range(PARTS)]
    sw = cs.BlockSwapper(max_blocks=BLOCKS)
    op = sw.prepare(host, gpu)
    stream = cupy.cuda.Stream(non_blocking=True)
    rng = np.random.default_rng(0)
    maps = {n: np.stack([rng.permutation(BLOCKS)[:n], rng.permutation(BLOCKS)[:n]], 1) for n in (16, 64)}
    ev = op(maps[64], stream=stream)
    stream.synchronize()
    lau = sw._launcher
    plain = cupy.cuda.Event(disable_timing=True)
    plain.record(stream)
    stream.synchronize()

    def exchange_pair():
        saved = capture.exchange(capture.RELAXED)
        capture.exchange(saved)

    def relaxed_block():
        with capture.relaxed():
            pass

    def look():
        held = []
        lau.acquire(held)
        lau.release(held, ev, stream.ptr)

    rows = [
        ("cuThreadExchangeStreamCaptureMode x2", exchange_pair),
        ("capture.relaxed() block", relaxed_block),
        ("cudaEventQuery, completed event", lambda: runtime.eventQuery(plain.ptr)),
        ("cupy Event.done, completed", lambda: plain.done),
        ("SwapEvent.done, completed", lambda: ev.done),
        ("acquire + release (ring look)", look),
        ("cudaStreamIsCapturing", lambda: runtime.streamIsCapturing(stream.ptr)),
    ]
    print(f"one call alone, µs (median of 5 x {REPS}):")
    for label, fn in rows:
        print(f"  {label:40s} {per_call(fn):7.2f}", flush=True)
    for n in (16, 64):
        for _ in range(20):
            op(maps[n], stream=stream)
            stream.synchronize()
        prof = cProfile.Profile()
        total = 0.0
        for _ in range(300):
            t = time.perf_counter()
            prof.enable()
            op(maps[n], stream=stream)
            prof.disable()
            total += time.perf_counter() - t
            stream.synchronize()
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(18)
        print(f"\nprofile of 300 calls at n={n} ({total / 300 * 1e6:.1f} µs a call under the profiler):")
        print("\n".join(line for line in out.getvalue().splitlines() if line.strip())[:6000], flush=True)


if __name__ == "__main__":
    main()
