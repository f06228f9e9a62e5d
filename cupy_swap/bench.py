"""Measurement primitives shared by the CLI and the benchmark suite.

Every figure is a *blocking latency*: the host clock around submit + stream
synchronize, the median of ``reps`` calls after warm-up, which is what a
caller of a synchronous swap sees.  Bandwidth is bytes moved / latency in GB/s
(1e9 B/s).  The ceiling is one contiguous ``cudaMemcpyAsync`` of the same
byte count between the same two memories, measured in the same run.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import numpy as np

from . import memory

__all__ = [
    "gpu_status",
    "SwapCase",
    "CaseBuffers",
    "time_blocking",
    "memcpy_ceiling",
    "per_block_memcpy",
    "random_mapping",
    "fill_random",
]


def gpu_status() -> tuple[bool, str]:
    """(True, description) when a CUDA GPU answers, else (False, why not)."""
    try:
        import cupy

        n = cupy.cuda.runtime.getDeviceCount()
    except ImportError as e:
        return False, f"CuPy is not installed ({e}); install cupy-swap[cuda12] or [cuda13]"
    except Exception as e:  # CUDARuntimeError without a driver or device
        return False, f"no CUDA GPU is available ({e})"
    if n == 0:
        return False, "no CUDA GPU is available (the driver reports 0 devices)"
    import cupy

    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.runtime.getDevice())
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    return True, f"{name} (GPU {cupy.cuda.runtime.getDevice()} of {n})"


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


def time_blocking(fn, stream, reps: int = 30, warmup: int = 3) -> dict:
    """Median host-clock latency of ``fn(); stream.synchronize()``, and the
    median device time between events around ``fn()``.

    Returns
    -------
    dict
        ``{"latency_s": float, "device_s": float, "samples": int}``
    """
    import cupy

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
