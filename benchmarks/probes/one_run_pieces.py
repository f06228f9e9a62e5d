"""Where the host time of a one-run copy-engine swap goes on the device
(issue 50, item 5; ``one_run_timeline.py`` found the call's host time is
the gap to one memcpy): each piece of the call timed alone, then a
profile of whole calls.  32 KiB x 1250, one run both sides, in.

    python benchmarks/probes/one_run_pieces.py
"""

import cProfile
import functools
import io
import pstats
import statistics
import time

import cupy
import numpy as np
from cupy.cuda import runtime

import cupy_swap as cs
from cupy_swap.core.copies import copy_list
from cupy_swap.core.mapping import check_rows_for, host_rows, run_starts
from cupy_swap.cuda.copy_engine import DmaCopier

BLOCK, N = 32 << 10, 1250
REPS = 100


def timed(fn, sync) -> float:
    samples = []
    for _ in range(REPS):
        sync()
        t = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t) * 1e6)
    sync()
    return statistics.median(samples)


def main() -> None:
    host = cs.empty_pinned((2 * N, BLOCK), np.uint8)
    gpu = cupy.empty((2 * N, BLOCK), cupy.uint8)
    sw = cs.BlockSwapper(max_blocks=N)
    op = sw.prepare(host, gpu)
    stream = cupy.cuda.Stream(non_blocking=True)
    m = np.column_stack([np.arange(7, 7 + N), np.arange(11, 11 + N)]).astype(np.int64)
    layout = op._decided.layout
    copier = DmaCopier()
    flat = functools.partial(runtime.memcpyAsync, gpu.data.ptr, host.ctypes.data, N * BLOCK, 1, stream.ptr)
    rows = [
        ("prepared call (auto)", functools.partial(op, m, stream=stream)),
        ("one memcpyAsync of the run", flat),
        ("host_rows + check_rows_for", lambda: check_rows_for(layout, host_rows(m, N), N)),
        ("run_starts", functools.partial(run_starts, m)),
        ("copy_list (merged)", functools.partial(copy_list, layout, m, True)),
        ("DmaCopier.copy (merged)", functools.partial(copier.copy, layout, m, stream.ptr, False, True)),
    ]
    op(m, stream=stream).synchronize()
    print(f"32 KiB x {N}, one run, host -> GPU, path {sw.last_path}; host µs a call (median of {REPS}):")
    for _ in range(2):
        for label, fn in rows:
            print(f"  {label:32s} {timed(fn, stream.synchronize):8.1f}", flush=True)
    prof = cProfile.Profile()
    for _ in range(REPS):
        prof.enable()
        op(m, stream=stream)
        prof.disable()
        stream.synchronize()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(16)
    print("\n".join(line for line in out.getvalue().splitlines() if line.strip()), flush=True)


if __name__ == "__main__":
    main()
