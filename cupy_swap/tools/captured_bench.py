"""``bench --captured``: the device time of one replay of a swap captured
into a CUDA graph (:meth:`PreparedSwap.captured`, issue 40) against the same
swap launched eagerly by the prepared op with its rows on the GPU (the
"GPU rows" column of ``bench --engines``).

Cases: the engine shapes of :mod:`.engines` with one host array per part
(:data:`SHAPE_KEYS`: 64 parts of 32 KiB, 61 MLA parts of 72 KiB, one part of
2 MiB) x :data:`COUNTS` blocks x in and out, on
:class:`.engines.EngineBuffers` (distinct random blocks of caches twice as
large as a swap), with one :class:`BlockSwapper` whose ``max_blocks`` is the
largest count.

Per case: the op and ``cap = op.captured(n)``; ``n`` random rows written
into ``cap.rows`` and ``n`` into ``cap.count`` once, outside the graph (the
eager op gets a copy of the same rows on the GPU); one graph holding
``cap.launch`` alone, captured on a non-blocking stream.  Each figure is
the device time, between two CUDA events recorded on that stream, of
``replays`` graph launches (or eager ``op(rows, stream=...)`` calls) back to
back, divided by ``replays``: no host work per replay, nothing synchronized
inside a batch.  After one untimed batch of each, the two batches take turns
over 3 rounds and each keeps its fastest round (:func:`best_in_turns`).
The events time the GPU's clock, so where the host enqueues eager calls
more slowly than the GPU copies them, the gaps count in the eager figure.

Checks, once per case after the timing: the destination poisoned, one
replay, the destination rows compared bit for bit with the source rows on
host copies (NumPy), and no failure reported by ``cap.failures()`` (read
once, after every replay of the case); the same for one eager call.

A captured swap keeps its op, and so the op's arrays, for the life of the
process: every shape's caches stay allocated until the run ends.  The
table, the summary and the comparison are tested on the CPU
(tests/test_captured_bench.py).
"""

from __future__ import annotations

import numpy as np

from . import engines

__all__ = [
    "SHAPE_KEYS",
    "COUNTS",
    "REPLAYS",
    "ROUNDS",
    "WITHIN",
    "SUMMARY_MIN_N",
    "legend_lines",
    "table_head",
    "table_line",
    "skip_line",
    "summary",
    "summary_line",
    "best_in_turns",
    "rows_match",
    "run_captured",
]

SHAPE_KEYS = ("vllm", "mla", "2m")
COUNTS = (16, 256)
REPLAYS = 200  # graph launches (or eager calls) per timed batch
ROUNDS = 3
WITHIN = 0.05  # the summary's bound: replay / eager <= 1 + WITHIN
SUMMARY_MIN_N = 16


def _shape(key: str) -> engines.EngineShape:
    return next(s for s in engines.SHAPES if s.key == key)


def legend_lines(replays: int = REPLAYS) -> list[str]:
    """What the table shows."""
    lines = ["shapes:"]
    lines += [f"  {_shape(k).label():<16} {_shape(k).text}" for k in SHAPE_KEYS]
    lines += [
        f"columns: device µs per swap, from CUDA events around {replays} launches back to back "
        f"(fastest of {ROUNDS} rounds, the two taking turns); ! = bytes did not match or a replay failed",
        "  replay        one launch of a CUDA graph holding cap.launch() (PreparedSwap.captured)",
        "  eager         the prepared op called with its rows on the GPU (bench --engines' GPU rows)",
        "  replay/eager  the ratio of the two",
    ]
    return lines


def table_head() -> str:
    return f"{'shape':<17} {'n':>5} {'dir':>3} {'replay µs':>10}  {'eager µs':>10}  {'replay/eager':>12}"


def table_line(r: dict) -> str:
    """One row of the table: ``!`` after a figure whose check failed."""
    shape = next((s for s in engines.SHAPES if s.key == r["shape"]), None)
    label = shape.label() if shape else r["shape"]
    replay = f"{r['replay_us']:10.1f}{' ' if r['replay_ok'] else '!'}"
    eager = f"{r['eager_us']:10.1f}{' ' if r['eager_ok'] else '!'}"
    return f"{label:<17} {r['num_blocks']:>5} {r['direction']:>3} {replay} {eager} {r['ratio']:12.3f}"


def skip_line(shape: engines.EngineShape, n: int, why: str) -> str:
    return f"{shape.label():<17} {n:>5}  left out: {why}"


def summary(rows: list, within: float = WITHIN, min_n: int = SUMMARY_MIN_N) -> tuple[int, int]:
    """``(x, y)``: of the ``y`` rows of at least ``min_n`` blocks, the ``x``
    whose replay matched bit for bit and took at most ``1 + within`` times
    the eager call's device time."""
    at = [r for r in rows if r["num_blocks"] >= min_n]
    return sum(bool(r["replay_ok"]) and r["ratio"] <= 1 + within for r in at), len(at)


def summary_line(rows: list) -> str:
    x, y = summary(rows)
    return (
        f"replay within {WITHIN * 100:g} % of eager (replay/eager <= {1 + WITHIN:g}, bytes matched) "
        f"in {x} of {y} rows at n >= {SUMMARY_MIN_N}"
    )


def best_in_turns(batches: dict, rounds: int = ROUNDS) -> dict:
    """The fastest of ``rounds`` figures of each of ``batches`` (name -> fn
    returning a figure), the batches taking turns in every round."""
    best = dict.fromkeys(batches, float("inf"))
    for _ in range(rounds):
        for name, batch in batches.items():
            best[name] = min(best[name], batch())
    return best


def _host_rows(part, index: np.ndarray) -> np.ndarray:
    """Rows ``index`` of a part, as a NumPy copy (a CuPy part is gathered on the GPU first)."""
    if isinstance(part, np.ndarray):
        return part[index]
    import cupy

    return cupy.asnumpy(part[cupy.asarray(index)])


def rows_match(src_parts, dst_parts, mapping: np.ndarray) -> bool:
    """Every destination row ``mapping[:, 1]`` equals its source row
    ``mapping[:, 0]``, bit for bit, in every part (compared with NumPy)."""
    s, d = mapping[:, 0], mapping[:, 1]
    return all(np.array_equal(_host_rows(sp, s), _host_rows(dp, d)) for sp, dp in zip(src_parts, dst_parts))


def _device_s(batch, stream) -> float:
    """Seconds of GPU time between events recorded on ``stream`` around ``batch()``."""
    import cupy

    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    start.record(stream)
    batch()
    end.record(stream)
    end.synchronize()
    return cupy.cuda.get_elapsed_time(start, end) * 1e-3


def _capture(cap, stream):
    """A CUDA graph holding one ``cap.launch`` on ``stream``."""
    stream.begin_capture()
    try:
        cap.launch(stream)
    finally:
        graph = stream.end_capture()
    return graph


def _measure(h, bufs, direction: str, op, cap, mapping: np.ndarray, replays: int) -> dict:
    """Time and check one case (see the module docstring)."""
    stream, n = h.stream, len(mapping)
    with stream:
        cap.rows[:n].set(mapping)
        cap.count.fill(n)
        rows = cap.rows[:n].copy()
    stream.synchronize()
    graph = _capture(cap, stream)
    once = {"replay": lambda: graph.launch(stream), "eager": lambda: op(rows, stream=stream)}

    def batch(name):
        call = once[name]

        def run():
            for _ in range(replays):
                call()

        return lambda: _device_s(run, stream) / replays

    batches = {name: batch(name) for name in once}
    for fn in batches.values():  # warm-up: the graph uploaded
        fn()
    h.settle()
    best = best_in_turns(batches)
    ok = {}
    for name, call in once.items():
        bufs.poison(direction)
        call()
        stream.synchronize()
        ok[name] = rows_match(*bufs.sides(direction), mapping)
    failures = [f"{type(e).__name__}: {e}" for e in cap.failures()]
    return {
        "replay_us": best["replay"] * 1e6,
        "eager_us": best["eager"] * 1e6,
        "ratio": best["replay"] / best["eager"],
        "replay_ok": ok["replay"] and not failures,
        "eager_ok": ok["eager"],
        "replay_failures": failures,
    }


def run_captured(
    counts=COUNTS,
    directions=("in", "out"),
    *,
    replays: int = REPLAYS,
    seed: int = 0,
    on_row=None,
    on_skip=None,
) -> list:
    """Measure every shape of :data:`SHAPE_KEYS` x direction x count that
    fits in memory, on the GPU.

    Parameters
    ----------
    counts : sequence of int
        Blocks per swap.
    directions : sequence of str
        ``"in"`` (host -> GPU) and/or ``"out"``.
    replays : int
        Graph launches (or eager calls) per timed batch.
    seed : int
        Seeds the data and the rows.
    on_row : callable, optional
        Called with each finished row (to print it, or store it at once).
    on_skip : callable, optional
        Called with ``(shape, count, reason)`` for a case left out.

    Returns
    -------
    list of dict
        One per case: ``shape, parts, block_bytes, num_blocks, direction,
        bytes, replays, replay_us, eager_us, ratio`` (replay / eager),
        ``replay_ok`` (bytes matched and no replay failed), ``eager_ok``,
        ``replay_failures`` (the text of each failure ``cap.failures()``
        returned).
    """
    from .bench import random_mapping

    rng = np.random.default_rng(seed)
    h = engines.Harness(max(counts))
    rows = []
    for key in SHAPE_KEYS:
        shape = _shape(key)
        h.settle()
        fit = engines.counts_that_fit(shape, counts, *h.free_memory())
        for n in sorted(set(counts) - set(fit)):
            if on_skip:
                gpu, host = engines.footprint(shape, n)
                on_skip(shape, n, f"needs {gpu / 1e9:.1f} GB of GPU and {host / 1e9:.1f} GB of pinned memory")
        if not fit:
            continue
        bufs = h.buffers(shape, max(fit))
        for di, direction in enumerate(directions):
            bufs.fill(seed * 100 + SHAPE_KEYS.index(key) * 10 + di)
            for n in fit:
                op = h.swapper.prepare(*bufs.sides(direction))
                try:
                    cap = op.captured(n)
                except ValueError as e:  # this op or count cannot be captured: say why, go on
                    if on_skip:
                        on_skip(shape, n, str(e))
                    continue
                mapping = random_mapping(n, bufs.blocks, bufs.blocks, rng)
                row = {
                    "shape": key,
                    "parts": shape.parts,
                    "block_bytes": shape.block_bytes,
                    "num_blocks": n,
                    "direction": direction,
                    "bytes": shape.case_bytes(n),
                    "replays": replays,
                }
                row.update(_measure(h, bufs, direction, op, cap, mapping, replays))
                rows.append(row)
                if on_row:
                    on_row(row)
        del bufs
    return rows
