"""``bench --pin``: what pinning a host pool costs, and what it costs the
neighbours (issue 41).

1. **Seconds per GiB pinned**, one ``cudaHostRegister`` of the whole pool
   against :func:`cupy_swap.hostpool.pin_pool` in chunks of each
   ``--chunk-gib``; fresh (never touched) anonymous memory each time, as a
   pool is made, and once pre-touched memory (first-touch zeroing taken out).
2. **Stall**: a pool of ``--stall-gib`` pinned in the background in chunks of
   ``--stall-chunk-gib`` while another thread swaps eagerly on an
   already-pinned pool (4 blocks of 32 KiB in, then out) and records an event
   after each swap: the longest ``swap()`` call and ``Event.record()`` it saw
   (host clock), against the same thread with nothing registering, and the
   longest chunk registration.

Every figure is measured in the run; every swap of the stall thread is
checked bit for bit at the end.  Pools are freed (and the release drained)
between measurements, so at most one large pool is alive at a time.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import mmap
import statistics
import sys
import threading
import time

from . import cli_common as common

GiB = 1 << 30


def build_parser(prog: str = "cupy-swap bench --pin") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    p.add_argument("--gib", type=common.positive_int, default=16, help="pool size of the s/GiB rows (GiB)")
    p.add_argument(
        "--chunk-gib",
        type=common.counts_arg,
        default=[1, 4, 16],
        help="chunk sizes to compare with one call (GiB, comma-separated; default 1,4,16)",
    )
    p.add_argument(
        "--stall-gib", type=common.positive_int, default=16, help="pool pinned during the stall test"
    )
    p.add_argument("--stall-chunk-gib", type=common.positive_int, default=2, help="its chunk size (GiB)")
    p.add_argument("--no-stall", action="store_true", help="skip the stall test")
    p.add_argument("--json", type=common.output_file_arg, default=None, help="write the figures as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def _free() -> None:
    from ..cuda import release

    gc.collect()
    if not release.drain(timeout=600):
        raise RuntimeError("bench --pin: a dropped pool was not released within 600 s")


def one_call(gib: int, touch: bool) -> dict:
    """One ``cudaHostRegister`` of a fresh ``gib`` GiB mapping (pre-touched or
    not); seconds per GiB."""
    from ..cuda import capture, memory

    nbytes = gib * GiB
    mm = mmap.mmap(-1, nbytes)
    ptr = ctypes.addressof(ctypes.c_char.from_buffer(mm))
    if touch:
        ctypes.memset(ptr, 0, nbytes)
    runtime = memory._runtime()
    t0 = time.perf_counter()
    with capture.relaxed():
        runtime.hostRegister(ptr, nbytes, memory._PORTABLE_MAPPED)
    seconds = time.perf_counter() - t0
    with capture.relaxed():
        runtime.hostUnregister(ptr)
    mm.close()
    return {
        "what": f"one call{', pre-touched' if touch else ''}",
        "gib": gib,
        "chunks": 1,
        "seconds": seconds,
        "s_per_gib": seconds / gib,
    }


def chunked(gib: int, chunk_gib: int, quiet: bool) -> dict:
    from .. import hostpool

    bar = None if quiet else hostpool.ProgressBar(f"pin {gib} GiB in {chunk_gib} GiB chunks")
    t0 = time.perf_counter()
    h = hostpool.pin_pool(
        (gib * 1024, 1 << 20), "uint8", chunk_bytes=chunk_gib * GiB, numa_policy="off", progress=bar
    )
    seconds = time.perf_counter() - t0
    row = {
        "what": f"pin_pool, {chunk_gib} GiB chunks",
        "gib": gib,
        "chunks": len(h.chunks),
        "seconds": seconds,
        "s_per_gib": seconds / gib,
        "max_chunk_s": max(h.chunk_seconds),
        "register_s": sum(h.chunk_seconds),
        "touch_s": sum(h.touch_seconds),
        "placement": h.placement.describe(),
    }
    del h
    _free()
    return row


def stall(gib: int, chunk_gib: int, quiet: bool) -> dict:
    """The longest swap call and event record another thread sees while a
    pool registers in the background, against the same with nothing
    registering."""
    import cupy
    import numpy as np

    import cupy_swap

    from .. import hostpool

    n, shape = 4, (64, 16, 8, 128)  # 32 KiB blocks of fp16
    host = cupy_swap.empty_pinned(shape, np.float16)
    host.view(np.uint16)[:] = np.random.default_rng(1).integers(0, 1 << 16, shape, dtype=np.uint16)
    gpu = cupy.zeros(shape, cupy.float16)
    sw = cupy_swap.BlockSwapper(max_blocks=64)
    stream = cupy.cuda.Stream(non_blocking=True)
    marker = cupy.cuda.Event(disable_timing=True)
    m_in = np.stack([np.arange(n), np.arange(n) + 8], 1)
    m_out = np.stack([np.arange(n) + 8, np.arange(n) + 32], 1)

    def loop(stop: threading.Event, calls: list, records: list, min_iters: int) -> None:
        i = 0
        while i < min_iters or not stop.is_set():
            for src, dst, m in ((host, gpu, m_in), (gpu, host, m_out)):
                t0 = time.perf_counter()
                ev = sw.swap(src, dst, m, stream=stream)
                t1 = time.perf_counter()
                marker.record(stream)
                t2 = time.perf_counter()
                calls.append(t1 - t0)
                records.append(t2 - t1)
                ev.synchronize()
            i += 1

    done = threading.Event()
    done.set()  # the loops below run their minimum count only
    loop(done, [], [], 200)  # warm-up: kernels compiled, op cached
    base_calls, base_records = [], []
    loop(done, base_calls, base_records, 2000)
    calls, records, stop = [], [], threading.Event()
    worker = threading.Thread(target=loop, args=(stop, calls, records, 1))
    bar = None if quiet else hostpool.ProgressBar(f"background pin {gib} GiB in {chunk_gib} GiB chunks")
    worker.start()
    t0 = time.perf_counter()
    h = hostpool.pin_pool(
        (gib * 1024, 1 << 20), "uint8", chunk_bytes=chunk_gib * GiB, background=True, progress=bar
    )
    ok = h.wait(timeout=1800)
    seconds = time.perf_counter() - t0
    stop.set()
    worker.join(timeout=600)
    stream.synchronize()
    exact = bool(np.array_equal(host[32:36].view(np.uint16), host[0:4].view(np.uint16)))
    row = {
        "what": "stall",
        "gib": gib,
        "chunk_gib": chunk_gib,
        "pinned": ok,
        "seconds": seconds,
        "s_per_gib": seconds / gib,
        "chunks": len(h.chunks),
        "max_chunk_s": max(h.chunk_seconds) if h.chunk_seconds else None,
        "max_touch_s": max(h.touch_seconds) if h.touch_seconds else None,
        "swaps_during": len(calls),
        "max_swap_call_s": max(calls),
        "max_record_s": max(records),
        "median_swap_call_s": statistics.median(calls),
        "baseline_max_swap_call_s": max(base_calls),
        "baseline_max_record_s": max(base_records),
        "baseline_median_swap_call_s": statistics.median(base_calls),
        "bit_exact": exact,
    }
    del h
    _free()
    return row


def _print(row: dict) -> None:
    if row["what"] == "stall":
        print(
            f"stall: {row['gib']} GiB pinned in the background in {row['chunks']} chunks of {row['chunk_gib']} GiB "
            f"({row['s_per_gib']:.3f} s/GiB, longest chunk registration {row['max_chunk_s']:.3f} s, longest first "
            f"touch {row['max_touch_s']:.3f} s); another thread's "
            f"{row['swaps_during']} swaps meanwhile: longest swap() call {1e3 * row['max_swap_call_s']:.2f} ms, "
            f"longest Event.record() {1e3 * row['max_record_s']:.2f} ms, median swap() "
            f"{1e6 * row['median_swap_call_s']:.1f} us (nothing registering: longest "
            f"{1e3 * row['baseline_max_swap_call_s']:.2f} ms / {1e3 * row['baseline_max_record_s']:.2f} ms, median "
            f"{1e6 * row['baseline_median_swap_call_s']:.1f} us); bit-exact: {row['bit_exact']}"
        )
    else:
        extra = (
            f", longest chunk {row['max_chunk_s']:.3f} s (driver held {row['register_s']:.2f} s in all, "
            f"first touch {row['touch_s']:.2f} s)"
            if "max_chunk_s" in row
            else ""
        )
        print(
            f"{row['what']:<32} {row['gib']:>4} GiB {row['chunks']:>3} chunks {row['seconds']:8.2f} s "
            f"{row['s_per_gib']:.3f} s/GiB{extra}"
        )


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    common.require_gpu()
    for line in common.environment_lines():
        print(line)
    rows = []
    for run in (
        [lambda: one_call(args.gib, False), lambda: one_call(args.gib, True)]
        + [lambda c=c: chunked(args.gib, c, args.quiet) for c in args.chunk_gib]
        + ([] if args.no_stall else [lambda: stall(args.stall_gib, args.stall_chunk_gib, args.quiet)])
    ):
        row = run()
        _free()
        rows.append(row)
        _print(row)
        sys.stdout.flush()
    if args.json:
        common.write_report(args.json, {"environment": common.environment_lines(), "rows": rows})
    bad = [r for r in rows if r.get("bit_exact") is False]
    return common.EXIT_MISMATCH if bad else common.EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
