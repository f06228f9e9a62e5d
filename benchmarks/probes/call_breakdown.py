"""Host time of each step of a prepared call, timed alone on the device's
host (median of 400, the stream drained outside the clock), next to the
whole call and a bare ``cudaMemcpyAsync``: which steps are worth a change.

    python benchmarks/probes/call_breakdown.py
"""

import functools

import cupy
import numpy as np
from cupy.cuda import runtime

from cupy_swap import BlockSwapper
from cupy_swap.core.copies import copy_list
from cupy_swap.core.mapping import check_mapping_for, host_rows
from cupy_swap.cuda import memory
from cupy_swap.cuda.gpu_mapping import device_rows
from cupy_swap.cuda.streams import stream_is_capturing, stream_on_device
from cupy_swap.tools.bench import CaseBuffers, SwapCase, host_time

KIB = 1024
CASES = [
    ("in", 32 * KIB, 1, 1),
    ("in", 32 * KIB, 16, 1),
    ("in", 2048 * KIB, 16, 1),
    ("in", 4 * KIB, 1250, 1),
    ("in", 4 * KIB, 16, 64),
]
REPS = 400


def main() -> None:
    rng = np.random.default_rng(0)
    stream = cupy.cuda.Stream(non_blocking=True)
    host = cupy.cuda.alloc_pinned_memory(32768)
    dev = cupy.empty(32768, cupy.uint8)
    t = functools.partial(host_time, stream=stream, reps=REPS)
    memcpy = t(lambda: runtime.memcpyAsync(dev.data.ptr, host.ptr, 32768, 1, stream.ptr))
    print(f"bare cudaMemcpyAsync 32 KiB: {memcpy * 1e6:.2f} us")
    for direction, block, n, parts in CASES:
        breakdown(direction, block, n, parts, rng, stream, t)


def breakdown(direction, block, n, parts, rng, stream, t) -> None:
    """Print the host time of each step of a prepared call of one case."""
    bufs = CaseBuffers(SwapCase(direction, block, n, parts), rng)
    sw = BlockSwapper(max_blocks=n)
    op = sw.prepare(bufs.src, bufs.dst)
    m = bufs.mapping
    decided = op._decided
    layout = decided.layout
    handle = stream.ptr
    op(m, stream=stream)
    stream.synchronize()
    pairs = host_rows(m, sw.max_blocks)
    count = len(pairs) // 2 if type(pairs) is list else pairs.shape[0]
    path = "dma" if count * parts <= sw.dma_max_copies else decided.route
    steps = {
        "whole prepared call": lambda: op(m, stream=stream),
        "whole prepared call, host check": lambda: op(m, stream=stream, check="host"),
        "whole swap() call": lambda: sw.swap(bufs.src, bufs.dst, m, stream=stream),
        "swap() cache key": lambda: sw._ops.key(bufs.src, bufs.dst),
        "get device": sw._get_device,
        "generation": memory.generation,
        "device_rows": lambda: device_rows(m, 0, sw.max_blocks),
        "host_rows": lambda: host_rows(m, sw.max_blocks),
        "host check": lambda: check_mapping_for(layout, m, sw.max_blocks),
        "stream_on_device": lambda: stream_on_device(stream, 0),
        "stream_is_capturing": lambda: stream_is_capturing(handle),
        "checked seq": sw._launcher.slots.checked_seq,
        "events.take": lambda: sw._events.take(False),
        "event record": lambda: sw._record(sw._events.take(False).ptr, handle),
    }
    if path == "kernel":

        def checked_launch():
            ticket = sw._status.take(None, layout)  # each launch its own record, as a swap's
            decided.kernel.launch(pairs, count, handle, False, ticket.address, ticket.seq)

        steps["kernel launch (inline, checked)"] = checked_launch
        steps["kernel launch (inline)"] = lambda: decided.kernel.launch(pairs, count, handle, False)
    else:
        arr = np.array(pairs, dtype=np.int64).reshape(-1, 2) if type(pairs) is list else pairs
        steps["dma copy"] = lambda: sw._dma.copy(layout, arr, handle)
        steps["copy_list"] = lambda: copy_list(layout, arr)
        d, s, z = copy_list(layout, arr)
        steps["dma issue (prebuilt lists)"] = lambda: sw._dma.issue(d, s, z, handle, 1)
    print(f"{direction} {parts} x {block // KIB} KiB x {n}: path {path}")
    for name, fn in steps.items():
        fn()
        stream.synchronize()
        print(f"  {name:<28} {t(fn) * 1e6:7.2f} us", flush=True)
    sw.close()


if __name__ == "__main__":
    main()
