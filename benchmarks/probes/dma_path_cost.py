"""Where a prepared copy-engine call of 1 x 2 MiB blocks spends its host time
on the device, next to the V1 pattern's (NumPy pointer lists and one
``cuMemcpyBatchAsync``) on the same buffers (issue 34, item 5; NOTES 58):
each piece timed alone, then a profile of whole calls.

    python benchmarks/probes/dma_path_cost.py
"""

import cProfile
import io
import pstats
import statistics
import time

import cupy
import numpy as np
from cupy.cuda import runtime

import cupy_swap as cs
from cupy_swap.core.copies import copy_list
from cupy_swap.core.mapping import check_rows_for, host_rows
from cupy_swap.cuda.copy_engine import DmaCopier
from cupy_swap.tools.engines import pointer_lists

BLOCK, BLOCKS = 2 << 20, 600
REPS = 300


def timed(fn, sync, reps: int = REPS) -> float:
    samples = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t) * 1e6)
        sync()
    return statistics.median(samples)


def main() -> None:
    host = cs.empty_pinned((BLOCKS, BLOCK), np.uint8)
    gpu = cupy.empty((BLOCKS, BLOCK), cupy.uint8)
    sw = cs.BlockSwapper(max_blocks=BLOCKS)
    op = sw.prepare(host, gpu)
    stream = cupy.cuda.Stream(non_blocking=True)
    rng = np.random.default_rng(0)
    for n in (16, 256):
        m = np.stack([rng.permutation(BLOCKS)[:n], rng.permutation(BLOCKS)[:n]], 1).astype(np.int64)
        probe(sw, op, host, gpu, stream, m)


def probe(sw, op, host, gpu, stream, m) -> None:
    copier = DmaCopier()
    layout = op._decided.layout
    n = m.shape[0]

    def v1():
        dsts, srcs, sizes = pointer_lists([host.ctypes.data], [BLOCK], [gpu.data.ptr], [BLOCK], m, BLOCK)
        copier.issue(dsts, srcs, sizes, stream.ptr, runtime.memcpyHostToDevice)

    table = copy_list(layout, m, False)
    rows = [
        ("prepared call", lambda: op(m, stream=stream)),
        ("V1 pattern", v1),
        ("issue_table alone (batch call)", lambda: copier.issue_table(table, stream.ptr, 1)),
        ("host_rows + check_rows_for", lambda: check_rows_for(layout, host_rows(m, BLOCKS), BLOCKS)),
        ("copy_list", lambda: copy_list(layout, m, False)),
        ("eventRecord", lambda: runtime.eventRecord(sw._events.take(False).ptr, stream.ptr)),
    ]
    print(f"1 x 2 MiB, n={n}, host -> GPU, host µs per call (median of {REPS}, synchronized between):")
    for _ in range(2):
        for label, fn in rows:
            print(f"  {label:34s} {timed(fn, stream.synchronize):8.1f}", flush=True)
    prof = cProfile.Profile()
    for _ in range(REPS):
        prof.enable()
        op(m, stream=stream)
        prof.disable()
        stream.synchronize()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(12)
    print("\n".join(line for line in out.getvalue().splitlines() if line.strip()), flush=True)


if __name__ == "__main__":
    main()
