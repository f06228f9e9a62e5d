"""Host time of the primitives a swap call is made of (median of 400 calls,
stream drained outside the clock): the floor any Python hot path pays.

    PYTHONPATH=$PWD python3 benchmarks/host_costs.py

Prints one line per primitive, in microseconds.  Used to decide what the
prepared hot path may spend (benchmarks/NOTES.md, item 27).
"""

from __future__ import annotations

import ctypes
import statistics
import threading
import time

import cupy
import numpy as np
from cupy.cuda import driver, runtime

import cupy_swap

SOURCE = r"""
struct Small { long long w[4 + 6 * 4 + 2 * 16]; };
struct Large { long long w[4 + 6 * 64 + 2 * 1792]; };
extern "C" __global__ void k_int(int x) {}
extern "C" __global__ void k_small(const Small a) {}
extern "C" __global__ void k_large(const Large a) {}
"""


def median_us(fn, reps=400, sync=None):
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        if sync is not None:
            sync()
    return statistics.median(times) * 1e6


def main():
    stream = cupy.cuda.Stream(non_blocking=True)
    sync = stream.synchronize
    host = cupy_swap.empty_pinned((32768,), np.uint8)
    gpu = cupy.empty((32768,), dtype=cupy.uint8)
    mod = cupy.RawModule(code=SOURCE, options=("-std=c++17",))
    fns = {name: mod.get_function(name).kernel.ptr for name in ("k_int", "k_small", "k_large")}
    bufs = {
        "k_int": np.zeros(1, np.int64),
        "k_small": np.zeros(60, np.int64),
        "k_large": np.zeros(3972, np.int64),
    }
    params = {k: (ctypes.c_void_p * 1)(b.ctypes.data) for k, b in bufs.items()}
    rows = {}
    rows["memcpyAsync 32 KiB H2D"] = median_us(
        lambda: runtime.memcpyAsync(gpu.data.ptr, host.ctypes.data, 32768, 1, stream.ptr), sync=sync
    )
    for name in fns:
        p = ctypes.addressof(params[name])
        f = fns[name]
        rows[f"launchKernel {name} ({bufs[name].nbytes} B params)"] = median_us(
            lambda f=f, p=p: driver.launchKernel(f, 1, 1, 1, 32, 1, 1, 0, stream.ptr, p, 0), sync=sync
        )
    ev = cupy.cuda.Event(disable_timing=True)
    rows["Event(disable_timing=True)"] = median_us(lambda: cupy.cuda.Event(disable_timing=True))

    class Sub(cupy.cuda.Event):
        pass

    def sub():
        e = Sub(disable_timing=True)
        e.path, e.nbytes, e.start = "kernel", 1, None

    rows["Event subclass + 3 attributes"] = median_us(sub)
    rows["eventRecord"] = median_us(lambda: runtime.eventRecord(ev.ptr, stream.ptr), sync=sync)
    rows["eventQuery (done)"] = median_us(lambda: ev.done)
    if hasattr(runtime, "streamIsCapturing"):
        rows["runtime.streamIsCapturing"] = median_us(lambda: runtime.streamIsCapturing(stream.ptr))
    cu_is_capturing = ctypes.CDLL("libcuda.so.1").cuStreamIsCapturing  # what the library used before
    cu_is_capturing.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
    status = ctypes.c_int(0)
    rows["ctypes cuStreamIsCapturing"] = median_us(lambda: cu_is_capturing(stream.ptr, ctypes.byref(status)))
    rows["get_current_stream().ptr"] = median_us(lambda: cupy.cuda.get_current_stream().ptr)
    rows["runtime.getDevice"] = median_us(runtime.getDevice)
    lock = threading.Lock()

    def locked():
        with lock:
            pass

    rows["Lock with-block"] = median_us(locked)
    rng = np.random.default_rng(0)
    n, limit = 1250, 50000
    m = np.column_stack((rng.choice(200000, n, replace=False), rng.choice(limit, n, replace=False))).astype(
        np.int64
    )
    limits = np.array([200000, limit], dtype=np.uint64)
    flags = np.empty((n, 2), dtype=bool)
    rows["bounds: less(view uint64, limits).all()"] = median_us(
        lambda: np.less(m.view(np.uint64), limits, out=flags).all()
    )
    rows["bounds: m.min(), m.max()"] = median_us(lambda: (m.min(), m.max()))
    scratch = np.empty(limit, dtype=np.int32)
    rows_idx = np.arange(n, dtype=np.int32)

    def dup_scatter():
        d = m[:, 1]
        scratch[d] = rows_idx
        return bool((scratch[d] != rows_idx).any())

    rows["duplicates: scatter/gather"] = median_us(dup_scatter)
    rows["duplicates: bincount(limit).max()"] = median_us(lambda: np.bincount(m[:, 1], minlength=0).max())
    rows["duplicates: sort"] = median_us(lambda: (lambda s: (s[1:] == s[:-1]).any())(np.sort(m[:, 1])))
    out = np.zeros(2 * 1792, np.int64)

    def write_pairs():
        out[: 2 * n] = m.reshape(-1)

    rows["write 1250 pairs into a buffer"] = median_us(write_pairs)
    as_list = m.tolist()
    rows["np.asarray(list of 1250 lists)"] = median_us(lambda: np.asarray(as_list), reps=100)
    rows["np.array(list, int64)"] = median_us(lambda: np.array(as_list, dtype=np.int64), reps=100)
    flat = [v for row in as_list for v in row]
    rows["np.fromiter(chain)"] = median_us(
        lambda: np.fromiter((v for row in as_list for v in row), np.int64, 2 * n), reps=100
    )
    rows["np.array(flat list)"] = median_us(lambda: np.array(flat, dtype=np.int64), reps=100)
    try:
        import torch

        t = torch.from_numpy(m)
        rows["torch CPU tensor .numpy()"] = median_us(lambda: t.numpy())
        rows["np.asarray(torch tensor)"] = median_us(lambda: np.asarray(t))
    except ImportError:
        pass
    width = max(map(len, rows))
    for k, v in rows.items():
        print(f"{k:<{width}}  {v:8.2f} us")


if __name__ == "__main__":
    main()
