"""Why a prepared call of more than 16 rows cost 55-286 µs of host time in
the engines run (issue 34, item 4) when the library's own Python costs
6-7 µs with CUDA stubbed (NOTES 56): each step of the call timed on the
device's host, 64 parts of 32 KiB, host -> GPU, as ``bench --engines`` calls
it (submit timed, then the stream synchronized outside the clock).

Rows: the whole call (median, p90, max of REPS) after the synchronize, the
same call after a 300 µs busy wait on the CPU (a host that idled while
waiting pays to wake up), the same with ``check="host"`` (no ticket, no
ring slot), and the time of each step (wrapped: each wrapper adds about
0.2 µs), plus one ``cudaEventQuery`` after each kind of wait.

    python benchmarks/probes/many_rows_host.py
"""

import statistics
import time

import cupy
import numpy as np
from cupy.cuda import runtime

import cupy_swap as cs

KIB = 1024
PARTS, BLOCK = 64, 32 * KIB
COUNTS = (16, 17, 64, 256, 1250)
REPS = 60
STEPS = {  # (object attribute path, label)
    "status.take": ("_status", "take"),
    "launcher.acquire": ("_launcher", "acquire"),
    "launcher.launch_inline": ("_launcher", "launch_inline"),
    "launcher.release": ("_launcher", "release"),
    "record": (None, "_record"),
    "events.take": ("_events", "take"),
}


def spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def stats(xs) -> str:
    xs = sorted(xs)
    return f"median {statistics.median(xs):7.1f}  p90 {xs[int(0.9 * len(xs))]:7.1f}  max {xs[-1]:7.1f}"


def wrap(times: dict, label: str, owner, name: str) -> None:
    fn = getattr(owner, name)

    def timed(*a, **k):
        t = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            times.setdefault(label, []).append((time.perf_counter() - t) * 1e6)

    setattr(owner, name, timed)


def main() -> None:
    blocks = max(COUNTS) + 8
    gpu = [cupy.empty((blocks, BLOCK), cupy.uint8) for _ in range(PARTS)]
    host = [cs.empty_pinned((blocks, BLOCK), np.uint8) for _ in range(PARTS)]
    sw = cs.BlockSwapper(max_blocks=blocks)
    op = sw.prepare(host, gpu)
    stream = cupy.cuda.Stream(non_blocking=True)
    rng = np.random.default_rng(0)
    done = cupy.cuda.Event()
    done.record(stream)
    stream.synchronize()
    print(f"{PARTS} x {BLOCK // KIB} KiB, host -> GPU, prepared, host µs per call ({REPS} calls):")
    for n in COUNTS:
        maps = [
            np.stack([rng.permutation(blocks)[:n], rng.permutation(blocks)[:n]], 1).astype(np.int64)
            for _ in range(8)
        ]
        for label, check, warm in (
            ("after sync", None, 0),
            ("after sync+spin", None, 300e-6),
            ("check=host", "host", 0),
        ):
            xs, q = [], []
            for i in range(REPS + 3):
                spin(warm)
                t = time.perf_counter()
                op(maps[i % 8], stream=stream, check=check)
                xs.append((time.perf_counter() - t) * 1e6)
                stream.synchronize()
                t = time.perf_counter()
                runtime.eventQuery(done.ptr)
                q.append((time.perf_counter() - t) * 1e6)
            print(
                f"  n={n:5d} {label:16s} call {stats(xs[3:])} | eventQuery after {statistics.median(q[3:]):.2f}"
            )
        times: dict = {}
        saved = {}
        for label, (attr, name) in STEPS.items():
            owner = sw if attr is None else getattr(sw, attr)
            saved[label] = (owner, name, getattr(owner, name))
            wrap(times, label, owner, name)
        xs = []
        for i in range(REPS + 3):
            t = time.perf_counter()
            op(maps[i % 8], stream=stream)
            xs.append((time.perf_counter() - t) * 1e6)
            stream.synchronize()
        for owner, name, fn in saved.values():
            setattr(owner, name, fn)
        steps = "  ".join(f"{k} {statistics.median(v[3:]):.1f}" for k, v in times.items() if len(v) > 3)
        print(f"  n={n:5d} wrapped call median {statistics.median(xs[3:]):.1f}; steps: {steps}")
        print(f"           board waits {sw._status.waits}, path {sw.last_path}")


if __name__ == "__main__":
    main()
