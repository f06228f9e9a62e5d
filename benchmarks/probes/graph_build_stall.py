"""Which step of building a slot graph waits for a busy GPU?  (NOTES 61 and
68: one build of 48 took 298 ms, another held a neighbour's calls 291 ms,
each returning when another stream's spin ended.)

While stream A spins SPIN_MS, builds N graphs of a prepared op's slot
parameter one way at a time, timing each step, and prints per way the
longest step, how many steps took over 10 ms and at which build:

    node     cuGraphCreate + cuGraphAddKernelNode (no instantiate)
    inst     the same, then cudaGraphInstantiate (what graph_builder does)
    capture  a relaxed stream capture of the cuLaunchKernel, then instantiate
    upload   inst, then cudaGraphUpload on a stream of its own
    empty    instantiate of an empty graph (is any instantiate enough?)

Each way gets a fresh spin; ways run in a fresh order per round (ROUNDS).
Run on the GPU machine from the checkout (about 1 s per way and round):

    python benchmarks/probes/graph_build_stall.py
    N=512 ROUNDS=1 WAYS=inst,capture PREWARM=0 python benchmarks/probes/graph_build_stall.py
"""

from __future__ import annotations

import ctypes
import os
import time

import cupy as cp
import numpy as np
from cupy.cuda import runtime
from graph_build_thread import SPIN, SPIN_MS  # this folder: run as a script

import cupy_swap as cs
from cupy_swap.cuda import graph_builder

N = int(os.environ.get("N", "64"))
ROUNDS = int(os.environ.get("ROUNDS", "2"))
WAYS = os.environ.get("WAYS", "node,inst,capture,upload,empty").split(",")
# Instantiate this many graphs while the GPU is idle, then destroy them, before
# the rounds: does an early high-water mark of live executables spare the
# busy builds their wait (NOTES 71)?
PREWARM = int(os.environ.get("PREWARM", "0"))
SLOW_S = float(os.environ.get("SLOW_MS", "10")) / 1e3  # a step this long is listed


def _node_graph(kernel, i):
    args = kernel._for_slot(i)
    _, grid, threads, smem = kernel._shape
    current, create, add = graph_builder._graph_calls()
    params = graph_builder.KernelNodeParams(args.fn, grid, 1, 1, threads, 1, 1, smem, args.ptr, None)
    graph, node = ctypes.c_void_p(), ctypes.c_void_p()
    assert create(ctypes.byref(graph), 0) == 0
    assert add(ctypes.byref(node), graph, None, 0, ctypes.byref(params)) == 0
    return graph.value


def build(way, kernel, i, stream, lau):
    """``(graph, exec or None)`` built ``way``; every step timed into the
    returned dict."""
    steps = {}
    t = time.perf_counter()
    if way == "empty":
        graph = ctypes.c_void_p()
        graph_builder._graph_calls()[1](ctypes.byref(graph), 0)
        graph = graph.value
    elif way == "capture":
        args = kernel._for_slot(i)
        _, grid, threads, smem = kernel._shape
        runtime.streamBeginCapture(stream.ptr, runtime.streamCaptureModeRelaxed)
        lau._launch(args.fn, grid, 1, 1, threads, 1, 1, smem, stream.ptr, args.ptr, 0)
        graph = runtime.streamEndCapture(stream.ptr)
    else:
        graph = _node_graph(kernel, i)
    steps["make"] = time.perf_counter() - t
    exec_ = None
    if way != "node":
        t = time.perf_counter()
        exec_ = runtime.graphInstantiate(graph)
        steps["instantiate"] = time.perf_counter() - t
    if way == "upload":
        t = time.perf_counter()
        runtime.graphUpload(exec_, stream.ptr)
        steps["upload"] = time.perf_counter() - t
    return graph, exec_, steps


def main() -> None:
    sw = cs.BlockSwapper(max_blocks=64)
    host = cs.empty_pinned((64, 32768), np.uint8)
    gpu = cp.empty((64, 32768), cp.uint8)
    op = sw.prepare(host, gpu)
    m = np.stack([np.arange(16), np.arange(16)], 1)
    op(m).synchronize()
    kernel, lau = op._decided.kernel, sw._launcher
    a, b = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    ways = WAYS
    rng = np.random.default_rng(0)
    if PREWARM:
        t0 = time.perf_counter()
        made = [build("inst", kernel, i % lau.slots.size, b, lau)[:2] for i in range(PREWARM)]
        for graph, exec_ in made:
            runtime.graphExecDestroy(exec_)
            runtime.graphDestroy(graph)
        print(
            f"prewarm: {PREWARM} executables made and destroyed while idle in {(time.perf_counter() - t0) * 1e3:.1f} ms"
        )
    for r in range(ROUNDS):
        for way in rng.permutation(ways):
            SPIN((1,), (1,), (np.uint64(SPIN_MS * 1e6),), stream=a)
            spun = cp.cuda.Event()
            spun.record(a)
            made, worst, slow = [], {}, []
            t0 = time.perf_counter()
            for i in range(N):
                graph, exec_, steps = build(way, kernel, i % lau.slots.size, b, lau)
                made.append((graph, exec_))
                for step, s in steps.items():
                    worst[step] = max(worst.get(step, 0.0), s)
                    if s > SLOW_S:
                        slow.append(f"{step}@{i}:{s * 1e3:.0f}ms")
            built = time.perf_counter() - t0
            still = not spun.done
            a.synchronize()
            b.synchronize()
            for graph, exec_ in made:
                if exec_ is not None:
                    runtime.graphExecDestroy(exec_)
                runtime.graphDestroy(graph)
            text = ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in worst.items())
            print(
                f"round {r} {way:8s}: {N} builds in {built * 1e3:7.1f} ms (spin still running after: {still}); "
                f"longest step: {text}; over {SLOW_S * 1e3:g} ms: {' '.join(slow) or 'none'}",
                flush=True,
            )


if __name__ == "__main__":
    main()
