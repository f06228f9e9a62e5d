"""Measurement primitives shared by the CLI and the benchmark suite.

Every figure is a *blocking latency*: the host clock around submit + stream
synchronize, the median of ``reps`` calls after warm-up, which is what a
caller of a synchronous swap sees.  Bandwidth is bytes moved / latency in GB/s
(1e9 B/s).  The ceiling is one contiguous ``cudaMemcpyAsync`` of the same
byte count between the same two memories, measured in the same run.
"""

from __future__ import annotations

import gc
import statistics
import time
import warnings
from dataclasses import dataclass, field

import numpy as np

from ..cuda import memory

__all__ = [
    "gpu_status",
    "SwapCase",
    "CaseBuffers",
    "settle",
    "time_blocking",
    "host_time",
    "host_times",
    "memcpy_ceiling",
    "per_block_memcpy",
    "random_mapping",
    "bidir_mapping",
    "fill_random",
    "swapper_settings",
    "run_host_time",
    "HOST_TIME_MODES",
]


def gpu_status() -> tuple[bool, str]:
    """(True, description) when a CUDA GPU answers, else (False, why not).

    Returns
    -------
    tuple of (bool, str)
        Without CuPy the reason starts with "CuPy" and gives the install
        command of this project's CUDA extras
        (:func:`cupy_swap.cuda.availability.cupy_missing_message`); a CUDA
        error's reason is its text, for
        :func:`cupy_swap.cuda.availability.no_gpu_message` to explain.
    """
    try:
        import cupy

        n = cupy.cuda.runtime.getDeviceCount()
    except ImportError as e:
        from ..cuda.availability import cupy_missing_message

        return False, cupy_missing_message(e)
    except Exception as e:  # CUDARuntimeError without a driver or device
        return False, f"no CUDA GPU is available ({e})"
    if n == 0:
        return False, "no CUDA GPU is available (the driver reports 0 devices)"
    import cupy

    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.runtime.getDevice())
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    return True, f"{name} (GPU {cupy.cuda.runtime.getDevice()} of {n})"


def swapper_settings(sw=None) -> str:
    """One line with the routing thresholds and launch settings a swapper
    runs with (a default ``BlockSwapper`` on the current device when ``sw``
    is None), so every stored result says what it measured."""
    if sw is None:
        from ..swapper import BlockSwapper

        sw = BlockSwapper(max_blocks=1)
    from ..cuda.abi import UNROLL

    staging = sw.policy.staging_bytes
    return (
        f"settings: max_ctas={sw.max_ctas} unroll={UNROLL} "
        f"dma_min_copy_bytes={sw.dma_min_copy_bytes} dma_max_copies={sw.dma_max_copies} "
        f"staging_bytes={staging} "
        f"calibrated={'yes' if sw.calibrated else 'no'}"
    )


@dataclass
class SwapCase:
    """One benchmark case.

    Attributes
    ----------
    direction : str
        ``"in"`` (host -> GPU) or ``"out"`` (GPU -> host).
    block_bytes : int
        Bytes per block per part.
    num_blocks : int
        Pairs in the mapping (N).
    parts : int
        Arrays per side (layers x K/V).
    contiguous : bool
        Mapping of consecutive blocks instead of random distinct ones.
    """

    direction: str
    block_bytes: int
    num_blocks: int
    parts: int = 1
    contiguous: bool = False
    results: dict = field(default_factory=dict)

    @property
    def total_bytes(self) -> int:
        return self.block_bytes * self.num_blocks * self.parts

    def describe(self) -> dict:
        """The case's fields, as every result row of it starts."""
        return {
            "direction": self.direction,
            "block_bytes": self.block_bytes,
            "num_blocks": self.num_blocks,
            "parts": self.parts,
            "contiguous": self.contiguous,
            "bytes": self.total_bytes,
        }

    def label(self) -> str:
        size = _human_bytes(self.block_bytes)
        p = f" x{self.parts} parts" if self.parts > 1 else ""
        c = " contiguous" if self.contiguous else ""
        return f"{self.direction:>3} {size:>7} x {self.num_blocks:<5}{p}{c}"


def _human_bytes(n: int) -> str:
    for unit, size in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} B"


def random_mapping(n: int, src_blocks: int, dst_blocks: int, rng, contiguous: bool = False) -> np.ndarray:
    """``(n, 2)`` int64 mapping of distinct random source and destination
    blocks (or two consecutive runs when ``contiguous``)."""
    if contiguous:
        s0 = int(rng.integers(0, src_blocks - n + 1))
        d0 = int(rng.integers(0, dst_blocks - n + 1))
        return np.column_stack((np.arange(s0, s0 + n), np.arange(d0, d0 + n))).astype(np.int64)
    src = rng.choice(src_blocks, size=n, replace=False)
    dst = rng.choice(dst_blocks, size=n, replace=False)
    return np.column_stack((src, dst)).astype(np.int64)


def fill_random(a, rng) -> None:
    """Fill a NumPy or CuPy array with random bytes (never zeros-only)."""
    if isinstance(a, np.ndarray):
        a.view(np.uint8).reshape(-1)[:] = rng.integers(0, 256, size=a.nbytes, dtype=np.uint8)
    else:
        import cupy

        flat = a.view(cupy.uint8).reshape(-1)
        host = rng.integers(0, 256, size=flat.size, dtype=np.uint8)
        flat.set(host)


class CaseBuffers:
    """Host and GPU caches for one case: ``parts`` arrays per side of
    ``(num_blocks_side, block_bytes)`` uint8, holding random data.

    The cache on each side has ``spare`` times more blocks than the mapping
    touches, so random blocks are scattered, not packed.
    """

    def __init__(self, case: SwapCase, rng, spare: int = 2):
        import cupy

        self.case = case
        blocks = max(case.num_blocks * spare, case.num_blocks + 1)
        self.host_blocks = blocks
        self.gpu_blocks = blocks
        # One block-first host pool [blocks, parts, block_bytes], as KV tiers keep it.
        self.host_pool = memory.empty_pinned((blocks, case.parts, case.block_bytes), np.uint8)
        fill_random(self.host_pool, rng)
        self.host_parts = [self.host_pool[:, p] for p in range(case.parts)]
        self.gpu_parts = []
        for _ in range(case.parts):
            g = cupy.empty((blocks, case.block_bytes), dtype=cupy.uint8)
            fill_random(g, rng)
            self.gpu_parts.append(g)
        self.mapping = random_mapping(case.num_blocks, blocks, blocks, rng, case.contiguous)
        # Ceiling buffers: one contiguous range of the same byte count each side.
        nbytes = case.total_bytes
        self.flat_host = memory.empty_pinned((nbytes,), np.uint8)
        self.flat_gpu = cupy.empty((nbytes,), dtype=cupy.uint8)

    @property
    def src(self):
        return self.host_parts if self.case.direction == "in" else self.gpu_parts

    @property
    def dst(self):
        return self.gpu_parts if self.case.direction == "in" else self.host_parts

    def verify(self) -> bool:
        """Bit-exact check of the last swap's destination blocks."""
        import cupy

        s, d = self.mapping[:, 0], self.mapping[:, 1]
        for sp, dp in zip(self.src, self.dst):
            a = sp[s] if isinstance(sp, np.ndarray) else cupy.asnumpy(sp[cupy.asarray(s)])
            b = dp[d] if isinstance(dp, np.ndarray) else cupy.asnumpy(dp[cupy.asarray(d)])
            if not np.array_equal(a, b):
                return False
        return True


def settle() -> None:
    """Release what earlier cases dropped before the next is timed.  The
    releaser thread frees dropped pinned memory, buffers and swappers in the
    background; each free waits for the GPU and meanwhile holds up event
    records on every thread (``benchmarks/NOTES.md``, items 39 and 40), so a
    release landing inside a timing loop would be counted as swap time."""
    gc.collect()
    if not memory.release_dropped(timeout=60):
        warnings.warn(
            "settle: memory dropped earlier was not released within 60 s (is the GPU stuck?); "
            "timings may include a release",
            RuntimeWarning,
            stacklevel=2,
        )


def time_blocking(fn, stream, reps: int = 30, warmup: int = 3) -> dict:
    """Median host-clock latency of ``fn(); stream.synchronize()``, and the
    median device time between events around ``fn()``.

    Returns
    -------
    dict
        ``{"latency_s": float, "device_s": float, "samples": int}``
    """
    import cupy

    settle()
    for _ in range(warmup):
        fn()
    stream.synchronize()
    host, dev = [], []
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    for _ in range(reps):
        t0 = time.perf_counter()
        start.record(stream)
        fn()
        end.record(stream)
        stream.synchronize()
        host.append(time.perf_counter() - t0)
        dev.append(cupy.cuda.get_elapsed_time(start, end) * 1e-3)
    return {"latency_s": statistics.median(host), "device_s": statistics.median(dev), "samples": reps}


def host_time(fn, stream, reps: int = 200) -> float:
    """Median host time (seconds) spent inside ``fn()`` alone: the stream is
    synchronized after each call, outside the clock."""
    settle()
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
        stream.synchronize()
    return statistics.median(samples)


def host_times(calls: dict, stream, reps: int = 200, rounds: int = 5) -> dict:
    """:func:`host_time` of each of ``calls`` (name -> fn), robust to the
    slow spells of a host CPU: the calls take turns over ``rounds`` rounds
    of ``reps // rounds`` calls each, and each one's figure is its fastest
    round median, so a spell that slows one round does not decide any
    call's figure (each call keeps its own best round).
    (The device's host changes speed between and within processes by up to
    3x for tens of milliseconds: ``benchmarks/NOTES.md``, items 34 and 40.)

    Returns
    -------
    dict
        name -> seconds.
    """
    best = dict.fromkeys(calls, float("inf"))
    k = max(reps // rounds, 5)
    for _ in range(rounds):
        for name, call in calls.items():
            best[name] = min(best[name], host_time(call, stream, k))
    return best


def memcpy_ceiling(buffers: CaseBuffers, stream, reps: int = 30) -> dict:
    """One contiguous ``cudaMemcpyAsync`` of the case's byte count."""
    from cupy.cuda import runtime

    case = buffers.case
    h, g = buffers.flat_host.ctypes.data, buffers.flat_gpu.data.ptr
    if case.direction == "in":
        args = (g, h, case.total_bytes, runtime.memcpyHostToDevice)
    else:
        args = (h, g, case.total_bytes, runtime.memcpyDeviceToHost)

    def run():
        runtime.memcpyAsync(*args, stream.ptr)

    return time_blocking(run, stream, reps)


def per_block_memcpy(buffers: CaseBuffers, stream, reps: int = 30) -> dict:
    """One ``cudaMemcpyAsync`` per block per part: vLLM's old ``swap_blocks``."""
    from cupy.cuda import runtime

    case = buffers.case
    kind = runtime.memcpyHostToDevice if case.direction == "in" else runtime.memcpyDeviceToHost
    copies = []
    for sp, dp in zip(buffers.src, buffers.dst):
        s_base = sp.ctypes.data if isinstance(sp, np.ndarray) else sp.data.ptr
        d_base = dp.ctypes.data if isinstance(dp, np.ndarray) else dp.data.ptr
        s_stride, d_stride = sp.strides[0], dp.strides[0]
        for s, d in buffers.mapping.tolist():
            copies.append((d_base + d * d_stride, s_base + s * s_stride))
    nbytes, ptr = case.block_bytes, stream.ptr

    def run():
        for dst, src in copies:
            runtime.memcpyAsync(dst, src, nbytes, kind, ptr)

    return time_blocking(run, stream, reps)


def run_case(case: SwapCase, *, max_ctas=None, reps=30, baseline=True, seed=0, mode="auto") -> dict:
    """Measure one case: this library (in ``mode``), the memcpy ceiling and,
    optionally, one memcpy per block.  Verifies bit-exactly after timing.

    Returns
    -------
    dict
        Figures in seconds and GB/s, the ratio to the ceiling, the path that
        served the swap and whether the bytes matched.
    """
    import cupy

    from ..swapper import BlockSwapper

    rng = np.random.default_rng(seed)
    bufs = CaseBuffers(case, rng)
    stream = cupy.cuda.Stream(non_blocking=True)
    sw = BlockSwapper(max_blocks=max(case.num_blocks, 1), max_ctas=max_ctas, mode=mode)
    src, dst, mapping = bufs.src, bufs.dst, bufs.mapping

    def swap():
        sw.swap(src, dst, mapping, stream=stream)

    ours = time_blocking(swap, stream, reps)
    ok = bufs.verify()
    ceiling = memcpy_ceiling(bufs, stream, reps)
    result = {
        **case.describe(),
        "mode": mode,
        "max_ctas": sw.max_ctas,
        "path": sw.last_path,
        "verified": ok,
        "latency_s": ours["latency_s"],
        "device_s": ours["device_s"],
        "gbps": case.total_bytes / ours["latency_s"] / 1e9,
        "device_gbps": case.total_bytes / ours["device_s"] / 1e9,
        "ceiling_latency_s": ceiling["latency_s"],
        "ceiling_gbps": case.total_bytes / ceiling["latency_s"] / 1e9,
        "ceiling_device_gbps": case.total_bytes / ceiling["device_s"] / 1e9,
    }
    result["ratio"] = result["gbps"] / result["ceiling_gbps"]
    result["device_ratio"] = result["device_gbps"] / result["ceiling_device_gbps"]
    if baseline:
        per_block = per_block_memcpy(bufs, stream, max(5, reps // 3))
        result["per_block_gbps"] = case.total_bytes / per_block["latency_s"] / 1e9
    return result


HOST_LAYOUTS = {
    "random": "random blocks both sides",
    "host-runs": "host blocks in one run, GPU blocks random",
    "contiguous": "one run both sides",
}


def bidir_mapping(layout: str, n: int, blocks: int, rng, direction: str) -> np.ndarray:
    """``(n, 2)`` mapping for one direction of a duplex case."""
    if layout == "random":
        return random_mapping(n, blocks, blocks, rng)
    if layout == "contiguous":
        return random_mapping(n, blocks, blocks, rng, contiguous=True)
    run = np.arange(n, dtype=np.int64) + int(rng.integers(0, blocks - n + 1))
    gpu = rng.choice(blocks, size=n, replace=False).astype(np.int64)
    return np.column_stack((run, gpu) if direction == "in" else (gpu, run))


def run_bidir(
    block_bytes: int, n: int, *, layout="random", reps=20, rounds=10, max_ctas=None, mode="auto", seed=0
) -> dict:
    """Swap-in and swap-out of ``n`` blocks each, in flight together on two
    streams (one swapper), against two concurrent contiguous memcpys.

    Two figures, each against the memcpy pair measured the same way:
    ``single`` is one swap-in plus one swap-out, submitted in that order and
    synchronized (the blocking latency of one duplex step, host time
    included); ``sustained`` queues ``rounds`` such pairs back to back and
    synchronizes once (what an engine that swaps every step sees: the host
    prepares the next swaps while the link moves the current ones).

    Parameters
    ----------
    layout : {"random", "host-runs", "contiguous"}
        Where the blocks lie (see ``HOST_LAYOUTS``).

    Returns
    -------
    dict
        GB/s of both directions together, ceilings, ratios, the paths used,
        and whether both copies matched bit-exactly.
    """
    import cupy
    from cupy.cuda import runtime

    from ..swapper import BlockSwapper

    if layout not in HOST_LAYOUTS:
        raise ValueError(f"layout: expected one of {', '.join(HOST_LAYOUTS)}, got {layout!r}")
    rng = np.random.default_rng(seed)
    s_in, s_out = cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)
    case_in, case_out = SwapCase("in", block_bytes, n), SwapCase("out", block_bytes, n)
    b_in, b_out = CaseBuffers(case_in, rng), CaseBuffers(case_out, rng)
    b_in.mapping = bidir_mapping(layout, n, b_in.host_blocks, rng, "in")
    b_out.mapping = bidir_mapping(layout, n, b_out.host_blocks, rng, "out")
    sw = BlockSwapper(max_blocks=n, max_ctas=max_ctas, mode=mode)
    total = case_in.total_bytes + case_out.total_bytes

    def both():
        sw.swap(b_in.src, b_in.dst, b_in.mapping, stream=s_in)
        path_in = sw.last_path
        sw.swap(b_out.src, b_out.dst, b_out.mapping, stream=s_out)
        return path_in, sw.last_path

    def ceiling():
        runtime.memcpyAsync(
            b_in.flat_gpu.data.ptr, b_in.flat_host.ctypes.data, case_in.total_bytes, 1, s_in.ptr
        )
        runtime.memcpyAsync(
            b_out.flat_host.ctypes.data, b_out.flat_gpu.data.ptr, case_out.total_bytes, 2, s_out.ptr
        )

    def timed(fn, k=1):
        settle()
        for _ in range(3):
            fn()
        s_in.synchronize()
        s_out.synchronize()
        samples = []
        for _ in range(reps):
            t0 = time.perf_counter()
            for _ in range(k):
                fn()
            s_in.synchronize()
            s_out.synchronize()
            samples.append((time.perf_counter() - t0) / k)
        return statistics.median(samples)

    t, t_many = timed(both), timed(both, rounds)
    paths = both()
    s_in.synchronize()
    s_out.synchronize()
    ok = b_in.verify() and b_out.verify()
    c, c_many = timed(ceiling), timed(ceiling, rounds)
    return {
        "block_bytes": block_bytes,
        "num_blocks": n,
        "layout": layout,
        "paths": list(paths),
        "bytes": total,
        "latency_s": t,
        "gbps": total / t / 1e9,
        "ceiling_gbps": total / c / 1e9,
        "ratio": c / t,
        "rounds": rounds,
        "sustained_gbps": total / t_many / 1e9,
        "sustained_ceiling_gbps": total / c_many / 1e9,
        "sustained_ratio": c_many / t_many,
        "verified": ok,
    }


def run_with_gemm(budgets=(4, 8, 16, 32), *, block_bytes=32768, n=1250, size=8192, seed=0) -> list:
    """Swap interference with compute: a ``size``^3 fp16 matrix product on one
    stream while swaps (alternating in and out, ``n`` random blocks) run on
    another, for each CTA budget.

    Returns
    -------
    list of dict
        Per budget: the product's time alone and beside the swaps (and the
        slowdown), and the swaps' GB/s while the product runs.
    """
    import cupy

    from ..swapper import BlockSwapper

    rng = np.random.default_rng(seed)
    a = cupy.asarray(rng.standard_normal((size, size), dtype=np.float32), dtype=cupy.float16)
    b = cupy.asarray(rng.standard_normal((size, size), dtype=np.float32), dtype=cupy.float16)
    compute, copy = cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)
    b_in = CaseBuffers(SwapCase("in", block_bytes, n), rng)
    b_out = CaseBuffers(SwapCase("out", block_bytes, n), rng)
    reps = 20

    def products():
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        with compute:
            start.record(compute)
            for _ in range(reps):
                cupy.matmul(a, b)
            end.record(compute)
        return start, end

    s, e = products()
    e.synchronize()
    s, e = products()
    e.synchronize()
    alone = cupy.cuda.get_elapsed_time(s, e) * 1e-3 / reps
    out = []
    for budget in budgets:
        sw = BlockSwapper(max_blocks=n, max_ctas=budget, mode="kernel")
        sw.swap(b_in.src, b_in.dst, b_in.mapping, stream=copy)  # warm-up
        copy.synchronize()
        c0, c1 = cupy.cuda.Event(), cupy.cuda.Event()
        c0.record(copy)
        swaps = 0
        t_end = time.perf_counter() + alone * reps * 1.05
        s, e = products()
        while time.perf_counter() < t_end or swaps < 4:
            bufs = b_in if swaps % 2 == 0 else b_out
            sw.swap(bufs.src, bufs.dst, bufs.mapping, stream=copy)
            swaps += 1
            if swaps % 8 == 0:
                copy.synchronize()  # keep the queue short so swaps span the products
        c1.record(copy)
        e.synchronize()
        c1.synchronize()
        beside = cupy.cuda.get_elapsed_time(s, e) * 1e-3 / reps
        swap_s = cupy.cuda.get_elapsed_time(c0, c1) * 1e-3
        out.append(
            {
                "max_ctas": budget,
                "gemm_alone_ms": alone * 1e3,
                "gemm_beside_swaps_ms": beside * 1e3,
                "gemm_slowdown": beside / alone - 1,
                "swap_gbps": swaps * b_in.case.total_bytes / swap_s / 1e9,
                "swaps": swaps,
            }
        )
    return out


HOST_TIME_MODES = ("auto", "kernel", "dma", "staged")
# Mapping forms a caller passes: an int64 array, a list of pairs, vLLM's
# int64 CPU tensor (when torch is there), and the array to a prepared op.
HOST_TIME_FORMS = ("array", "list", "torch", "prepared")


def run_host_time(*, counts=(1, 16, 1250), reps: int = 200, seed: int = 0) -> dict:
    """Host time of one call (submit only; the stream is synchronized after
    each call, outside the clock; :func:`host_times` over ``reps`` calls),
    for one part of 32 KiB blocks and 64 parts of 4 KiB blocks (a
    block-first host pool, 32 layers x K/V), every mode and mapping form,
    swap-in, next to a bare ``cudaMemcpyAsync`` call of one 32 KiB block
    timed in the same rounds.

    ``staged`` swaps get a mapping whose host blocks are one run (the only
    kind it takes); the others get random distinct blocks.

    Returns
    -------
    dict
        ``{"memcpy_us": float, "rows": [{"parts", "block_bytes", "n", "mode",
        "form", "path", "host_us", "ratio"}, ...]}``; ``ratio`` is host time
        over that of the bare memcpy call timed beside it; ``memcpy_us`` is
        the fastest of those.
    """
    import cupy
    from cupy.cuda import runtime

    from ..swapper import BlockSwapper

    torch = None
    try:
        import torch  # noqa: F401  (vLLM passes its mapping as an int64 CPU tensor)
    except ImportError:
        pass
    rng = np.random.default_rng(seed)
    stream = cupy.cuda.Stream(non_blocking=True)
    flat_host = memory.empty_pinned((32768,), np.uint8)
    flat_gpu = cupy.empty((32768,), dtype=cupy.uint8)
    args = (flat_gpu.data.ptr, flat_host.ctypes.data, 32768, runtime.memcpyHostToDevice, stream.ptr)

    def bare_memcpy():
        runtime.memcpyAsync(*args)

    host_time(bare_memcpy, stream, reps=20)  # warm-up
    rows, memcpy_us = [], []
    for parts, block in ((1, 32768), (64, 4096)):
        for n in counts:
            bufs = CaseBuffers(SwapCase("in", block, n, parts), rng)
            sw = BlockSwapper(max_blocks=max(n, 1))
            src, dst = bufs.src, bufs.dst
            op = sw.prepare(src, dst)
            runs = np.column_stack((np.arange(n), rng.choice(bufs.gpu_blocks, n, replace=False)))
            calls, paths = {"memcpy": bare_memcpy}, {}
            for mode in HOST_TIME_MODES:
                m = runs.astype(np.int64) if mode == "staged" else bufs.mapping
                forms = {
                    "array": m,
                    "list": m.tolist(),
                    "torch": torch.from_numpy(m) if torch is not None else None,
                }
                for form in HOST_TIME_FORMS:
                    if forms.get(form, m) is None:
                        continue
                    call = _host_time_call(sw, op, src, dst, forms.get(form, m), form, mode, stream)
                    host_time(call, stream, reps=3)  # warm-up: compile, allocate, cache the layout
                    calls[mode, form], paths[mode, form] = call, sw.last_path
            k = reps if n * parts <= 1250 else max(20, reps // 8)
            seconds = host_times(calls, stream, reps=k)
            memcpy_s = seconds.pop("memcpy")
            memcpy_us.append(memcpy_s * 1e6)
            for (mode, form), t in seconds.items():
                rows.append(
                    {
                        "parts": parts,
                        "block_bytes": block,
                        "n": n,
                        "mode": mode,
                        "form": form,
                        "path": paths[mode, form],
                        "host_us": t * 1e6,
                        "ratio": t / memcpy_s,
                    }
                )
    return {"memcpy_us": min(memcpy_us, default=float("nan")), "rows": rows}


def _host_time_call(sw, op, src, dst, mapping, form: str, mode: str, stream):
    """One call of the host-time table: through the prepared op, or
    ``swap()`` with the mapping in the given form."""
    if form == "prepared":
        return lambda: op(mapping, stream=stream, mode=mode)
    return lambda: sw.swap(src, dst, mapping, stream=stream, mode=mode)
