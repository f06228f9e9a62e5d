"""Helpers for the GPU test modules, in one place (test modules import from
here, never from each other).

Each GPU module starts with ``cp = require_gpu()`` (``require_gpu(2)`` for
two GPUs, then ``torch = require_torch_cuda()`` where it needs torch): on a
machine without them the whole module is skipped at collection, with one
reason.  Tests marked ``gpu`` inside CPU modules are skipped one by one by
``conftest.py``, which reads the GPU status from here too."""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import time

import numpy as np
import pytest

import cupy_swap as cs
from cupy_swap.tools.bench import gpu_status, random_mapping
from cupy_swap.tools.cli import no_gpu_message

try:
    import cupy as cp
except ImportError:  # no CuPy: GPU_OK is False, and no GPU module gets past require_gpu()
    cp = None

GPU_OK, GPU_WHY = gpu_status()

TORCH_REASON = 'needs PyTorch: pip install torch, or the torch extra (pip install -e ".[cuda12,test,torch]")'


@functools.cache
def gpu_count() -> int:
    """CUDA devices that answer (0 without CuPy, a driver or a device)."""
    return cp.cuda.runtime.getDeviceCount() if GPU_OK else 0


def skip_reason(count: int = 1) -> str | None:
    """Why a test that needs ``count`` GPUs cannot run here, or None."""
    gpus = gpu_count()
    if not gpus:
        return f"needs a CUDA GPU: {no_gpu_message(GPU_WHY)}"
    if gpus < count:
        return f"needs {count} CUDA GPUs, found {gpus}"
    return None


def require_gpu(count: int = 1):
    """The ``cupy`` module, or a skip of the calling module (at its top level)
    when this machine has fewer than ``count`` GPUs."""
    reason = skip_reason(count)
    if reason:
        pytest.skip(reason, allow_module_level=True)
    return cp


def require_torch_cuda():
    """The ``torch`` module, or a module-level skip where torch or its CUDA is missing."""
    torch = pytest.importorskip("torch", reason=TORCH_REASON)
    if not torch.cuda.is_available():  # pragma: no cover - depends on the machine
        pytest.skip(
            "needs PyTorch with CUDA (this torch build or machine has none): install a CUDA build of torch",
            allow_module_level=True,
        )
    return torch


# ------------------------------------------------------- data and bit-exact checks
POISON = 0xA5
# Set by benchmarks/soak.sh around compute-sanitizer: there the frames of a
# finished swap call stay referenced (NOTES 75), so what it held is freed
# later than by reference counting; tests skip only those assertions.
UNDER_SANITIZER = os.environ.get("CUPY_SWAP_SANITIZER") == "1"

# Where source and destination live, per direction.
DIRECTIONS = {"in": ("host", "gpu"), "out": ("gpu", "host"), "gpu->gpu": ("gpu", "gpu")}


def rand_fill(a, rng):
    """Per-block distinct random bytes."""
    host = rng.integers(0, 256, size=a.nbytes, dtype=np.uint8)
    if isinstance(a, np.ndarray):
        a.reshape(-1).view(np.uint8)[:] = host
    else:
        a.reshape(-1).view(cp.uint8).set(host)


def poison(a):
    if isinstance(a, np.ndarray):
        a.view(np.uint8)[...] = POISON
    else:
        a.view(cp.uint8).fill(POISON)


def to_host(a):
    return a.copy() if isinstance(a, np.ndarray) else cp.asnumpy(a)


def make(kind, shape, dtype):
    if kind == "host":
        return cs.empty_pinned(shape, dtype)
    return cp.empty(shape, dtype=dtype)


def capture_graph_swap(gs, stream):
    """Capture ``gs.launch()`` on ``stream`` (an empty mapping staged first);
    returns the graph, which replays whatever ``set_mapping`` staged last."""
    gs.set_mapping([], stream=stream)
    stream.begin_capture()
    gs.launch(stream=stream)
    return stream.end_capture()


def check_swap(sw, src, dst, mapping, **kw):
    """Run one swap and compare every destination with the NumPy reference;
    blocks not named in the mapping must keep their poison."""
    srcs = src if isinstance(src, (list, tuple)) else [src]
    dsts = dst if isinstance(dst, (list, tuple)) else [dst]
    before = [to_host(d) for d in dsts]
    ev = sw.swap(src, dst, mapping, **kw)
    ev.synchronize()
    m = np.asarray(mapping, dtype=np.int64).reshape(-1, 2)
    for s, d, b in zip(srcs, dsts, before):
        ref = b.copy()
        ref[m[:, 1]] = to_host(s)[m[:, 0]]
        got = to_host(d)
        assert np.array_equal(got.view(np.uint8), ref.view(np.uint8))
    return ev


# ------------------------------------------------------------ a busy stream
# %globaltimer counts nanoseconds whatever the clocks do (clock64 counts SM
# cycles, and CUDA 13 no longer reports the clock rate to convert them).
_SPIN_SOURCE = r"""
extern "C" __global__ void spin(unsigned long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < ns);
}
"""


def spin(stream, ms: float) -> None:
    """Keep ``stream`` busy on the GPU for ``ms`` milliseconds, so work queued
    behind it is certainly still queued when the host acts next."""
    kernel = cp.RawKernel(_SPIN_SOURCE, "spin")
    with stream:
        kernel((1,), (1,), (np.uint64(ms * 1e6),))


_GATE_SOURCE = r"""
extern "C" __global__ void gate(const volatile int* flag, unsigned long long limit_ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        __nanosleep(1000);
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (*flag == 0 && now - start < limit_ns);
}
"""


class Gate:
    """A kernel that holds ``stream`` until the host calls :meth:`open` (or,
    so a failing test cannot hang, ``limit_s`` seconds pass): work queued
    behind it stays queued for as long as the test needs, whatever the
    clock.  ``event`` is recorded after the gate; ``open()`` waits for it."""

    def __init__(self, stream, limit_s: float = 60.0, flag=None):
        from cupy_swap.cuda.memory import host_alias

        self.flag = cs.zeros_pinned(1, np.int32) if flag is None else flag  # reused: no free meanwhile
        self.flag[0] = 0
        kernel = cp.RawKernel(_GATE_SOURCE, "gate")
        self.event = cp.cuda.Event()  # made before the gate holds the GPU (a creation may wait for it)
        with stream:
            kernel((1,), (1,), (host_alias(self.flag.ctypes.data, 4), np.uint64(limit_s * 1e9)))
            self.event.record(stream)

    @property
    def closed(self) -> bool:
        return not self.event.done

    def open(self) -> None:
        self.flag[0] = 1
        self.event.synchronize()


class CallTimes:
    """Calls made through it, timed, for a failure message only (NOTES 72:
    a soak run failed a gate test with no sign of which call had waited).

    ``calls(fn, *args, **kwargs)`` calls ``fn`` and returns what it returns;
    ``str(calls)`` names the slowest call, its index and milliseconds."""

    def __init__(self):
        self.seconds: list = []

    def __call__(self, fn, *args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            self.seconds.append(time.perf_counter() - start)

    def __str__(self) -> str:
        if not self.seconds:
            return "no calls timed"
        i = max(range(len(self.seconds)), key=self.seconds.__getitem__)
        total = sum(self.seconds) * 1e3
        return f"{len(self.seconds)} calls in {total:.1f} ms; the slowest, #{i}, took {self.seconds[i] * 1e3:.1f} ms"


# ------------------------------------------------------------ many threads
SWAPS_PER_THREAD = 40


def swap_worker(sw, seed, gpu, host, results, index):
    """Alternate swap-outs and swap-ins of random sizes on this thread's own
    stream and arrays, without waiting in between; then compare with a NumPy
    replay of the same swaps in order."""
    try:
        rng = np.random.default_rng(seed)
        stream = cp.cuda.Stream(non_blocking=True)
        ref_gpu, ref_host = cp.asnumpy(gpu), host.copy()
        g_blocks, h_blocks = gpu.shape[0], host.shape[0]
        for i in range(SWAPS_PER_THREAD):
            # Both sides of the descriptor cut-over (64 pairs: read from
            # pinned memory below, uploaded to the device above).
            n = int(rng.choice([1, 5, 63, 64, 65, 200]))
            if i % 2:
                m = random_mapping(n, h_blocks, g_blocks, rng)
                sw.swap_in(host, gpu, m, stream=stream, mode="kernel")
                ref_gpu[m[:, 1]] = ref_host[m[:, 0]]
            else:
                m = random_mapping(n, g_blocks, h_blocks, rng)
                sw.swap_out(gpu, host, m.tolist() if n < 16 else m, stream=stream)
                ref_host[m[:, 1]] = ref_gpu[m[:, 0]]
        stream.synchronize()
        results[index] = np.array_equal(cp.asnumpy(gpu), ref_gpu) and np.array_equal(host, ref_host)
    except BaseException as e:  # reported by the main thread
        results[index] = e


def run_threads(arg_tuples, target, results):
    """Run ``target(*args)`` in one thread per tuple, wait for all, and fail
    with the first exception a thread stored in ``results``, or for any
    thread whose swaps came out wrong."""
    threads = [threading.Thread(target=target, args=args) for args in arg_tuples]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    for t, r in enumerate(results):
        if isinstance(r, BaseException):
            raise r
        assert r is True, f"thread {t}: swaps came out wrong"


@contextlib.contextmanager
def another_thread_capturing(device: int):
    """While the block runs, another thread holds a global-mode capture (of
    one small kernel) open on its own stream; on exit the capture ends, and
    its graph is replayed and checked: a swap inside the block that broke
    the capture fails the test."""
    other = cp.cuda.Stream(non_blocking=True)
    scratch = cp.zeros(16, cp.float32)
    started, finished, result = threading.Event(), threading.Event(), {}

    def capture():
        with cp.cuda.Device(device):
            other.begin_capture(cp.cuda.runtime.streamCaptureModeGlobal)
            scratch.__iadd__(1)  # something to capture (on `other`: CuPy's current stream here)
            started.set()
            finished.wait(30)
            result["graph"] = other.end_capture()

    thread = threading.Thread(target=capture)
    with other:
        thread.start()
        started.wait(30)
    try:
        yield
    finally:
        finished.set()
        thread.join(30)
    result["graph"].launch(other)  # the other thread's capture survived
    other.synchronize()
    assert float(scratch[0]) == 1.0
