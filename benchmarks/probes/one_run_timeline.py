"""Issue 50, item 5: a swap whose blocks are one run on both sides, on the
copy engines, against one ``cudaMemcpyAsync`` of the same bytes.  Per case:
what the call issued (copies and their sizes, through a counting
``DmaCopier``), blocking latency and device time (``time_blocking``), the
call's host time alone, for the prepared op in ``auto`` and ``dma`` and for
the memcpy, all on the same buffers and stream.

    python benchmarks/probes/one_run_timeline.py
"""

import functools

import numpy as np

KIB, MIB = 1 << 10, 1 << 20
CASES = [("in", 32 * KIB, 1250), ("out", 32 * KIB, 1250), ("in", 2 * MIB, 16), ("out", 2 * MIB, 16)]
REPS = 30


def main() -> None:
    import cupy
    from cupy.cuda import runtime

    from cupy_swap import BlockSwapper
    from cupy_swap.cuda import copy_engine
    from cupy_swap.tools.bench import CaseBuffers, SwapCase, host_time, time_blocking

    issued = []
    real_issue = copy_engine.DmaCopier.issue

    def counting(self, dsts, srcs, sizes, stream, kind, capturing=False):
        issued.append([int(s) for s in sizes])
        return real_issue(self, dsts, srcs, sizes, stream, kind, capturing)

    copy_engine.DmaCopier.issue = counting
    stream = cupy.cuda.Stream(non_blocking=True)
    print("case              what        copies (bytes)        blocking us  device us  host us  x memcpy")
    for direction, block, n in CASES:
        bufs = CaseBuffers(SwapCase(direction, block, n, 1, True), np.random.default_rng(0))
        nbytes, gpu, host = bufs.flat_gpu.nbytes, bufs.flat_gpu.data.ptr, bufs.flat_host.ctypes.data
        ends = (gpu, host, nbytes, 1) if direction == "in" else (host, gpu, nbytes, 2)
        memcpy = functools.partial(runtime.memcpyAsync, *ends, stream.ptr)
        sw = BlockSwapper(max_blocks=n)
        rows = [("memcpy", memcpy, "1 x %d" % nbytes)]
        for mode in ("auto", "dma"):
            op = sw.prepare(bufs.src, bufs.dst, mode=mode)
            issued.clear()
            op(bufs.mapping, stream=stream).synchronize()
            seen = issued[-1] if issued else []
            what = f"{len(seen)} x {seen[0]}" if seen else "kernel"
            rows.append((f"prepared {mode}", functools.partial(op, bufs.mapping, stream=stream), what))
        base = None
        for name, fn, what in rows:
            t = time_blocking(fn, stream, REPS)
            h = host_time(fn, stream, REPS)
            base = base or t["latency_s"]
            print(
                f"{direction:>3} {block // KIB:5}K x {n:5}  {name:14} {what:22} {t['latency_s'] * 1e6:10.1f}"
                f" {t['device_s'] * 1e6:10.1f} {h * 1e6:8.1f} {base / t['latency_s']:8.3f}",
                flush=True,
            )
        assert bufs.verify(), "bytes differ"
        sw.close()


if __name__ == "__main__":
    main()
