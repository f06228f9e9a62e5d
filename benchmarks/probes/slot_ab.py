"""Host rows through a ring slot against the host check, in one process:
for each case, a prepared op called with its rows as they come (the default:
more than 16 rows go through a ring slot and are checked in the launch),
with ``check="host"``, and with the same rows on the GPU, beside a bare
32 KiB ``cudaMemcpyAsync`` call timed in the same rounds.  Prints host us a
call (fastest round median), that over the memcpy call, blocking us
(submit + synchronize) and device us (events around the call, so the
submit is in it).  NOTES item 43.

    python benchmarks/probes/slot_ab.py
"""

import functools

import cupy
import numpy as np
from cupy.cuda import runtime

from cupy_swap import BlockSwapper
from cupy_swap.tools.bench import CaseBuffers, SwapCase, host_times, time_blocking

rng = np.random.default_rng(0)
stream = cupy.cuda.Stream(non_blocking=True)
hb = cupy.cuda.alloc_pinned_memory(32768)
gb = cupy.empty(32768, cupy.uint8)
mc = (gb.data.ptr, hb.ptr, 32768, 1, stream.ptr)
print("case                    form     host_us  x_memcpy  blocking_us  device_us")
for d, block, n, parts in (
    ("in", 32768, 16, 1),
    ("in", 32768, 64, 1),
    ("in", 4096, 300, 1),
    ("in", 32768, 1250, 1),
    ("out", 32768, 1250, 1),
    ("in", 4096, 1250, 1),
    ("in", 4096, 1250, 64),
    ("in", 262144, 16, 1),
):
    bufs = CaseBuffers(SwapCase(d, block, n, parts), rng)
    sw = BlockSwapper(max_blocks=max(n, 16))
    op = sw.prepare(bufs.src, bufs.dst)
    m = bufs.mapping
    gm = cupy.asarray(m)
    calls = {
        "slot": functools.partial(op, m, stream=stream),
        "host": functools.partial(op, m, stream=stream, check="host"),
        "gpu": functools.partial(op, gm, stream=stream),
        "memcpy": functools.partial(runtime.memcpyAsync, *mc),
    }
    for c in calls.values():
        c()
        stream.synchronize()
    ht = host_times(calls, stream, 200)
    for form in ("slot", "host", "gpu"):
        b = time_blocking(calls[form], stream, 40)
        print(
            f"{d:>3} {block >> 10:4d}K x {n:5d} x {parts:2d}p {form:6s} {ht[form] * 1e6:8.2f} {ht[form] / ht['memcpy']:8.2f} {b['latency_s'] * 1e6:11.1f} {b['device_s'] * 1e6:10.1f}",
            flush=True,
        )
    print(f"   memcpy call {ht['memcpy'] * 1e6:.2f} us, verified {bufs.verify()}", flush=True)
    sw.close()
