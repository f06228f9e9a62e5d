"""The host-cost goal table (issues 10 and 17: "prepare once, swap lean",
"one launch path") from one device run.

    PYTHONPATH=$PWD python3 benchmarks/lean_goals.py --json lean_goals.json

Every figure is a ratio to something the same run measures:

* host time per call (submit only, stream drained outside the clock) over
  a bare ``cudaMemcpyAsync`` call timed in turns with it (each the fastest
  of five round medians, ``host_times``), so the CPU's slow spells move
  both alike: a prepared op, ``swap()`` with the same
  arrays, ``swap()`` with fresh views of them built per call (as a server
  that slices its cache per step does), and the copy-engine path of 16 x 2
  MiB against the same 16 copies issued as one prebuilt batch call;
* blocking GB/s of ``swap()`` and of a prepared op against the best peer of
  ``bench --peers`` in each of its 24 rows;
* device time of the kernel path at 1250 x 32 KiB with the default budget
  of 8 CTAs, against one contiguous memcpy (the "SM wall");
* one duplex pair (1250 x 32 KiB each way on two streams), blocking.

A diagnostic sweep follows: device-time ratio of the kernel against the
CTA budget for the row shapes the peers table loses, so the table says
whether a lost row is host time or device time.  Takes about three minutes
on an H200.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys

import numpy as np

from cupy_swap.tools.bench import (
    CaseBuffers,
    SwapCase,
    host_time,
    host_times,
    run_bidir,
    settle,
    swapper_settings,
)
from cupy_swap.tools.peers import CONTENDERS, PEER_CASES, run_peers_case

KIB = 1 << 10
# (label, parts, block bytes, n, mode, mapping form, goal as a multiple of memcpy)
HOST_ROWS = [
    ("n=1, one part", 1, 32 * KIB, 1, "auto", "array", 1.5),
    ("n=16, one part, int64 array", 1, 32 * KIB, 16, "auto", "array", 2.0),
    ("n=16, one part, torch int64 CPU tensor", 1, 32 * KIB, 16, "auto", "torch", 2.0),
    ("n=1250, one part, int64 array", 1, 32 * KIB, 1250, "auto", "array", 2.0),
    ("n=1250, one part, torch int64 CPU tensor", 1, 32 * KIB, 1250, "auto", "torch", 2.0),
    ("64 parts, n=16", 64, 4 * KIB, 16, "auto", "array", 2.5),
    ("64 parts, n=1250", 64, 4 * KIB, 1250, "auto", "array", 2.5),
    ("copy engines, 16 x 2 MiB", 1, 2048 * KIB, 16, "dma", "array", None),
]
OURS = ("cupy_swap", "cupy_swap_prepared")
# Row shapes of the peers table to sweep the CTA budget over (device time).
CTA_SWEEP = [("in", 32 * KIB, 1250), ("out", 32 * KIB, 1250), ("in", 4 * KIB, 1250), ("in", 256 * KIB, 16)]
CTA_BUDGETS = (8, 16, 132)


def bare_memcpy_call(stream):
    """One 32 KiB ``cudaMemcpyAsync`` call, the goal's unit (its buffers
    live as long as the returned function)."""
    import cupy
    from cupy.cuda import runtime

    from cupy_swap import empty_pinned

    host = empty_pinned((32 * KIB,), np.uint8)
    gpu = cupy.empty((32 * KIB,), dtype=cupy.uint8)
    args = (gpu.data.ptr, host.ctypes.data, 32 * KIB, runtime.memcpyHostToDevice, stream.ptr)

    def call():
        runtime.memcpyAsync(*args)

    call.buffers = (host, gpu)  # alive while the call is
    return call


def floors(reps: int) -> dict:
    """Host time of the calls any kernel swap is made of, in this run: a
    bare launch of a prebuilt one-kernel graph, and that plus recording an
    event (the least a call that returns an event can cost)."""
    import cupy
    from cupy.cuda import runtime

    stream = cupy.cuda.Stream(non_blocking=True)
    kernel = cupy.RawKernel('extern "C" __global__ void nop() {}', "nop")
    event = cupy.cuda.Event(disable_timing=True)
    kernel((1,), (32,), ())
    stream.begin_capture()
    kernel((1,), (32,), (), stream=stream)
    graph = stream.end_capture()

    def launch_and_record():
        graph.launch(stream)
        runtime.eventRecord(event.ptr, stream.ptr)

    calls = {
        "memcpy_us": bare_memcpy_call(stream),
        "graph_launch_us": lambda: graph.launch(stream),
        "graph_and_event_us": launch_and_record,
    }
    for call in calls.values():
        host_time(call, stream, 20)
    out = {name: t * 1e6 for name, t in host_times(calls, stream, reps).items()}
    print(
        f"  floors: graph launch {out['graph_launch_us']:.2f} us, graph launch + event record "
        f"{out['graph_and_event_us']:.2f} us, memcpy {out['memcpy_us']:.2f} us",
        flush=True,
    )
    return out


def host_rows(reps: int) -> list[dict]:
    """Host time of each goal row, prepared op and ``swap()``, each next to
    a bare memcpy call timed just before it."""
    import cupy

    try:
        import torch
    except ImportError:
        torch = None
    rng = np.random.default_rng(0)
    stream = cupy.cuda.Stream(non_blocking=True)
    memcpy = bare_memcpy_call(stream)
    rows = []
    for label, parts, block, n, mode, form, goal in HOST_ROWS:
        if form == "torch" and torch is None:
            continue
        row = {"label": label, "parts": parts, "block_bytes": block, "n": n, "mode": mode, "form": form}
        row["goal_ratio"] = goal
        bufs = CaseBuffers(SwapCase("in", block, n, parts), rng)
        mapping = bufs.mapping if form == "array" else torch.from_numpy(bufs.mapping)
        k = reps if n * parts <= 1250 else max(40, reps // 5)
        row.update(time_one_row(bufs, mapping, mode, stream, k, memcpy))
        for name in ("swap", "prepared", "fresh_views"):
            row[name + "_ratio"] = row[name + "_us"] / row["memcpy_us"]
        row["verified"] = bufs.verify()
        rows.append(row)
        print(
            f"  {label:<42} swap {row['swap_us']:7.1f} us ({row['swap_ratio']:5.2f}x)  prepared "
            f"{row['prepared_us']:7.1f} us ({row['prepared_ratio']:5.2f}x)  memcpy {row['memcpy_us']:.2f} us"
            f"  fresh views {row['fresh_views_us']:7.1f} us  lookup {row['lookup_us']:.1f} us"
            + (f"  GPU mapping {row['gpu_mapping_us']:.1f} us" if "gpu_mapping_us" in row else "")
            + (f"  prebuilt batch {row['batch_us']:.1f} us" if "batch_us" in row else f"  goal <= {goal}x")
            + f"  {row['path']}",
            flush=True,
        )
    return rows


def time_one_row(bufs: CaseBuffers, mapping, mode: str, stream, reps: int, memcpy) -> dict:
    """Host time of ``swap()``, of a prepared op, of the cache lookup
    ``swap()`` adds (finding the op of ``(src, dst)``, which re-reads each
    array's shape to catch in-place changes) and of ``memcpy()``, all in
    the same rounds (:func:`~cupy_swap.tools.bench.host_times`); ratios to
    ``memcpy_us`` are added by the caller."""
    from cupy_swap import BlockSwapper

    sw = BlockSwapper(max_blocks=len(bufs.mapping))
    src, dst = bufs.src, bufs.dst
    op = sw.prepare(src, dst)
    pool, parts = bufs.host_pool, range(bufs.case.parts)

    def fresh_views():  # host parts sliced from the pool per call, as a server does per step
        views = [pool[:, p] for p in parts]
        gpu = [g[:] for g in bufs.gpu_parts]
        if bufs.case.direction == "in":
            return sw.swap(views, gpu, mapping, stream=stream, mode=mode)
        return sw.swap(gpu, views, mapping, stream=stream, mode=mode)

    calls = {
        "swap": lambda: sw.swap(src, dst, mapping, stream=stream, mode=mode),
        "prepared": lambda: op(mapping, stream=stream, mode=mode),
        "fresh_views": fresh_views,
        "lookup": lambda: sw._op(src, dst),
    }
    if mode != "dma" and mapping is bufs.mapping:  # the same rows, already on the GPU
        import cupy

        on_gpu = cupy.asarray(bufs.mapping)
        calls["gpu_mapping"] = lambda: op(on_gpu, stream=stream)
    if mode == "dma":  # the same copies as one prebuilt cuMemcpyBatchAsync call
        from cupy_swap.core.copies import copy_list
        from cupy_swap.cuda.copy_engine import DmaCopier

        copies, copier = copy_list(op._decided.layout, bufs.mapping), DmaCopier()
        calls["batch"] = lambda: copier.issue(*copies, stream.ptr, 1)
    calls["memcpy"] = memcpy
    path = None
    for name, call in list(calls.items()):
        try:
            host_time(call, stream, reps=5)  # compile, allocate, cache the layout
        except TypeError:  # a library without mappings on the GPU (a baseline run)
            del calls[name]
        if name == "prepared":
            path = sw.last_path  # the path of the prepared op's swaps
    out = {name + "_us": t * 1e6 for name, t in host_times(calls, stream, reps).items()}
    out["path"] = path
    stream.synchronize()
    return out


def peer_rows(reps: int) -> list[dict]:
    rows = []
    for case in PEER_CASES:
        row = run_peers_case(case, reps=reps)
        best_peer = max(row[c] for c in CONTENDERS if c not in OURS)
        row["best_peer_gbps"] = best_peer
        for name in OURS:
            row[name + "_vs_best_peer"] = row[name] / best_peer
        rows.append(row)
        print(
            f"  {case.direction:>3} {case.block_bytes // KIB:5d} KiB x {case.num_blocks:<5d} best peer "
            f"{best_peer:6.2f}  swap() {row['cupy_swap']:6.2f} ({row['cupy_swap_vs_best_peer']:.2f})  prepared "
            f"{row['cupy_swap_prepared']:6.2f} ({row['cupy_swap_prepared_vs_best_peer']:.2f})  lead {row['lead']}",
            flush=True,
        )
    return rows


SPIN_SOURCE = r"""
extern "C" __global__ void spin(long long ns) {
    long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
}
"""


def queued_device_s(fn, stream, reps: int) -> float:
    """Median device time of the work ``fn()`` enqueues, with the host's
    submission hidden: each call is queued behind a 300 us spin kernel, so
    the start event runs only once everything after it is already queued
    (time_blocking's events, recorded before the host work, count it)."""
    import cupy

    spin = cupy.RawKernel(SPIN_SOURCE, "spin")
    settle()
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    samples = []
    for i in range(reps + 3):
        spin((1,), (1,), (np.int64(300_000),), stream=stream)
        start.record(stream)
        fn()
        end.record(stream)
        stream.synchronize()
        if i >= 3:
            samples.append(cupy.cuda.get_elapsed_time(start, end) * 1e-3)
    return statistics.median(samples)


def sm_wall(reps: int) -> list[dict]:
    """Kernel device time against one contiguous memcpy of the same bytes,
    per CTA budget (host submission hidden, see :func:`queued_device_s`)."""
    import cupy
    from cupy.cuda import runtime

    from cupy_swap import BlockSwapper

    rng = np.random.default_rng(1)
    stream = cupy.cuda.Stream(non_blocking=True)
    rows = []
    for direction, block, n in CTA_SWEEP:
        bufs = CaseBuffers(SwapCase(direction, block, n), rng)
        h, g = bufs.flat_host.ctypes.data, bufs.flat_gpu.data.ptr
        total = bufs.case.total_bytes
        copy = (g, h, total, 1) if direction == "in" else (h, g, total, 2)
        memcpy_s = queued_device_s(functools.partial(runtime.memcpyAsync, *copy, stream.ptr), stream, reps)
        for budget in CTA_BUDGETS:
            sw = BlockSwapper(max_blocks=n, max_ctas=budget, mode="kernel")
            swap_s = queued_device_s(
                functools.partial(sw.swap, bufs.src, bufs.dst, bufs.mapping, stream=stream), stream, reps
            )
            row = {"direction": direction, "block_bytes": block, "num_blocks": n, "max_ctas": budget}
            row.update(device_s=swap_s, memcpy_device_s=memcpy_s, device_ratio=memcpy_s / swap_s)
            row["verified"] = bufs.verify()
            rows.append(row)
            print(
                f"  {direction:>3} {block // KIB:4d} KiB x {n:<5d} max_ctas {budget:3d}: kernel "
                f"{swap_s * 1e6:7.1f} us, memcpy {memcpy_s * 1e6:7.1f} us, ratio {row['device_ratio']:.3f}",
                flush=True,
            )
    return rows


def goal_table(result: dict) -> list[str]:
    """The issue's goal table as Markdown lines."""
    out = ["| measure | goal | measured | met |", "|---|---|---|---|"]
    f = result["floors"]
    out.append(
        f"| floor: prebuilt graph launch; + event record | (for reference) | {f['graph_launch_us']:.2f} us "
        f"({f['graph_launch_us'] / f['memcpy_us']:.2f}x memcpy); {f['graph_and_event_us']:.2f} us "
        f"({f['graph_and_event_us'] / f['memcpy_us']:.2f}x) | |"
    )
    for r in result["host"]:
        if r["goal_ratio"] is None:  # the copy-engine row: against the prebuilt batch call
            ratio = r["prepared_us"] / r["batch_us"]
            out.append(
                f"| host time, {r['label']} | <= 1.5x the prebuilt batch call | prepared {ratio:.2f}x "
                f"({r['prepared_us']:.1f} us; batch {r['batch_us']:.1f} us) | {'yes' if ratio <= 1.5 else 'no'} |"
            )
            continue
        out.append(
            f"| host time, {r['label']} | <= {r['goal_ratio']}x memcpy | prepared {r['prepared_ratio']:.2f}x "
            f"({r['prepared_us']:.1f} us); swap() {r['swap_ratio']:.2f}x ({r['swap_us']:.1f} us); "
            f"fresh views {r['fresh_views_ratio']:.2f}x ({r['fresh_views_us']:.1f} us); memcpy "
            f"{r['memcpy_us']:.2f} us | {'yes' if r['prepared_ratio'] <= r['goal_ratio'] else 'no'} |"
        )
        if "gpu_mapping_us" in r:
            ok = r["gpu_mapping_us"] <= r["prepared_us"]
            out.append(
                f"| mapping already on the GPU, {r['label']} | accepted, no host sync, host time <= the host "
                f"mapping's | {r['gpu_mapping_us']:.1f} us against {r['prepared_us']:.1f} us | {'yes' if ok else 'no'} |"
            )
    peers = result["peers"]
    led = {name: sum(r[name] >= r["best_peer_gbps"] for r in peers) for name in OURS}
    med = {name: statistics.median(r[name + "_vs_best_peer"] for r in peers) for name in OURS}
    low = {name: min(r[name + "_vs_best_peer"] for r in peers) for name in OURS}
    out.append(
        f"| blocking GB/s, the {len(peers)} peer rows | at or above the best contender in >= 20 rows, "
        f">= 0.95 of it in all | prepared leads {led['cupy_swap_prepared']} rows (median "
        f"{med['cupy_swap_prepared']:.2f}, lowest {low['cupy_swap_prepared']:.2f}), swap() {led['cupy_swap']} "
        f"(median {med['cupy_swap']:.2f}, lowest {low['cupy_swap']:.2f}) | "
        f"{'yes' if led['cupy_swap_prepared'] >= 20 and low['cupy_swap_prepared'] >= 0.95 else 'no'} |"
    )
    for d, goal in (("in", 0.92), ("out", 0.95)):
        r = next(
            x
            for x in result["sm_wall"]
            if x["direction"] == d and x["block_bytes"] == 32 * KIB and x["max_ctas"] == 8
        )
        out.append(
            f"| kernel, 1250 x 32 KiB {d}, device time, 8 CTAs | >= {goal} of memcpy | {r['device_ratio']:.3f} | "
            f"{'yes' if r['device_ratio'] >= goal else 'no'} |"
        )
    b = result["duplex"]
    out.append(
        f"| one duplex pair, 1250 x 32 KiB each way, blocking | >= 85 GB/s | {b['gbps']:.1f} GB/s "
        f"(memcpy pair {b['ceiling_gbps']:.1f}; sustained {b['sustained_gbps']:.1f}) | "
        f"{'yes' if b['gbps'] >= 85 else 'no'} |"
    )
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", metavar="FILE")
    p.add_argument("--reps", type=int, default=200, help="calls per host-time figure")
    p.add_argument("--peer-reps", type=int, default=20)
    p.add_argument("--host-only", action="store_true", help="only the host-time rows")
    args = p.parse_args(argv)
    # The device gets a copy of the tree whose git metadata may be stale: the
    # caller passes the commit it copied.
    commit = (
        os.environ.get("CUPY_SWAP_COMMIT")
        or subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
    )
    print(f"commit {commit or 'unknown'}\n{swapper_settings()}", flush=True)
    result = {"commit": commit, "settings": swapper_settings()}
    print("host time per call (swap-in):", flush=True)
    result["floors"] = floors(args.reps)
    result["host"] = host_rows(args.reps)
    if args.host_only:
        return 0 if all(r["verified"] for r in result["host"]) else 1
    print("peers, blocking GB/s:", flush=True)
    result["peers"] = peer_rows(args.peer_reps)
    print("kernel device time against the CTA budget:", flush=True)
    result["sm_wall"] = sm_wall(args.peer_reps)
    result["duplex"] = run_bidir(32 * KIB, 1250, reps=args.peer_reps)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1, default=float)
    print("\n".join(["", *goal_table(result)]), flush=True)
    ok = all(r["verified"] for r in result["host"] + result["sm_wall"]) and result["duplex"]["verified"]
    ok = ok and all(r[name + "_ok"] for r in result["peers"] for name in CONTENDERS)
    print("every copy bit-exact" if ok else "MISMATCH: some copy was not bit-exact", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
