"""``bench --gpus``: every GPU of a node swapping at once from one host pool.

One swapper per GPU; the pool is one pinned array (threads) or one
:func:`cupy_swap.shared_pinned` pool (processes).  GPU ``i`` reads its
blocks from rows ``[2 i n, 2 i n + n)`` of the pool and writes to rows
``[2 i n + n, 2 (i + 1) n)``, each in random order, into random GPU blocks.
Each step, every worker waits at a barrier, then issues its swap (in, out,
or both on two streams: duplex) and synchronizes; the step's span runs from
the first worker's start to the last one's end (``time.perf_counter``,
one clock for threads and processes).  The memcpy aggregate is the same
harness with one contiguous ``cudaMemcpyAsync`` of the same bytes per GPU
and direction, over the same pool rows.  Drivers: ``threads`` (one thread per GPU), ``one-thread``
(one thread issues every GPU's swaps, then synchronizes them all) and
``processes`` (one spawned process per GPU, sharing the pool by name).
"""

from __future__ import annotations

import statistics
import threading
import time
import uuid

import numpy as np

from ..cuda.streams import on_device

__all__ = ["run_node", "select_devices", "DIRECTIONS", "DRIVERS"]

DIRECTIONS = ("in", "out", "duplex")
BARRIER_TIMEOUT_S = 300  # a worker that stops answering breaks the barrier instead of hanging the rest
DRIVERS = ("threads", "one-thread", "processes")


def select_devices(spec, count: int) -> list[int]:
    """The GPUs that ``spec`` names on a machine with ``count`` of them.

    Parameters
    ----------
    spec : "all" or sequence of int
        ``"all"``, or distinct non-negative device indices.
    count : int
        CUDA devices visible to this process.

    Returns
    -------
    list of int
        ``range(count)`` for ``"all"``, else ``spec`` as a list.

    Raises
    ------
    ValueError
        When ``spec`` is empty, repeats an index, or names a device that is
        not there (an index of ``count`` or more, or a negative one).
    """
    if count <= 0:
        raise ValueError(f"expected a machine with at least one GPU, got {count} GPUs")
    if isinstance(spec, str):
        if spec != "all":
            raise ValueError(f"expected 'all' or a list of GPU indices, got {spec!r}")
        return list(range(count))
    devices = [int(d) for d in spec]
    if not devices or len(set(devices)) != len(devices):
        raise ValueError(f"expected distinct GPU indices, got {devices}")
    bad = [d for d in devices if not 0 <= d < count]
    if bad:
        expected = (
            "GPU index 0 (this machine has 1 GPU)"
            if count == 1
            else f"GPU indices from 0 to {count - 1} (this machine has {count} GPUs)"
        )
        raise ValueError(f"expected {expected}, got {', '.join(map(str, bad))}")
    return devices


def pool_rows(index: int, n: int, seed: int):
    """Pool rows GPU ``index`` reads (``[2 i n, 2 i n + n)``) and writes
    (``[2 i n + n, 2 (i + 1) n)``), each in random order, and the generator
    that drew them (it goes on to draw the GPU side)."""
    rng = np.random.default_rng(seed + index)
    base = 2 * index * n
    return base + rng.permutation(n), base + n + rng.permutation(n), rng


def _digest(blocks: np.ndarray) -> str:
    import hashlib

    return hashlib.sha256(np.ascontiguousarray(blocks).tobytes()).hexdigest()


class GpuWork:
    """One GPU's part of a node benchmark: swapper, GPU blocks, mappings and
    streams.  The memcpy reference moves the same pool rows in one piece:
    in, pool rows ``[base, base + n)`` to GPU blocks ``[0, n)``; out, GPU
    blocks ``[n, 2n)`` to pool rows ``[base + n, base + 2n)``."""

    def __init__(self, index: int, device: int, pool: np.ndarray, n: int, seed: int):
        import cupy

        from ..swapper import BlockSwapper

        self.index, self.device, self.pool, self.n, self.seed = index, device, pool, n, seed
        block = pool.shape[1]
        self.base = 2 * index * n
        self.rows_in, self.rows_out, rng = pool_rows(index, n, seed)
        with cupy.cuda.Device(device):
            self.gpu = cupy.empty((2 * n, block), dtype=cupy.uint8)
            self.s_in = cupy.cuda.Stream(non_blocking=True)
            self.s_out = cupy.cuda.Stream(non_blocking=True)
            gpu_rows = rng.permutation(2 * n)
            self.m_in = np.column_stack((self.rows_in, gpu_rows[:n])).astype(np.int64)
            self.m_out = np.column_stack((gpu_rows[n:], self.rows_out)).astype(np.int64)
            self.gpu[...] = cupy.asarray(rng.integers(0, 256, (2 * n, block), dtype=np.uint8))
            cupy.cuda.Device(device).synchronize()
        self.sw = BlockSwapper(max_blocks=n, device=device)
        self.op_in = self.sw.prepare(pool, self.gpu)
        self.op_out = self.sw.prepare(self.gpu, pool)
        self.step_bytes = n * block

    def swap(self, direction: str) -> None:
        if direction != "out":
            self.op_in(self.m_in, stream=self.s_in)
        if direction != "in":
            self.op_out(self.m_out, stream=self.s_out)

    def memcpy(self, direction: str) -> None:
        from cupy.cuda import runtime

        nbytes, block = self.step_bytes, self.pool.strides[0]
        pool, gpu = self.pool.ctypes.data + self.base * block, self.gpu.data.ptr
        with on_device(self.device):
            if direction != "out":
                runtime.memcpyAsync(gpu, pool, nbytes, 1, self.s_in.ptr)
            if direction != "in":
                runtime.memcpyAsync(pool + nbytes, gpu + nbytes, nbytes, 2, self.s_out.ptr)

    def sync(self) -> None:
        self.s_in.synchronize()
        self.s_out.synchronize()

    def done(self) -> bool:
        return self.s_in.done and self.s_out.done

    def verify(self) -> tuple[bool, str]:
        """One duplex swap into poisoned destinations, from freshly written
        GPU blocks: True when the GPU then holds the pool's ``rows_in`` and
        the pool holds the new blocks at ``rows_out``; and a digest of those
        blocks, for a process that shares the pool to check them in its own
        mapping."""
        import cupy

        self.sync()
        fresh = np.random.default_rng([self.seed, self.index, 1]).integers(
            0, 256, (self.n, self.pool.shape[1]), dtype=np.uint8
        )
        with cupy.cuda.Device(self.device):
            self.gpu[self.m_out[:, 0]] = cupy.asarray(fresh)
            self.gpu[self.m_in[:, 1]] = 0x5A
            cupy.cuda.Device(self.device).synchronize()
        self.pool[self.rows_out] = 0xA5
        self.swap("duplex")
        self.sync()
        with cupy.cuda.Device(self.device):
            got_in = cupy.asnumpy(self.gpu[self.m_in[:, 1]])
        ok = np.array_equal(got_in, self.pool[self.rows_in]) and np.array_equal(
            self.pool[self.rows_out], fresh
        )
        return bool(ok), _digest(fresh)

    def bytes_per_step(self, direction: str) -> int:
        return self.step_bytes * (2 if direction == "duplex" else 1)


def _steps(work: GpuWork, what: str, direction: str, reps: int, barrier, out: list) -> None:
    """One worker: ``reps`` barrier-aligned steps, (start, end) of each.
    On an error the barrier is broken, so the other workers stop too."""
    fn = work.swap if what == "swap" else work.memcpy
    try:
        for _ in range(reps):
            barrier.wait()
            t0 = time.perf_counter()
            fn(direction)
            work.sync()
            out.append((t0, time.perf_counter()))
    except BaseException:
        barrier.abort()
        raise


def _timing(per_worker: list[list]) -> dict:
    """``span``: median over steps of (last end - first start); ``per_gpu``:
    each worker's median (end - start)."""
    span = statistics.median(max(e for _, e in step) - min(s for s, _ in step) for step in zip(*per_worker))
    return {"span": span, "per_gpu": [statistics.median(e - s for s, e in w) for w in per_worker]}


def _time_threads(works: list[GpuWork], what: str, direction: str, reps: int) -> dict:
    barrier = threading.Barrier(len(works), timeout=BARRIER_TIMEOUT_S)
    outs: list[list] = [[] for _ in works]
    errors: list[BaseException] = []

    def run(work, out):
        try:
            _steps(work, what, direction, reps, barrier, out)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=run, args=(w, o)) for w, o in zip(works, outs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:  # the cause, not the broken barrier it left behind
        raise next((e for e in errors if not isinstance(e, threading.BrokenBarrierError)), errors[0])
    return _timing(outs)


def _time_one_thread(works: list[GpuWork], what: str, direction: str, reps: int) -> dict:
    """Issue every GPU's step, then poll until each is done; a GPU's time
    runs from the first issue to the poll that sees it finished."""
    outs: list[list] = [[] for _ in works]
    for _ in range(reps):
        t0 = time.perf_counter()
        for w in works:
            (w.swap if what == "swap" else w.memcpy)(direction)
        pending = list(zip(works, outs))
        while pending:
            still = []
            for w, out in pending:
                if w.done():
                    out.append((t0, time.perf_counter()))
                else:
                    still.append((w, out))
            pending = still
        for w in works:
            w.sync()  # raises a failed stream's error
    return _timing(outs)


def _process_worker(name, shape, index, device, n, seed, plan, reps, barrier, queue):
    """Body of one process of the ``processes`` driver: reports ``("ok",
    index, timings, (verified, digest))`` or ``("error", index, traceback,
    None)``, then breaks the barrier so the other workers stop too."""
    import traceback

    try:
        from ..hostpool.shared import shared_pinned

        pool = shared_pinned(name, shape, np.uint8)
        work = GpuWork(index, device, pool, n, seed)
        results = {}
        for what, direction in plan:
            out: list = []
            _steps(work, what, direction, 3, barrier, [])  # warm-up
            _steps(work, what, direction, reps, barrier, out)
            results[(what, direction)] = out
        queue.put(("ok", index, results, work.verify()))
    except BaseException as e:
        broken = isinstance(e, threading.BrokenBarrierError)
        queue.put(("broken" if broken else "error", index, traceback.format_exc(), None))
        barrier.abort()


def _collect(procs, queue, timeout_s: float) -> list:
    """One message per process; a process that exits without one (killed,
    crashed) is an error, not a wait until the timeout."""
    import queue as queues

    got, deadline = [], time.monotonic() + timeout_s
    while len(got) < len(procs):
        try:
            got.append(queue.get(timeout=1.0))
            continue
        except queues.Empty:
            pass
        dead = [p for p in procs if p.exitcode not in (None, 0)]
        if dead or time.monotonic() > deadline:
            time.sleep(1.0)  # a message sent just before exiting may still be in the pipe
            while True:
                try:
                    got.append(queue.get_nowait())
                except queues.Empty:
                    break
            if len(got) < len(procs):
                why = (
                    f"exit codes {[p.exitcode for p in procs]}" if dead else f"no answer in {timeout_s:.0f} s"
                )
                raise RuntimeError(f"bench --gpus: a worker process ended without reporting ({why})")
    return got


def _run_processes(devices, block_bytes, n, seed, plan, reps, pool_name):
    import multiprocessing

    from ..cuda import memory
    from ..hostpool.shared import shared_pinned, unlink_shared

    shape = (2 * n * len(devices), block_bytes)
    pool = shared_pinned(pool_name, shape, np.uint8, create=True)
    procs = []
    try:
        pool[...] = np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)
        ctx = multiprocessing.get_context("spawn")
        barrier, queue = ctx.Barrier(len(devices), timeout=BARRIER_TIMEOUT_S), ctx.Queue()
        procs = [
            ctx.Process(
                target=_process_worker, args=(pool_name, shape, i, d, n, seed, plan, reps, barrier, queue)
            )
            for i, d in enumerate(devices)
        ]
        for p in procs:
            p.start()
        got = _collect(procs, queue, timeout_s=600)
        failed = [g for g in got if g[0] == "error"] or [g for g in got if g[0] == "broken"]
        if failed:
            raise RuntimeError(f"bench --gpus: worker {failed[0][1]} failed:\n{failed[0][2]}")
        got.sort(key=lambda g: g[1])
        spans = {key: _timing([g[2][key] for g in got]) for key in got[0][2]}
        # Each worker's own check, and its swapped-out blocks seen through this
        # process's mapping of the pool: the pool really is shared.
        rows_out = [pool_rows(i, n, seed)[1] for i in range(len(devices))]
        ok = all(g[3][0] and _digest(pool[rows]) == g[3][1] for g, rows in zip(got, rows_out))
        return spans, ok
    finally:
        for p in procs:
            p.join(10)
            if p.exitcode is None:
                p.terminate()
                p.join(10)
        del pool
        memory.release_dropped()  # unpin and unmap this process's mapping now
        unlink_shared(pool_name, missing_ok=True)


def run_node(
    devices: list[int] | str,
    *,
    block_bytes: int = 32768,
    n: int = 1250,
    reps: int = 20,
    drivers=DRIVERS,
    seed: int = 0,
    progress=print,
) -> dict:
    """Every GPU in ``devices`` (``"all"``, or indices checked by
    :func:`select_devices` before anything is allocated) swapping at once,
    per driver and direction, against memcpy on all of them at once (same
    harness, same run).

    Returns
    -------
    dict
        ``{"devices", "block_bytes", "num_blocks", "alone": [{"device",
        "direction", "gbps", "memcpy_gbps"}], "together": [{"driver",
        "direction", "gbps", "memcpy_gbps", "ratio", "per_gpu_gbps",
        "per_gpu_memcpy_gbps", "verified"}]}``; together GB/s are bytes moved
        by all GPUs per step over the step's span, per GPU its own bytes over
        its own median time (from its issue, or the first GPU's issue from
        one thread, to its streams being done).  ``verified``: each GPU's
        final duplex swap into poisoned destinations is bit-exact, and, for
        processes, this process sees what each worker swapped out.
    """
    from cupy.cuda import runtime

    from ..cuda.memory import empty_pinned

    devices = select_devices(devices, runtime.getDeviceCount())
    shape = (2 * n * len(devices), block_bytes)
    pool = empty_pinned(shape, np.uint8)
    pool[...] = np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)
    works = [GpuWork(i, d, pool, n, seed) for i, d in enumerate(devices)]
    result = {
        "devices": list(devices),
        "block_bytes": block_bytes,
        "num_blocks": n,
        "alone": [],
        "together": [],
    }
    for w in works:  # compile, allocate, warm the caches
        for direction in DIRECTIONS:
            for _ in range(3):
                w.swap(direction)
                w.memcpy(direction)
            w.sync()
    for w in works:
        for direction in DIRECTIONS:
            moved = w.bytes_per_step(direction)
            t = _time_one_thread([w], "swap", direction, reps)["span"]
            c = _time_one_thread([w], "memcpy", direction, reps)["span"]
            row = {
                "device": w.device,
                "direction": direction,
                "gbps": moved / t / 1e9,
                "memcpy_gbps": moved / c / 1e9,
            }
            result["alone"].append(row)
            progress(
                f"  GPU {w.device} alone, {direction:>6}: {row['gbps']:6.1f} GB/s (memcpy {row['memcpy_gbps']:6.1f})"
            )
    plan = [(what, d) for d in DIRECTIONS for what in ("swap", "memcpy")]
    for driver in drivers:
        if driver == "processes":
            spans, ok = _run_processes(
                devices, block_bytes, n, seed, plan, reps, f"bench-{uuid.uuid4().hex[:12]}"
            )
        else:
            timer = _time_threads if driver == "threads" else _time_one_thread
            spans = {(what, d): timer(works, what, d, reps) for what, d in plan}
            ok = all(w.verify()[0] for w in works)
        for direction in DIRECTIONS:
            moved = [w.bytes_per_step(direction) for w in works]
            swap, copy = spans[("swap", direction)], spans[("memcpy", direction)]
            row = {
                "driver": driver,
                "direction": direction,
                "gbps": sum(moved) / swap["span"] / 1e9,
                "memcpy_gbps": sum(moved) / copy["span"] / 1e9,
                "per_gpu_gbps": [b / t / 1e9 for b, t in zip(moved, swap["per_gpu"])],
                "per_gpu_memcpy_gbps": [b / t / 1e9 for b, t in zip(moved, copy["per_gpu"])],
                "verified": ok,
            }
            row["ratio"] = row["gbps"] / row["memcpy_gbps"]
            result["together"].append(row)
            each = ", ".join(
                f"GPU {d} {g:5.1f}/{c:5.1f}"
                for d, g, c in zip(devices, row["per_gpu_gbps"], row["per_gpu_memcpy_gbps"])
            )
            progress(
                f"  {len(works)} GPUs, {driver:>10}, {direction:>6}: {row['gbps']:6.1f} GB/s together, memcpy "
                f"{row['memcpy_gbps']:6.1f}, ratio {row['ratio']:.3f}{'' if ok else '  MISMATCH'}  (each, ours/memcpy: "
                f"{each})"
            )
    return result
