"""Where a staged swap's device time goes (issue 50, item 5): the swap of
``staged_pieces.py`` (1250 x 32 KiB, host blocks one run, GPU blocks
random), with an event before and after each copy-engine call and each
chunk launch on the stream that runs it.  Prints each piece's start and end
(µs after an event recorded just before the call) and when the host issued
it (µs of host clock into the call), beside one memcpy of the same bytes.

    python benchmarks/probes/staged_timeline.py
"""

import functools
import statistics
import time

from staged_pieces import staged_cases

REPS = 15


def _since(start, event) -> float:
    import cupy

    return cupy.cuda.get_elapsed_time(start, event) * 1e3


def main() -> None:
    import cupy
    from cupy.cuda import runtime

    from cupy_swap.cuda import copy_engine
    from cupy_swap.staged import stager

    marks: list = []  # (label, event before, event after)

    def timed(label, fn, stream_of):
        def wrapper(*args, **kwargs):
            stream = stream_of(args)
            issued = time.perf_counter()
            before, after = cupy.cuda.Event(), cupy.cuda.Event()
            runtime.eventRecord(before.ptr, stream)
            out = fn(*args, **kwargs)
            runtime.eventRecord(after.ptr, stream)
            marks.append((label, before, after, issued))
            return out

        return wrapper

    copy_engine.DmaCopier.issue = timed("copy", copy_engine.DmaCopier.issue, lambda a: a[4])
    stager.Stager._launch_chunk = staticmethod(timed("launch", stager.Stager._launch_chunk, lambda a: a[3]))
    for direction, bufs, sw, stream, swap, memcpy in staged_cases():
        for name, call in (("memcpy", memcpy), ("swap()", swap)):
            rows: dict = {}
            for rep in range(REPS + 2):
                marks.clear()
                start, end = cupy.cuda.Event(), cupy.cuda.Event()
                start.record(stream)
                t0 = time.perf_counter()
                call()
                end.record(stream)
                stream.synchronize()
                if rep < 2:
                    continue
                at = functools.partial(_since, start)
                rows.setdefault("total", []).append((0.0, at(end), 0.0))
                for k, (label, b, a, issued) in enumerate(marks):
                    rows.setdefault(f"{k}:{label}", []).append((at(b), at(a), (issued - t0) * 1e6))
            print(f"{direction} {name}")
            for label, got in rows.items():
                b = statistics.median(g[0] for g in got)
                a = statistics.median(g[1] for g in got)
                h = statistics.median(g[2] for g in got)
                print(f"  {label:10} {b:8.1f} -> {a:8.1f} µs  ({a - b:7.1f})  issued at {h:6.1f} µs host")
        assert bufs.verify(), "bytes differ"
        print(f"  path {sw.last_path}")


if __name__ == "__main__":
    main()
