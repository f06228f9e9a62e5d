"""Host time of a prepared call with one part and with 64 parts (32 layers x
K/V), 16 and 1250 rows, rows on the host and on the GPU, beside a bare
32 KiB ``cudaMemcpyAsync`` call timed in the same rounds (issue 25's goal:
64 parts at most one part + 2 us).  NOTES item 43.

    python benchmarks/probes/parts_host.py
"""

import functools

import cupy
import numpy as np
from cupy.cuda import runtime

from cupy_swap import BlockSwapper
from cupy_swap.tools.bench import CaseBuffers, SwapCase, host_times

rng = np.random.default_rng(0)
stream = cupy.cuda.Stream(non_blocking=True)
hb = cupy.cuda.alloc_pinned_memory(32768)
gb = cupy.empty(32768, cupy.uint8)
calls, keep = (
    {"memcpy": functools.partial(runtime.memcpyAsync, gb.data.ptr, hb.ptr, 32768, 1, stream.ptr)},
    [],
)
for parts, block, n in ((1, 32768, 16), (64, 4096, 16), (64, 4096, 1250), (1, 4096, 1250)):
    bufs = CaseBuffers(SwapCase("in", block, n, parts), rng)
    sw = BlockSwapper(max_blocks=n)
    op = sw.prepare(bufs.src, bufs.dst)
    keep += [bufs, sw, op]
    calls[f"{parts}p x {n}"] = functools.partial(op, bufs.mapping, stream=stream)
    g = cupy.asarray(bufs.mapping)
    keep.append(g)
    calls[f"{parts}p x {n} GPU rows"] = functools.partial(op, g, stream=stream)
for c in calls.values():
    c()
    stream.synchronize()
ht = host_times(calls, stream, 200)
for k, v in ht.items():
    print(f"{k:24s} host {v * 1e6:6.2f} us  {v / ht['memcpy']:5.2f}x memcpy")
print("verified", all(b.verify() for b in keep if isinstance(b, CaseBuffers)))
