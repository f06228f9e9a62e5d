"""Which launch hands a swap's pairs to the copy kernel for the least host time?  Issue 25,
item 3 chooses a call's one launch from host and device time together, measured in one run.
One call moving N = 1, 16, 1250 random distinct 4 KiB blocks (pinned host memory, through its
device alias, <-> a CuPy array), made each of these ways:

* set+graph: pairs inline in the kernel's one parameter (a struct by value), set on an
  instantiated one-kernel graph (cuGraphExecKernelNodeSetParams), then cudaGraphLaunch;
* slot+graph: pairs written into a pinned slot, then cudaGraphLaunch of one instantiated graph,
  not updated: a memcpy node (slot -> device buffer), then the kernel reading that buffer (a
  library needs a ring of slots gated by events: add the event row to its host time);
* launch: cuLaunchKernel, pairs inline;  memcpy: one 4 KiB cudaMemcpyAsync (the reference);
  event: one event record.

Every call writes its pairs (NumPy).  Inline structs come in tiers of 16 and 1792 pairs (the
driver copies the whole struct); a slot graph copies its tier's slot and runs its tier's grid.
Host time: median inside a call, the stream synchronized between calls off the clock, the ways
taking turns in rounds, each keeping its fastest round (as cupy_swap.tools.bench.host_times:
the device's host CPU has slow spells).  Device time: median between events around a call.
Then each kernel way copies a fresh mapping onto a poisoned destination, checked bit-exactly.
Its own kernel, CuPy only (the library's kernels are being rewritten).

    python benchmarks/probes/launch_paths.py [--reps 1000] [--out launch_paths.json]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import time

import numpy as np

BLOCK = 4096  # bytes per block: one 16-byte vector per thread of a 256-thread CTA
THREADS, MAX_CTAS = 256, 128
BLOCKS = 4096  # blocks per side; a mapping picks random distinct ones
TIERS = (16, 1792)  # pairs an inline parameter holds
FORMS = ("set+graph", "slot+graph", "launch", "memcpy", "event")
KERNELS = [f"copy_inline<{p}>" for p in TIERS] + ["copy_slot"]

SOURCE = r"""
typedef unsigned long long u64;

template <int P> struct Inline {  // the kernel's one parameter: words [src, dst, n, unused, pairs]
    u64 src, dst;
    long long n, unused;
    long long pairs[2 * P];
};

__device__ __forceinline__ void copy_block(u64 src, u64 dst, long long s, long long d) {
    const uint4* from = reinterpret_cast<const uint4*>(src + (u64)s * 4096ull);
    uint4* to = reinterpret_cast<uint4*>(dst + (u64)d * 4096ull);
    to[threadIdx.x] = from[threadIdx.x];
}

template <int P> __global__ void __launch_bounds__(256) copy_inline(const __grid_constant__ Inline<P> a) {
    for (long long i = blockIdx.x; i < a.n; i += gridDim.x) copy_block(a.src, a.dst, a.pairs[2 * i], a.pairs[2 * i + 1]);
}

// slot: words [n, unused, pairs], copied into device memory by the graph's memcpy node
__global__ void __launch_bounds__(256) copy_slot(u64 src, u64 dst, const long long* __restrict__ slot) {
    const long long n = slot[0];
    for (long long i = blockIdx.x; i < n; i += gridDim.x) copy_block(src, dst, slot[2 + 2 * i], slot[3 + 2 * i]);
}
""" + "".join(f"static_assert(sizeof(Inline<{p}>) == 8 * (4 + 2 * {p}));\n" for p in TIERS)


class KernelNodeParams(ctypes.Structure):
    """``CUDA_KERNEL_NODE_PARAMS`` as the unversioned driver symbols take it."""

    _fields_ = [("func", ctypes.c_void_p)]
    _fields_ += [(f, ctypes.c_uint) for f in ("gx", "gy", "gz", "bx", "by", "bz", "shared")]
    _fields_ += [("kernelParams", ctypes.c_void_p), ("extra", ctypes.c_void_p)]


def driver_calls():
    """cuGraphGetNodes, cuGraphExecKernelNodeSetParams (c_void_p arguments only: no argtypes)."""
    lib = ctypes.CDLL("libcuda.so.1")
    get_nodes, set_params = lib.cuGraphGetNodes, lib.cuGraphExecKernelNodeSetParams
    get_nodes.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)]
    get_nodes.restype = set_params.restype = ctypes.c_int
    return get_nodes, set_params


PINNED: list = []  # host addresses from pinned(), freed at the end of main()


def pinned(nbytes: int):
    """``(uint8 array, its device alias)``: mapped, portable pinned memory."""
    from cupy.cuda import runtime

    ptr = runtime.hostAlloc(nbytes, runtime.hostAllocPortable | runtime.hostAllocMapped)
    PINNED.append(ptr)
    array = np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(ptr))
    return array, int(runtime.pointerGetAttributes(ptr).devicePointer)


def make_calls(fns, src: int, dst: int, one_copy: tuple, m, stream, get_nodes, set_params):
    """The five ways (name -> fn) of issuing the swap of ``m`` (``(n, 2)`` int64) on ``stream``,
    and what they point at (keep it alive while they run)."""
    import cupy
    from cupy.cuda import driver, runtime

    n, flat, sp = len(m), m.reshape(-1), stream.ptr
    tier = next(p for p in TIERS if p >= n)
    fn, grid = fns[f"copy_inline<{tier}>"], min(n, MAX_CTAS)
    graph_launch, launch, copy = runtime.graphLaunch, driver.launchKernel, runtime.memcpyAsync
    keep = []

    def inline_args():  # the struct and the void* array cuLaunchKernel takes
        words = np.zeros(4 + 2 * tier, np.int64)
        words.view(np.uint64)[:2] = src, dst
        argv = (ctypes.c_void_p * 1)(words.ctypes.data)
        keep.append((words, argv))
        return words, ctypes.addressof(argv)

    def captured(*steps):  # an instantiated graph of what steps() enqueue
        stream.begin_capture()
        for step in steps:
            step()
        keep.append(stream.end_capture())
        return keep[-1]

    # (a) set+graph: the driver copies the struct at cuGraphExecKernelNodeSetParams.
    words_a, argv_a = inline_args()
    graph = captured(lambda: launch(fn, grid, 1, 1, THREADS, 1, 1, 0, sp, argv_a, 0))
    node, count = ctypes.c_void_p(), ctypes.c_size_t(1)
    status = get_nodes(graph.graph, ctypes.byref(node), ctypes.byref(count))
    assert status == 0 and count.value == 1, f"cuGraphGetNodes: CUresult {status}, {count.value} nodes"
    params = KernelNodeParams(fn, grid, 1, 1, THREADS, 1, 1, 0, argv_a, None)
    exec_a = graph.graphExec
    set_args = (ctypes.c_void_p(exec_a), node, ctypes.c_void_p(ctypes.addressof(params)))
    keep.append(params)

    def set_graph():
        words_a[2], words_a[4 : 4 + 2 * n] = n, flat
        params.gx = grid
        status = set_params(*set_args)
        if status:
            raise RuntimeError(f"cuGraphExecKernelNodeSetParams: CUresult {status}")
        graph_launch(exec_a, sp)

    # (b) slot+graph: memcpy node (the tier's whole pinned slot -> device buffer), then the kernel.
    # The stream is synchronized between timed calls, so no launch still reads the slot a call rewrites.
    nbytes = 8 * (2 + 2 * tier)
    slot = pinned(nbytes)[0].view(np.int64)
    with stream:
        dev = cupy.zeros(2 + 2 * tier, np.int64)
    values = [ctypes.c_uint64(v) for v in (src, dst, dev.data.ptr)]
    argv_b = (ctypes.c_void_p * 3)(*(ctypes.addressof(v) for v in values))
    keep.append((dev, values, argv_b))
    up = (dev.data.ptr, slot.ctypes.data, nbytes, runtime.memcpyHostToDevice, sp)
    b = (fns["copy_slot"], min(tier, MAX_CTAS), 1, 1, THREADS, 1, 1, 0, sp, ctypes.addressof(argv_b), 0)
    exec_b = captured(lambda: copy(*up), lambda: launch(*b)).graphExec

    def slot_graph():
        slot[0], slot[2 : 2 + 2 * n] = n, flat
        graph_launch(exec_b, sp)

    # (c) launch: cuLaunchKernel with the same struct.
    words_c, argv_c = inline_args()

    def plain_launch():
        words_c[2], words_c[4 : 4 + 2 * n] = n, flat
        launch(fn, grid, 1, 1, THREADS, 1, 1, 0, sp, argv_c, 0)

    event = cupy.cuda.Event(disable_timing=True)
    keep.append(event)
    memcpy, record = lambda: copy(*one_copy, sp), lambda: runtime.eventRecord(event.ptr, sp)
    return dict(zip(FORMS, (set_graph, slot_graph, plain_launch, memcpy, record))), keep


def host_times(calls: dict, stream, reps: int, rounds: int) -> dict:
    """name -> seconds inside one call: the calls take turns over ``rounds``; each keeps its fastest
    round median (the stream is synchronized after each call, outside the clock)."""
    best = dict.fromkeys(calls, float("inf"))
    for _ in range(rounds):
        for name, call in calls.items():
            samples = []
            for _ in range(max(reps // rounds, 5)):
                t0 = time.perf_counter()
                call()
                samples.append(time.perf_counter() - t0)
                stream.synchronize()
            best[name] = min(best[name], statistics.median(samples))
    return best


def device_time(call, stream, reps: int) -> float:
    """Median seconds between events recorded around ``call()``."""
    import cupy

    start, end, samples = cupy.cuda.Event(), cupy.cuda.Event(), []
    for _ in range(reps):
        start.record(stream)
        call()
        end.record(stream)
        stream.synchronize()
        samples.append(cupy.cuda.get_elapsed_time(start, end) * 1e-3)
    return statistics.median(samples)


def verify(call, src, dst, m, stream, rng) -> bool:
    """A fresh mapping written into ``m`` (which the calls read), fresh random source, poisoned
    destination, ``call()`` once: is every block bit-exact?"""
    import cupy

    m[...] = np.stack([rng.choice(BLOCKS, len(m), replace=False) for _ in "sd"], axis=1)
    fresh = rng.integers(0, 256, (BLOCKS, BLOCK), dtype=np.uint8)
    if isinstance(src, np.ndarray):
        src[...] = fresh
    else:
        src.set(fresh)
    dst.fill(0xA5)
    cupy.cuda.Device().synchronize()  # set and fill ran on the default stream
    want = np.full((BLOCKS, BLOCK), 0xA5, np.uint8)
    want[m[:, 1]] = fresh[m[:, 0]]
    call()
    stream.synchronize()
    return bool(np.array_equal(dst if isinstance(dst, np.ndarray) else dst.get(), want))


def main(argv=None) -> list:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--counts", default="1,16,1250", help="pairs per call, comma-separated, each <= 1792")
    p.add_argument("--directions", default="in,out", help="in (host -> GPU), out, or in,out")
    p.add_argument("--reps", type=int, default=1000, help="host-timed calls per way; device-timed: a fifth")
    p.add_argument("--rounds", type=int, default=5, help="turns the ways take for host time")
    p.add_argument("--out", help="also write the rows as JSON to this path")
    args = p.parse_args(argv)

    import cupy
    from cupy.cuda import runtime

    mod = cupy.RawModule(code=SOURCE, options=("-std=c++17",), name_expressions=KERNELS)
    kernels = {name: mod.get_function(name) for name in KERNELS}  # kept: they own the handles
    fns = {name: k.kernel.ptr for name, k in kernels.items()}
    get_nodes, set_params = driver_calls()
    rng, stream = np.random.default_rng(0), cupy.cuda.Stream(non_blocking=True)
    host, alias = pinned(BLOCKS * BLOCK)
    host = host.reshape(BLOCKS, BLOCK)
    gpu = cupy.empty((BLOCKS, BLOCK), np.uint8)
    name = runtime.getDeviceProperties(cupy.cuda.Device().id)["name"]
    name = name.decode() if isinstance(name, bytes) else name
    print(f"{name}, driver {runtime.driverGetVersion()}, CuPy {cupy.__version__}")
    print("host us / device us per call, medians; memcpy: one 4 KiB cudaMemcpyAsync; event: one record")
    print(f"{'dir':<4}{'n':>6} " + "".join(f"{f:>16}" for f in FORMS) + "  bit-exact")
    rows = []
    try:
        for direction in args.directions.split(","):
            inward = direction == "in"
            src, dst = (host, gpu) if inward else (gpu, host)
            addresses = (alias, gpu.data.ptr) if inward else (gpu.data.ptr, alias)
            for n in map(int, args.counts.split(",")):
                m = np.stack([rng.choice(BLOCKS, n, replace=False) for _ in "sd"], axis=1).astype(np.int64)
                s, d = (a.ctypes.data if a is host else a.data.ptr for a in (src, dst))
                kind = runtime.memcpyHostToDevice if inward else runtime.memcpyDeviceToHost
                one = (d + int(m[0, 1]) * BLOCK, s + int(m[0, 0]) * BLOCK, BLOCK, kind)  # the first pair
                calls, keep = make_calls(fns, *addresses, one, m, stream, get_nodes, set_params)
                for call in calls.values():  # warm up
                    call()
                stream.synchronize()
                host_s = host_times(calls, stream, args.reps, args.rounds)
                dev_s = {f: device_time(c, stream, max(args.reps // 5, 5)) for f, c in calls.items()}
                ok = {f: verify(calls[f], src, dst, m, stream, rng) for f in FORMS[:3]}
                for f in FORMS:
                    row = {"direction": direction, "n": n, "form": f, "verified": ok.get(f)}
                    rows.append(row | {"host_us": host_s[f] * 1e6, "device_us": dev_s[f] * 1e6})
                cells = "".join(f"{host_s[f] * 1e6:>8.2f}/{dev_s[f] * 1e6:<7.2f}" for f in FORMS)
                checks = " ".join(f"{f}:{'ok' if v else 'WRONG'}" for f, v in ok.items())
                print(f"{direction:<4}{n:>6} {cells}  {checks}", flush=True)
                del calls, keep
    finally:
        cupy.cuda.Device().synchronize()
        while PINNED:
            runtime.freeHost(PINNED.pop())
    if args.out:
        with open(args.out, "w") as f:
            meta = {"device": name, "driver": runtime.driverGetVersion(), "cupy": cupy.__version__}
            json.dump(meta | {"tiers": TIERS, "rows": rows}, f, indent=1)
    if any(r["verified"] is False for r in rows):
        raise SystemExit("launch_paths: a launch way copied wrong bytes")
    return rows


if __name__ == "__main__":
    main()
