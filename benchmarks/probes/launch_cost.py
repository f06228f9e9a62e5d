"""Host cost of one kernel launch, by how it is made (issue 50's host-time
goal: the prepared call's launch is most of the floor's budget):

* ``cuLaunchKernel`` through CuPy's binding (``cupy.cuda.driver.launchKernel``),
  parameter struct of 64, 864 (the slot kernel's 16-part tier) and 3,168 bytes;
* the same through ctypes straight into ``libcuda``;
* ``cuGraphLaunch`` of a one-kernel graph (the floor probe's slot launch).

Median µs per launch over batches of 200 launches on a non-blocking stream
(the queue never fills: a synchronize after each batch).

    python benchmarks/probes/launch_cost.py
"""

import ctypes
import functools
import time

import numpy as np

SOURCE = r"""
template <int W> struct Param { unsigned long long w[W]; };
extern "C" __global__ void k8(const __grid_constant__ Param<8> p) { if (p.w[0] == 1 && threadIdx.x == 9999) *(int*)0 = 0; }
extern "C" __global__ void k108(const __grid_constant__ Param<108> p) { if (p.w[0] == 1 && threadIdx.x == 9999) *(int*)0 = 0; }
extern "C" __global__ void k396(const __grid_constant__ Param<396> p) { if (p.w[0] == 1 && threadIdx.x == 9999) *(int*)0 = 0; }
"""
BATCH, ROUNDS = 200, 15


def per_launch(fn, sync) -> float:
    times = []
    for _ in range(ROUNDS):
        sync()
        t = time.perf_counter()
        for _ in range(BATCH):
            fn()
        times.append((time.perf_counter() - t) / BATCH * 1e6)
    sync()
    return float(np.median(times))


def main() -> None:
    import cupy
    from cupy.cuda import driver, runtime

    mod = cupy.RawModule(code=SOURCE, options=("-std=c++17",))
    stream = cupy.cuda.Stream(non_blocking=True)
    sync = stream.synchronize
    libcuda = ctypes.CDLL("libcuda.so.1")
    launch_c = libcuda.cuLaunchKernel
    launch_c.argtypes = [
        ctypes.c_void_p,
        *([ctypes.c_uint] * 6),
        ctypes.c_uint,
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_void_p,
    ]
    for name, words in (("k8", 8), ("k108", 108), ("k396", 396)):
        fn = mod.get_function(name).kernel.ptr
        param = (ctypes.c_uint64 * words)()
        holder = (ctypes.c_void_p * 1)(ctypes.addressof(param))
        ptr = ctypes.addressof(holder)
        s = stream.ptr
        cupy_us = per_launch(
            functools.partial(driver.launchKernel, fn, 8, 1, 1, 1024, 1, 1, 0, s, ptr, 0), sync
        )
        c_us = per_launch(functools.partial(launch_c, fn, 8, 1, 1, 1024, 1, 1, 0, s, ptr, None), sync)
        # One-kernel graph, captured.
        g_stream = cupy.cuda.Stream(non_blocking=True)
        g_stream.begin_capture()
        driver.launchKernel(fn, 8, 1, 1, 1024, 1, 1, 0, g_stream.ptr, ptr, 0)
        graph = g_stream.end_capture()
        graph.upload(stream)
        graph_us = per_launch(functools.partial(graph.launch, stream), sync)
        gexec = graph.graphExec
        raw_us = float("nan")
        if gexec is not None:
            gl = libcuda.cuGraphLaunch
            gl.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
            raw_us = per_launch(functools.partial(gl, gexec, s), sync)
        print(
            f"{8 * words:5} B param: CuPy launchKernel {cupy_us:5.2f} us, ctypes cuLaunchKernel {c_us:5.2f},"
            f" cupy Graph.launch {graph_us:5.2f}, ctypes cuGraphLaunch {raw_us:5.2f}",
            flush=True,
        )
    ev = cupy.cuda.Event(disable_timing=True)
    print(
        f"eventRecord (CuPy runtime) {per_launch(lambda: runtime.eventRecord(ev.ptr, stream.ptr), sync):5.2f} us"
    )


if __name__ == "__main__":
    main()
