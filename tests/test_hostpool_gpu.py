"""Host pools pinned in chunks on the GPU (issue 41): swaps across chunk
boundaries bit-exact with a 1 GiB chunk setting, both directions, every
mapping form; rows not pinned yet refused; a failed registration raises one
clear error and leaves no CUDA error pending (a torch allocation and a swap
after it succeed); a large pool pinned in the background while another
thread captures and replays graphs of swaps and a third swaps eagerly; one
pool shared by one process per GPU.  Correctness is asserted; the timings
are recorded (``CUPY_SWAP_HOSTPOOL_LOG``: JSON lines), never asserted."""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path

import numpy as np
import pytest

from .gpu_helpers import require_gpu

cp = require_gpu()

import cupy_swap as cs  # noqa: E402
from cupy_swap import hostpool as hp  # noqa: E402
from cupy_swap.cuda import capture  # noqa: E402
from cupy_swap.hostpool import errors  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
GiB = 1 << 30
BLOCK = (16, 8, 128)  # 32 KiB of fp16


def _log(test: str, **figures) -> None:
    path = os.environ.get("CUPY_SWAP_HOSTPOOL_LOG")
    line = json.dumps({"test": test, **figures})
    print(line)
    if path:
        with open(path, "a") as f:
            f.write(line + "\n")


def _available_gib() -> float:
    avail = errors.available_memory()
    return (avail or 0) / GiB


def _random_rows(pool: np.ndarray, rows, seed: int) -> None:
    rng = np.random.default_rng(seed)
    pool.view(np.uint16)[rows] = rng.integers(0, 1 << 16, (len(rows), *pool.shape[1:]), dtype=np.uint16)


FORMS = (
    "ndarray (N, 2)",
    "list of pairs",
    "pair of ndarrays",
    "pair of lists",
    "cupy (N, 2)",
    "pair of cupy",
)


def _form(name: str, src_rows: np.ndarray, dst_rows: np.ndarray):
    """The mapping ``src_rows[i] -> dst_rows[i]`` in form ``name``."""
    pairs = np.stack([src_rows, dst_rows], 1)
    return {
        "ndarray (N, 2)": lambda: pairs,
        "list of pairs": lambda: [tuple(map(int, r)) for r in pairs],
        "pair of ndarrays": lambda: (src_rows, dst_rows),
        "pair of lists": lambda: (src_rows.tolist(), dst_rows.tolist()),
        "cupy (N, 2)": lambda: cp.asarray(pairs),
        "pair of cupy": lambda: (cp.asarray(src_rows), cp.asarray(dst_rows)),
    }[name]()


@pytest.fixture(scope="module")
def chunked_pool():
    """2.5 GiB of 32 KiB blocks pinned with a 1 GiB chunk setting: 3 chunks."""
    if _available_gib() < 8:
        pytest.skip(f"needs 8 GiB of free host memory, {_available_gib():.1f} available")
    with hp.chunk_bytes_set("1G"):
        h = cs.pin_pool((81920, *BLOCK), np.float16)
    assert [(c.first_row, c.end_row) for c in h.chunks] == [(0, 32768), (32768, 65536), (65536, 81920)]
    yield h
    del h


@pytest.mark.parametrize("mode", ["auto", "kernel", "dma"])
@pytest.mark.parametrize("form", FORMS)
def test_swaps_across_chunk_boundaries_are_bit_exact_both_ways_every_form(chunked_pool, mode, form):
    if mode == "dma" and "cupy" in form:
        pytest.skip("rows on the GPU are read by the kernel; mode='dma' refuses them")
    pool, rows_total = chunked_pool.array, 81920
    words = pool.view(np.uint16)
    sw = cs.BlockSwapper(max_blocks=64)
    rng = np.random.default_rng(zlib.crc32(f"{mode} {form}".encode()))
    edges = np.array([0, 1, 32766, 32767, 32768, 32769, 65535, 65536, 65537, 81918, 81919])
    pool_rows = np.unique(np.concatenate([edges, rng.choice(rows_total, 13, replace=False)]))
    rng.shuffle(pool_rows)
    n = len(pool_rows)
    gpu_rows = rng.permutation(64)[:n]
    _random_rows(pool, pool_rows, int(rng.integers(1 << 30)))
    # In: pool rows on both sides of every boundary -> GPU blocks, the others keep their poison.
    gpu = cp.full((64, *BLOCK), 0x7BFF, cp.uint16).view(cp.float16)
    sw.swap(pool, gpu, _form(form, pool_rows, gpu_rows), mode=mode).synchronize()
    ref = np.full((64, *BLOCK), 0x7BFF, np.uint16)
    ref[gpu_rows] = words[pool_rows]
    assert np.array_equal(cp.asnumpy(gpu).view(np.uint16), ref), f"in, {form}, mode {mode}"
    # Out: fresh GPU data -> the same pool rows; their neighbours (other chunks included) untouched.
    data = rng.integers(0, 1 << 16, (64, *BLOCK), dtype=np.uint16)
    gpu[:] = cp.asarray(data).view(cp.float16)
    near = np.setdiff1d(np.concatenate([pool_rows - 1, pool_rows + 1]).clip(0, rows_total - 1), pool_rows)
    before = words[near].copy()
    sw.swap(gpu, pool, _form(form, gpu_rows, pool_rows), mode=mode).synchronize()
    assert np.array_equal(words[pool_rows], data[gpu_rows]), f"out, {form}, mode {mode}"
    assert np.array_equal(words[near], before), "a row next to a written one changed"
    _log(
        "chunk_boundaries",
        mode=mode,
        form=form,
        rows=int(n),
        chunks=len(chunked_pool.chunks),
        path=sw.last_path,
    )


def test_a_prepared_op_and_each_chunks_own_view(chunked_pool):
    pool = chunked_pool.array
    sw = cs.BlockSwapper(max_blocks=64)
    gpu = cp.zeros((64, *BLOCK), cp.float16)
    op = sw.prepare(pool, gpu)
    rows = np.array([32767, 32768, 65535, 65536])
    _random_rows(pool, rows, 3)
    op(np.stack([rows, np.arange(4)], 1)).synchronize()
    assert np.array_equal(cp.asnumpy(gpu[:4]).view(np.uint16), pool[rows].view(np.uint16))
    for k, view in enumerate(chunked_pool.chunk_views()):  # each chunk through its own alias
        assert cs.is_pinned(view)
        local = np.array([0, len(view) - 1])
        sw.swap(view, gpu, np.stack([local, [8, 9]], 1)).synchronize()
        assert np.array_equal(cp.asnumpy(gpu[8:10]).view(np.uint16), view[local].view(np.uint16)), k


def test_rows_not_pinned_yet_are_refused_then_swap_once_pinned():
    go, paused = threading.Event(), threading.Event()

    def hold_after_first(p):  # runs in the registering thread: registration waits here
        if p.chunks_done == 1:
            paused.set()
            assert go.wait(timeout=120)

    h = cs.pin_pool((4096, *BLOCK), np.float16, chunk_bytes="32M", background=True, progress=hold_after_first)
    sw = cs.BlockSwapper(max_blocks=16)
    gpu = cp.zeros((16, *BLOCK), cp.float16)
    try:
        assert paused.wait(timeout=120) and h.usable_rows == 1024
        with pytest.raises(
            ValueError, match=r"src: expected pinned host memory, got blocks .* not pinned yet"
        ):
            sw.swap(h.array, gpu, [(2000, 0)])
        sw.swap(h.usable, gpu, [(1023, 0)]).synchronize()  # the pinned rows work meanwhile
    finally:
        go.set()
    assert h.wait(timeout=300) is True
    _random_rows(h.array, [4095], 5)
    sw.swap(h.array, gpu, [(4095, 1)]).synchronize()
    assert np.array_equal(cp.asnumpy(gpu[1]).view(np.uint16), h.array[4095].view(np.uint16))


def test_a_failed_registration_raises_one_error_and_leaves_none_pending():
    torch = pytest.importorskip("torch")
    chunk = 64 << 20
    mm = mmap.mmap(-1, 3 * chunk)
    base = ctypes.addressof(ctypes.c_char.from_buffer(mm))
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.mprotect(ctypes.c_void_p(base + 2 * chunk), ctypes.c_size_t(chunk), 0) == 0  # PROT_NONE
    array = np.frombuffer(mm, np.uint8).reshape(3 * 64, 1 << 20)
    with pytest.raises(cs.PinError) as info:
        cs.pin_array(array, chunk_bytes=chunk)
    text = str(info.value)
    assert "chunk 2 of 3" in text and "ulimit -l" in text and "memory available" in text
    assert info.value.pinned_rows == 128
    assert all(code == 0 for code in errors.clear_pending())  # nothing was left pending
    t = torch.empty((1 << 20,), device="cuda")
    t.fill_(1.0)
    torch.cuda.synchronize()
    assert float(t.sum()) == float(1 << 20)
    sw = cs.BlockSwapper(max_blocks=4)
    host = cs.empty_pinned((8, *BLOCK), np.float16)
    _random_rows(host, np.arange(8), 9)
    gpu = cp.zeros((8, *BLOCK), cp.float16)
    sw.swap(host, gpu, [(3, 0), (5, 1)]).synchronize()
    assert np.array_equal(cp.asnumpy(gpu[:2]).view(np.uint16), host[[3, 5]].view(np.uint16))
    _log("failed_registration", message=text[:400])
    del info, array
    import gc

    gc.collect()
    assert cs.hostpool.api.release.drain(timeout=120)  # the two pinned chunks unpinned before the unmap
    libc.mprotect(ctypes.c_void_p(base + 2 * chunk), ctypes.c_size_t(chunk), 3)


MEMLOCK_CHILD = r"""
import resource, sys, numpy as np
limit = 64 << 20
resource.setrlimit(resource.RLIMIT_MEMLOCK, (limit, limit))
import torch, cupy, cupy_swap as cs
from cupy_swap.hostpool import errors
try:
    h = cs.pin_pool((1024, 1 << 20), np.uint8, chunk_bytes="256M")
    print("NOT-ENFORCED", flush=True)
    sys.exit(0)
except cs.PinError as e:
    assert "ulimit -l" in str(e) and str(limit) in str(e), str(e)
    print("ERROR", str(e)[:300], flush=True)
assert all(c == 0 for c in errors.clear_pending())
t = torch.empty((1 << 20,), device="cuda"); t.fill_(2.0); torch.cuda.synchronize()
assert float(t.sum()) == 2.0 * (1 << 20)
host = cs.empty_pinned((4, 1024), np.uint8); host[:] = 7
gpu = cupy.zeros((4, 1024), cupy.uint8)
cs.BlockSwapper(max_blocks=4).swap(host, gpu, [(1, 2)]).synchronize()
assert int(gpu[2].sum()) == 7 * 1024
print("AFTER-OK", flush=True)
"""


def test_the_locked_memory_limit_gives_one_clear_error_in_a_fresh_process():
    pytest.importorskip("torch")
    r = subprocess.run(
        [sys.executable, "-c", MEMLOCK_CHILD], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert r.returncode == 0, r.stderr
    _log("memlock", stdout=r.stdout[-600:], uid=os.geteuid())
    if "NOT-ENFORCED" in r.stdout:
        pytest.skip(f"RLIMIT_MEMLOCK is not enforced on cudaHostRegister here (uid {os.geteuid()})")
    assert "ERROR" in r.stdout and "AFTER-OK" in r.stdout


def test_a_large_pool_pins_in_the_background_while_neighbours_capture_replay_and_swap():
    """A pool (48 GiB on a 128 GiB host; half the free memory at most) pinned in
    2 GiB chunks in the background; meanwhile thread B captures (global mode)
    and replays graphs of swaps, thread C swaps eagerly, both on pools pinned
    before; every capture intact and every swap bit-exact."""
    gib = int(min(float(os.environ.get("CUPY_SWAP_HOSTPOOL_GIB", 48)), _available_gib() / 2))
    if gib < 4:
        pytest.skip(f"needs 8 GiB of free host memory, {_available_gib():.1f} available")
    started, errors_seen = threading.Event(), []
    calls = {"capture": [], "replay": [], "eager_swap": [], "eager_record": []}
    stop = threading.Event()
    host_b = cs.empty_pinned((256, *BLOCK), np.float16)
    host_c = cs.empty_pinned((256, *BLOCK), np.float16)
    _random_rows(host_b, np.arange(256), 11)
    _random_rows(host_c, np.arange(128), 12)
    sw_b, sw_c = cs.BlockSwapper(max_blocks=64), cs.BlockSwapper(max_blocks=64)
    counts = {"graphs": 0, "replays": 0, "eager": 0}

    def capturer():
        try:
            stream = cp.cuda.Stream(non_blocking=True)
            gpu = cp.zeros((64, *BLOCK), cp.float16)
            gs = sw_b.graph_swap(host_b, gpu)
            rng = np.random.default_rng(21)
            assert started.wait(timeout=300)
            while not stop.is_set() or counts["graphs"] < 3:
                gs.set_mapping([], stream=stream)
                t0 = time.perf_counter()
                stream.begin_capture(cp.cuda.runtime.streamCaptureModeGlobal)
                gs.launch(stream=stream)
                graph = stream.end_capture()
                calls["capture"].append(time.perf_counter() - t0)
                counts["graphs"] += 1
                for _ in range(4):
                    src = rng.choice(256, 16, replace=False)
                    dst = rng.choice(64, 16, replace=False)
                    gs.set_mapping(np.stack([src, dst], 1), stream=stream)
                    t0 = time.perf_counter()
                    graph.launch(stream)
                    calls["replay"].append(time.perf_counter() - t0)
                    stream.synchronize()
                    got = cp.asnumpy(gpu[dst]).view(np.uint16)
                    assert np.array_equal(got, host_b[src].view(np.uint16)), "replayed swap differs"
                    counts["replays"] += 1
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors_seen.append(("capture", repr(e)))
            stop.set()

    def swapper():
        try:
            stream = cp.cuda.Stream(non_blocking=True)
            gpu = cp.zeros((64, *BLOCK), cp.float16)
            marker = cp.cuda.Event(disable_timing=True)
            rng = np.random.default_rng(31)
            assert started.wait(timeout=300)
            while not stop.is_set() or counts["eager"] < 3:
                src, dst = rng.choice(128, 8, replace=False), rng.choice(64, 8, replace=False)
                t0 = time.perf_counter()
                ev = sw_c.swap(host_c, gpu, (src, dst), stream=stream)
                t1 = time.perf_counter()
                marker.record(stream)
                calls["eager_swap"].append(t1 - t0)
                calls["eager_record"].append(time.perf_counter() - t1)
                # The check allocates and copies synchronously: relaxed, as the library's own calls,
                # so thread B's global-mode capture stays valid.
                with capture.relaxed():
                    ev.synchronize()
                    got = cp.asnumpy(gpu[cp.asarray(dst)]).view(np.uint16)
                assert np.array_equal(got, host_c[src].view(np.uint16))
                back = 128 + rng.choice(128, 8, replace=False)
                sw_c.swap(gpu, host_c, (dst, back), stream=stream).synchronize()
                assert np.array_equal(host_c[back].view(np.uint16), host_c[src].view(np.uint16))
                counts["eager"] += 1
        except BaseException as e:  # noqa: BLE001
            errors_seen.append(("eager", repr(e)))
            stop.set()

    threads = [threading.Thread(target=capturer), threading.Thread(target=swapper)]
    for t in threads:
        t.start()
    progress = []
    t0 = time.perf_counter()
    h = cs.pin_pool(
        (gib * 1024, 1 << 20),
        np.uint8,
        chunk_bytes="2G",
        background=True,
        progress=lambda p: (progress.append(p), started.set()),
    )
    try:
        pinned = h.wait(timeout=1800)
    finally:
        started.set()
        stop.set()
        for t in threads:
            t.join(timeout=600)
    seconds = time.perf_counter() - t0
    assert errors_seen == [], errors_seen
    assert pinned is True and h.error is None
    assert counts["graphs"] >= 3 and counts["replays"] >= 12 and counts["eager"] >= 3
    # The pool itself: rows at each chunk boundary, bit-exact both ways.
    sw = cs.BlockSwapper(max_blocks=64)
    edges = np.array(sorted({max(0, c.first_row - 1) for c in h.chunks} | {c.first_row for c in h.chunks}))[
        :64
    ]
    data = np.random.default_rng(41).integers(0, 256, (len(edges), 1 << 20), dtype=np.uint8)
    gpu = cp.asarray(data)
    sw.swap(gpu, h.array, (np.arange(len(edges)), edges)).synchronize()
    assert np.array_equal(h.array[edges], data)
    back = cp.zeros_like(gpu)
    sw.swap(h.array, back, np.stack([edges, np.arange(len(edges))], 1)).synchronize()
    assert np.array_equal(cp.asnumpy(back), data)
    _log(
        "background_48",
        gib=gib,
        chunks=len(h.chunks),
        seconds=seconds,
        s_per_gib=seconds / gib,
        max_chunk_s=max(h.chunk_seconds),
        register_s=sum(h.chunk_seconds),
        max_touch_s=max(h.touch_seconds),
        touch_s=sum(h.touch_seconds),
        median_chunk_s=float(np.median(h.chunk_seconds)),
        placement=h.placement.describe(),
        graphs=counts["graphs"],
        replays=counts["replays"],
        eager_swaps=counts["eager"],
        **{f"max_{k}_s": max(v) for k, v in calls.items() if v},
        **{f"median_{k}_s": float(np.median(v)) for k, v in calls.items() if v},
    )
    del h, gpu, back


def test_one_pool_per_node_shared_by_one_process_per_rank():
    ranks = max(2, cp.cuda.runtime.getDeviceCount())
    r = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "host_pool.py"),
            "--ranks",
            str(ranks),
            "--gib",
            "1",
            "--chunk-gib",
            "0.25",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert r.returncode == 0, f"stdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    ok = [line for line in r.stdout.splitlines() if line.startswith("ok: rank")]
    assert len(ok) == ranks and all("bit-exact" in line for line in ok), r.stdout
    assert "pinning the shared pool [" in r.stderr  # the progress bar
    _log("shared_example", ranks=ranks, stdout=r.stdout[-800:])
