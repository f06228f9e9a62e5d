"""``bench --engines``: swaps shaped as inference engines make them, against
the patterns those engines use today, on the same buffers, in one run.

Shapes (:data:`SHAPES`): a vLLM cache of Llama-3-8B (64 parts of 32 KiB: 32
layers x K/V, 16 tokens x 8 KV heads x 128 dims x bf16), once with one host
array per part (as vLLM allocates them) and once with the host parts as views
of one block-first pool; an MLA cache of DeepSeek-V3 (61 parts of 72 KiB: 64
tokens x 576 x bf16); and one part of 2 MiB blocks (a host pool that folds
every layer of a block into one row, as SGLang's and FlashInfer's do).

Contenders (:data:`CONTENDERS`), each timed on the same mapping and stream
and checked bit-exactly afterwards:

* **PR per part**: the pull request's kernel (one CTA of 1024 threads per
  block, 8-byte words) as vLLM V0 called it: the mapping written into a
  pinned buffer allocated once and copied to the GPU by one
  ``cudaMemcpyAsync``, then one launch per part (two per layer);
* **V1 pattern**: vLLM V1's CPU offload: a (src, dst, size) pointer per
  block and part computed in NumPy on the host at every call
  (:func:`pointer_lists`), then one ``cuMemcpyBatchAsync``;
* cupy_swap's ``swap()`` on the lists of parts, a prepared op, and the
  prepared op given its rows on the GPU.

The memcpy ceiling is one contiguous ``cudaMemcpyAsync`` of the same bytes.
Figures: blocking GB/s (submit + synchronize) and host µs per call (submit
alone) of every contender, the calls taking turns over rounds
(:func:`time_in_turns`).  Everything but the measuring is NumPy and is
tested on the CPU (tests/test_engines.py).

The adapters' rows are :mod:`.engine_adapters`'.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import numpy as np

__all__ = [
    "EngineShape",
    "SHAPES",
    "SHAPE_KEYS",
    "ENGINE_COUNTS",
    "CONTENDERS",
    "ENGINE_PATTERNS",
    "OURS",
    "COLUMNS",
    "LABELS",
    "footprint",
    "counts_that_fit",
    "pointer_lists",
    "reps_for",
    "time_in_turns",
    "finish_row",
    "summary",
    "headline",
    "table_head",
    "table_line",
    "legend_lines",
    "markdown_table",
    "results_page",
    "run_engines",
]

KIB, MIB = 1 << 10, 1 << 20


@dataclass(frozen=True)
class EngineShape:
    """One engine's cache geometry.

    Attributes
    ----------
    key : str
        Its name in tables and JSON.
    parts : int
        Arrays per side (layers x K/V, or layers).
    block_bytes : int
        Bytes per block per part.
    host : str
        ``"separate"`` (one pinned array per part) or ``"pool"`` (the host
        parts are views ``pool[:, p]`` of one block-first pinned pool).
    text : str
        Which engine keeps its cache this way.
    """

    key: str
    parts: int
    block_bytes: int
    host: str
    text: str

    def label(self) -> str:
        size = (
            f"{self.block_bytes // MIB} MiB" if self.block_bytes >= MIB else f"{self.block_bytes // KIB} KiB"
        )
        pool = ", pool" if self.host == "pool" else ""
        return f"{self.parts} x {size}{pool}"

    def case_bytes(self, n: int) -> int:
        return n * self.parts * self.block_bytes


SHAPES = (
    EngineShape(
        "vllm",
        64,
        32 * KIB,
        "separate",
        "vLLM, Llama-3-8B: 32 layers x K/V of 16 tokens x 8 KV heads x 128 dims x bf16; one host array per part",
    ),
    EngineShape(
        "vllm-pool",
        64,
        32 * KIB,
        "pool",
        "the same 64 parts, host parts as views of one block-first pinned pool [blocks, 64, 32 KiB]",
    ),
    EngineShape("mla", 61, 72 * KIB, "separate", "MLA, DeepSeek-V3: 61 layers of 64 tokens x 576 x bf16"),
    EngineShape(
        "2m",
        1,
        2 * MIB,
        "separate",
        "one part of 2 MiB blocks: a host pool with every layer of a block in one row (SGLang, FlashInfer)",
    ),
)
SHAPE_KEYS = tuple(s.key for s in SHAPES)
ENGINE_COUNTS = (1, 16, 256, 1250)

CONTENDERS = ("pr_per_part", "v1_pattern", "swap", "prepared", "prepared_gpu_rows")
ENGINE_PATTERNS = ("pr_per_part", "v1_pattern")
OURS = ("swap", "prepared", "prepared_gpu_rows")
COLUMNS = {
    "pr_per_part": "PR per part",
    "v1_pattern": "V1 pattern",
    "swap": "swap()",
    "prepared": "prepared",
    "prepared_gpu_rows": "GPU rows",
}
LABELS = {
    "pr_per_part": "PR per part: the pull request's kernel as vLLM V0 called it (mapping via a pinned "
    "buffer + one memcpy, one launch per part)",
    "v1_pattern": "V1 pattern: vLLM V1's CPU offload (a pointer per block and part computed in NumPy "
    "each call, one cuMemcpyBatchAsync)",
    "swap": "cupy_swap swap() on the lists of parts",
    "prepared": "cupy_swap prepared op",
    "prepared_gpu_rows": "cupy_swap prepared op, rows on the GPU",
}
POISON = 0xA5
SPARE = 2  # each cache holds SPARE x the largest count's blocks, so random blocks are scattered

# The pull request's kernel with a stride between blocks (for host parts that
# are views of a block-first pool; with contiguous parts it is the same loop).
STRIDED_KERNEL_SOURCE = r"""
extern "C" __global__ void __launch_bounds__(1024)
seed_swap_blocks_strided(const long long* __restrict__ src, long long* __restrict__ dst,
                         const long long* __restrict__ mapping, long long words_per_block,
                         long long src_stride_words, long long dst_stride_words) {
    const long long s = mapping[2 * blockIdx.x];
    const long long d = mapping[2 * blockIdx.x + 1];
    const long long* from = src + s * src_stride_words;
    long long* to = dst + d * dst_stride_words;
    for (long long i = threadIdx.x; i < words_per_block; i += blockDim.x) {
        to[i] = from[i];
    }
}
"""

# splitmix64 of (seed, index): random bytes made on the GPU, different in every block.
_FILL_BODY = """
unsigned long long z = seed + (unsigned long long)i * 0x9E3779B97F4A7C15ull;
z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
out = z ^ (z >> 31);
"""


def footprint(shape: EngineShape, n: int) -> tuple[int, int]:
    """(GPU bytes, pinned host bytes) that measuring ``shape`` up to ``n``
    blocks allocates: the caches (``SPARE * n`` blocks a side), a GPU mirror
    of the host cache (for the checks), one contiguous range each side for
    the ceiling, and room for the checks' gathers."""
    cache = max(SPARE * n, n + 1) * shape.parts * shape.block_bytes
    flat = shape.case_bytes(n)
    check = 2 * n * shape.block_bytes
    return 2 * cache + flat + check, cache + flat


def counts_that_fit(shape: EngineShape, counts, gpu_free: int, host_free: int, margin: float = 0.8) -> list:
    """The counts of ``counts`` whose :func:`footprint` fits in ``margin`` of
    the free GPU and host memory (the largest one decides what is allocated)."""
    out = []
    for n in sorted(counts):
        gpu, host = footprint(shape, n)
        if gpu <= margin * gpu_free and host <= margin * host_free:
            out.append(n)
    return out


def pointer_lists(src_bases, src_strides, dst_bases, dst_strides, mapping, block_bytes: int):
    """The V1 pattern's per-call work: one (dst, src, size) per part and row.

    Parameters
    ----------
    src_bases, dst_bases : sequence of int
        Address of block 0 of each part.
    src_strides, dst_strides : sequence of int
        Bytes between blocks of each part.
    mapping : numpy.ndarray of shape (n, 2), integers
    block_bytes : int

    Returns
    -------
    tuple of numpy.ndarray
        ``dsts, srcs, sizes``, uint64, part-major (part 0's rows first).
    """
    m = np.asarray(mapping, dtype=np.int64).reshape(-1, 2).astype(np.uint64)
    s, d = m[:, 0], m[:, 1]
    srcs = (
        np.asarray(src_bases, np.uint64)[:, None] + np.asarray(src_strides, np.uint64)[:, None] * s
    ).ravel()
    dsts = (
        np.asarray(dst_bases, np.uint64)[:, None] + np.asarray(dst_strides, np.uint64)[:, None] * d
    ).ravel()
    return dsts, srcs, np.full(srcs.size, block_bytes, dtype=np.uint64)


def pr_launch_args(src_bases, src_strides, dst_bases, dst_strides, block_bytes: int) -> list:
    """One launch of the pull request's kernel per part: ``(src base, dst
    base, src stride, dst stride)``, the strides in 8-byte words, or both
    None where both sides' blocks lie back to back (the kernel as the pull
    request wrote it; else its strided form, :data:`STRIDED_KERNEL_SOURCE`)."""
    out = []
    for sb, ss, db, ds in zip(src_bases, src_strides, dst_bases, dst_strides):
        if ss == ds == block_bytes:
            out.append((sb, db, None, None))
        else:
            out.append((sb, db, ss // 8, ds // 8))
    return out


def reps_for(total_bytes: int, reps: int) -> int:
    """Timed calls per contender: ``reps``, fewer for swaps of hundreds of MB."""
    if total_bytes > (1 << 30):
        return min(reps, 6)
    if total_bytes > (1 << 28):
        return min(reps, 12)
    return reps


def time_in_turns(calls: dict, synchronize, reps: int, rounds: int = 3, warmup: int = 2, clock=None) -> dict:
    """Blocking seconds (submit + ``synchronize()``) and host seconds (submit
    alone) per call of each of ``calls`` (name -> fn).  The calls take turns
    over ``rounds`` rounds of ``max(reps // rounds, 2)`` calls each; each
    figure is the call's fastest round median, so a slow spell of the host
    that hits one round decides no call's figure.  ``synchronize``: one
    callable for every call, or name -> callable (each call's own wait: an
    engine's worker waits for its own results).

    Returns
    -------
    dict
        name -> ``(blocking_s, host_s)``.
    """
    clock = clock or time.perf_counter
    wait = synchronize if isinstance(synchronize, dict) else dict.fromkeys(calls, synchronize)
    for name, fn in calls.items():
        for _ in range(warmup):
            fn()
        wait[name]()
    best = {name: (float("inf"), float("inf")) for name in calls}
    k = max(reps // rounds, 2)
    for _ in range(rounds):
        for name, fn in calls.items():
            blocking, host = [], []
            for _ in range(k):
                t0 = clock()
                fn()
                t1 = clock()
                wait[name]()
                t2 = clock()
                blocking.append(t2 - t0)
                host.append(t1 - t0)
            b, h = best[name]
            best[name] = (min(b, statistics.median(blocking)), min(h, statistics.median(host)))
    return best


def finish_row(row: dict) -> dict:
    """Add ``lead`` (the fastest contender whose bytes matched),
    ``best_engine`` (the faster engine pattern that matched) and
    ``prepared_ratio`` (prepared over the ceiling) to a measured row."""
    ok = [c for c in CONTENDERS if row.get(c + "_ok") and c in row]
    row["lead"] = max(ok, key=lambda c: row[c]) if ok else None
    engines = [c for c in ENGINE_PATTERNS if c in ok]
    row["best_engine"] = max(engines, key=lambda c: row[c]) if engines else None
    if "prepared" in row and row.get("ceiling_gbps"):
        row["prepared_ratio"] = row["prepared"] / row["ceiling_gbps"]
    return row


def summary(rows: list) -> dict:
    """How prepared fares against the engine patterns over ``rows``.

    Returns
    -------
    dict
        ``rows``; ``prepared_leads`` (rows where prepared is at or above the
        best engine pattern in GB/s); ``max_gain`` (prepared over the best
        engine pattern, at most); ``host_ratio`` (the best engine pattern's
        host time over prepared's: min and max).
    """
    measured = [r for r in rows if r.get("best_engine") and r.get("prepared_ok")]
    gains = [r["prepared"] / r[r["best_engine"]] for r in measured]
    host = [
        r[r["best_engine"] + "_host_us"] / r["prepared_host_us"] for r in measured if r["prepared_host_us"]
    ]
    return {
        "rows": len(measured),
        "prepared_leads": sum(g >= 1.0 for g in gains),
        "max_gain": max(gains, default=float("nan")),
        "host_ratio": (min(host, default=float("nan")), max(host, default=float("nan"))),
    }


def headline(rows: list, shape: str = "vllm", n: int = 16, direction: str = "in") -> str | None:
    """One sentence about one row (by default 16 blocks of a Llama-3-8B cache
    swapped in: the step an engine takes most), or None when the rows lack it."""
    found = [
        r
        for r in rows
        if r.get("shape") == shape and r.get("num_blocks") == n and r.get("direction") == direction
    ]
    if not found or not all(found[0].get(c + "_ok") for c in ("prepared", *ENGINE_PATTERNS)):
        return None
    r = found[0]
    geometry = next(s for s in SHAPES if s.key == shape)
    where = "GPU -> host" if direction == "out" else "host -> GPU"
    others = ", ".join(f"{COLUMNS[c]} {r[c]:.1f} GB/s ({r[c + '_host_us']:.0f} µs)" for c in ENGINE_PATTERNS)
    return (
        f"{n} blocks of a {geometry.parts}-part cache ({geometry.label()} blocks), {where}: "
        f"prepared {r['prepared']:.1f} GB/s with {r['prepared_host_us']:.0f} µs of host time per call "
        f"({r['prepared'] / r['ceiling_gbps']:.2f} of the memcpy ceiling, {r['ceiling_gbps']:.1f}); "
        f"{others}"
    )


def legend_lines() -> list[str]:
    lines = ["shapes:"]
    lines += [f"  {s.label():<16} {s.text}" for s in SHAPES]
    lines.append("columns: GB/s blocking (host µs per call); * = fastest, ! = bytes did not match")
    lines.append(f"  {'memcpy':<14} one contiguous cudaMemcpyAsync of the same bytes (the ceiling)")
    lines += [f"  {COLUMNS[c]:<14} {LABELS[c]}" for c in CONTENDERS]
    return lines


def table_head() -> str:
    cells = " ".join(f"{COLUMNS[c]:>15}" for c in CONTENDERS)
    return f"{'shape':<17} {'n':>5} {'dir':>3} {'memcpy':>7} {cells}  path"


def table_line(r: dict) -> str:
    """One row of the table; a contender the row lacks shows ``-``."""
    shape = next((s for s in SHAPES if s.key == r["shape"]), None)
    label = shape.label() if shape else r["shape"]
    cells = []
    for c in CONTENDERS:
        if c not in r:
            cells.append(f"{'-':>15}")
            continue
        mark = "!" if not r.get(c + "_ok", True) else ("*" if r.get("lead") == c else " ")
        cells.append(f"{r[c]:6.1f} ({r.get(c + '_host_us', float('nan')):5.0f}){mark}".rjust(15))
    paths = r.get("paths") or {}
    return (
        f"{label:<17} {r['num_blocks']:>5} {r['direction']:>3} {r['ceiling_gbps']:7.1f} "
        + " ".join(cells)
        + f"  {paths.get('prepared', '-')}"
    )


MARKDOWN_ORDER = ("pr_per_part", "v1_pattern", "prepared", "prepared_gpu_rows", "swap")


def markdown_table(rows: list, keep=None) -> list[str]:
    """A Markdown table of ``rows`` (those ``keep(row)`` accepts): GB/s with
    host µs per call in brackets; bold: the row's fastest contender whose
    bytes matched; ``!``: bytes that did not match; ``-``: not measured."""
    head = ["cache", "blocks", "direction", "memcpy", *(COLUMNS[c] for c in MARKDOWN_ORDER)]
    head[head.index("GPU rows")] = "prepared, GPU rows"
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    shapes = {sh.key: sh for sh in SHAPES}
    for r in rows:
        if keep is not None and not keep(r):
            continue
        shape = shapes.get(r["shape"])
        cells = [
            f"{shape.label() if shape else r['shape']}",
            str(r["num_blocks"]),
            "host -> GPU" if r["direction"] == "in" else "GPU -> host",
            f"{r['ceiling_gbps']:.1f}",
        ]
        for c in MARKDOWN_ORDER:
            if c not in r:
                cells.append("-")
                continue
            text = f"{r[c]:.1f} ({r.get(c + '_host_us', float('nan')):.0f})"
            if not r.get(c + "_ok", True):
                text += " !"
            elif r.get("lead") == c:
                text = f"**{text}**"
            cells.append(text)
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def findings(rows: list) -> list[str]:
    """The summary sentence, the headline and the table of an engines run."""
    s = summary(rows)
    low, high = s["host_ratio"]
    lines = []
    if s["rows"]:
        lines += [
            f"Prepared is at or above the best engine pattern in {s['prepared_leads']} of {s['rows']} rows, "
            f"by up to {s['max_gain']:.2f}x in GB/s; the best engine pattern's host time is {low:.1f}-{high:.1f}x "
            "prepared's.",
            "",
        ]
    line = headline(rows)
    if line:
        lines += [f"Headline: {line}.", ""]
    return lines + markdown_table(rows)


def method_lines() -> list[str]:
    """How an engines run measures, its shapes and contenders (Markdown)."""
    return [
        "Blocking GB/s (1e9 B/s; submit + synchronize), with host µs per call (submit alone) in",
        "brackets: each the fastest round median of 3 rounds in which the calls take turns. Random",
        "distinct blocks; every contender's bytes checked bit for bit after its timing (every mapped",
        "block equal to its source, every other destination block untouched); `!`: a mismatch; bold:",
        "the row's fastest. Shapes:",
        "",
        *[f"- `{sh.label()}`: {sh.text}" for sh in SHAPES],
        "",
        "Contenders:",
        "",
        "- memcpy: one contiguous `cudaMemcpyAsync` of the same bytes (the ceiling);",
        *[f"- {LABELS[c]}" for c in MARKDOWN_ORDER],
        "",
    ]


def results_page(report: dict, commit: str, command: str, extra: list | None = None) -> list[str]:
    """The Markdown page of one stored ``bench --engines --json`` run: what
    was measured, on what, by which command at which commit, the summary,
    the headline and every row; then ``extra`` lines (the adapters' section:
    :func:`.engine_adapters.adapter_findings`)."""
    lines = [
        "# bench --engines",
        "",
        f"One run on the device at commit {commit}: `{command}`. Machine:",
        "",
        *[f"- {line}" for line in report.get("environment", [])],
        "",
        *method_lines(),
        *findings(report.get("engines") or []),
        "",
        "![GB/s of engine-shaped swaps](engines_chart.png)",
    ]
    return lines + (extra or [])


# ---------------------------------------------------------------- on the GPU


def _fill(array, seed: int) -> None:
    """Random bytes in a contiguous CuPy array (splitmix64 of seed and index)."""
    import cupy

    kernel = _fill_kernel()
    kernel(np.uint64(seed), array.view(cupy.uint64).reshape(-1))


_FILL_KERNEL = None


def _fill_kernel():
    global _FILL_KERNEL
    if _FILL_KERNEL is None:
        import cupy

        _FILL_KERNEL = cupy.ElementwiseKernel("uint64 seed", "uint64 out", _FILL_BODY, "cupy_swap_bench_fill")
    return _FILL_KERNEL


class EngineBuffers:
    """One shape's caches, sized for ``n_max`` blocks a swap: GPU parts, the
    host cache (separate arrays or one pool), a GPU mirror of the host cache
    (the reference for swap-ins, the landing place of swap-outs' checks) and
    one contiguous range a side for the ceiling."""

    def __init__(self, shape: EngineShape, n_max: int):
        import cupy

        from ..cuda import memory

        self.shape = shape
        P, B = shape.parts, shape.block_bytes
        self.blocks = blocks = max(SPARE * n_max, n_max + 1)
        self.gpu_parts = [cupy.empty((blocks, B), cupy.uint8) for _ in range(P)]
        if shape.host == "pool":
            self.host_arrays = [memory.empty_pinned((blocks, P, B), np.uint8)]
            self.mirror_arrays = [cupy.empty((blocks, P, B), cupy.uint8)]
            self.host_parts = [self.host_arrays[0][:, p] for p in range(P)]
            self.mirror_parts = [self.mirror_arrays[0][:, p] for p in range(P)]
        else:
            self.host_arrays = [memory.empty_pinned((blocks, B), np.uint8) for _ in range(P)]
            self.mirror_arrays = [cupy.empty((blocks, B), cupy.uint8) for _ in range(P)]
            self.host_parts, self.mirror_parts = self.host_arrays, self.mirror_arrays
        nbytes = shape.case_bytes(n_max)
        self.flat_host = memory.empty_pinned((nbytes,), np.uint8)
        self.flat_gpu = cupy.empty((nbytes,), cupy.uint8)

    def _copy(self, to_host: bool) -> None:
        from cupy.cuda import runtime

        for h, g in zip(self.host_arrays, self.mirror_arrays):
            if to_host:
                runtime.memcpy(h.ctypes.data, g.data.ptr, h.nbytes, runtime.memcpyDeviceToHost)
            else:
                runtime.memcpy(g.data.ptr, h.ctypes.data, h.nbytes, runtime.memcpyHostToDevice)

    def fill(self, seed: int) -> None:
        """Random data in every block of both caches."""
        import cupy

        for i, g in enumerate(self.gpu_parts + self.mirror_arrays):
            _fill(g, seed * 1000 + i)
        cupy.cuda.Device().synchronize()
        self._copy(to_host=True)

    def sides(self, direction: str):
        """(source parts, destination parts) of ``direction``."""
        return (self.host_parts, self.gpu_parts) if direction == "in" else (self.gpu_parts, self.host_parts)

    def poison(self, direction: str) -> None:
        """Every destination byte set to :data:`POISON`."""
        import cupy

        if direction == "in":
            for g in self.gpu_parts:
                g.fill(POISON)
        else:
            for g in self.mirror_arrays:
                g.fill(POISON)
            cupy.cuda.Device().synchronize()
            self._copy(to_host=True)
        cupy.cuda.Device().synchronize()

    def verify(self, direction: str, mapping: np.ndarray) -> bool:
        """Every mapped destination block equals its source block, and every
        other destination block still holds :data:`POISON` (after :meth:`poison`
        and one swap).  Compared on the GPU; a swap-out's host cache is copied
        to the mirror first (the swap-ins' reference is refilled by
        :meth:`fill` before the next swap-in)."""
        import cupy

        if direction == "in":
            src, dst = self.mirror_parts, self.gpu_parts
        else:
            self._copy(to_host=False)
            src, dst = self.gpu_parts, self.mirror_parts
        s, d = cupy.asarray(mapping[:, 0]), cupy.asarray(mapping[:, 1])
        untouched = np.setdiff1d(np.arange(self.blocks), mapping[:, 1])
        rest = cupy.asarray(untouched) if untouched.size else None
        for sp, dp in zip(src, dst):
            if not bool(cupy.array_equal(dp[d], sp[s])):
                return False
            if rest is not None and not bool((dp[rest] == POISON).all()):
                return False
        return True


def _host_alias(array) -> int:
    from ..cuda import memory

    alias = memory.host_alias(array.ctypes.data, array.nbytes)
    if not alias:
        raise ValueError("engines: expected mapped pinned host memory (the pull request's kernel needs it)")
    return alias


class _Kernels:
    """The pull request's kernel (contiguous parts) and its strided form, compiled once."""

    def __init__(self):
        import cupy

        from .peers import SEED_KERNEL_SOURCE

        self.plain = cupy.RawKernel(SEED_KERNEL_SOURCE, "seed_swap_blocks")
        self.strided = cupy.RawKernel(STRIDED_KERNEL_SOURCE, "seed_swap_blocks_strided")


def _part_addresses(bufs: EngineBuffers, direction: str, device: bool):
    """(src bases, src strides, dst bases, dst strides) of every part;
    host parts by their device alias when ``device``, else by address."""
    src, dst = bufs.sides(direction)
    offsets = {id(a): _host_alias(a) - a.ctypes.data for a in bufs.host_arrays} if device else {}

    def base(part):
        if isinstance(part, np.ndarray):
            return part.ctypes.data + offsets.get(id(_owner(bufs, part)), 0)
        return part.data.ptr

    return (
        [base(p) for p in src],
        [p.strides[0] for p in src],
        [base(p) for p in dst],
        [p.strides[0] for p in dst],
    )


def _owner(bufs: EngineBuffers, part):
    """The host array of ``bufs`` that holds ``part``."""
    for a in bufs.host_arrays:
        start = a.ctypes.data
        if start <= part.ctypes.data < start + a.nbytes:
            return a
    raise ValueError("engines: a host part outside the host cache")


def contender_calls(
    bufs: EngineBuffers, direction: str, mapping: np.ndarray, stream, swapper, kernels
) -> dict:
    """``name -> fn`` enqueueing one swap of ``mapping`` on ``stream`` per
    contender, and ``"memcpy"``, the ceiling."""
    import cupy
    import cupyx
    from cupy.cuda import runtime

    from ..cuda.copy_engine import DmaCopier

    shape, n = bufs.shape, len(mapping)
    src_parts, dst_parts = bufs.sides(direction)
    kind = runtime.memcpyHostToDevice if direction == "in" else runtime.memcpyDeviceToHost
    total = shape.case_bytes(n)
    if direction == "in":
        ceiling_args = (bufs.flat_gpu.data.ptr, bufs.flat_host.ctypes.data, total, kind)
    else:
        ceiling_args = (bufs.flat_host.ctypes.data, bufs.flat_gpu.data.ptr, total, kind)

    def memcpy():
        runtime.memcpyAsync(*ceiling_args, stream.ptr)

    # PR per part: the pinned mapping and its device copy, allocated once; one launch per part.
    pinned = cupyx.empty_pinned((max(n, 1), 2), np.int64)
    with stream:
        on_gpu = cupy.empty((max(n, 1), 2), np.int64)
    gate = cupy.cuda.Event(disable_timing=True)
    words = np.int64(shape.block_bytes // 8)
    launches = []
    for s_base, d_base, s_words, d_words in pr_launch_args(
        *_part_addresses(bufs, direction, device=True), shape.block_bytes
    ):
        args = (np.uint64(s_base), np.uint64(d_base), on_gpu, words)
        if s_words is None:
            launches.append((kernels.plain, args))
        else:
            launches.append((kernels.strided, (*args, np.int64(s_words), np.int64(d_words))))
    host_ptr, gpu_ptr = pinned.ctypes.data, on_gpu.data.ptr

    def pr_per_part():
        runtime.eventSynchronize(gate.ptr)  # the previous call's memcpy has read the pinned buffer
        pinned[:n] = mapping
        runtime.memcpyAsync(gpu_ptr, host_ptr, 16 * n, runtime.memcpyHostToDevice, stream.ptr)
        runtime.eventRecord(gate.ptr, stream.ptr)
        with stream:
            for kernel, args in launches:
                kernel((n,), (1024,), args)

    pr_per_part.keep = (pinned, on_gpu, gate)

    # V1 pattern: pointers by raw address (UVA), computed every call, one batch call.
    vsb, vss, vdb, vds = _part_addresses(bufs, direction, device=False)
    copier = DmaCopier()

    def v1_pattern():
        dsts, srcs, sizes = pointer_lists(vsb, vss, vdb, vds, mapping, shape.block_bytes)
        copier.issue(dsts, srcs, sizes, stream.ptr, kind)

    op = swapper.prepare(src_parts, dst_parts)
    with stream:
        rows = cupy.asarray(mapping)
    stream.synchronize()

    def swap():
        swapper.swap(src_parts, dst_parts, mapping, stream=stream)

    def prepared():
        op(mapping, stream=stream)

    def prepared_gpu_rows():
        op(rows, stream=stream)

    calls = {
        "memcpy": memcpy,
        "pr_per_part": pr_per_part,
        "v1_pattern": v1_pattern,
        "swap": swap,
        "prepared": prepared,
        "prepared_gpu_rows": prepared_gpu_rows,
    }
    assert tuple(calls)[1:] == CONTENDERS
    return calls


def _try_each(calls: dict, synchronize) -> dict:
    """Call each contender once; drop from ``calls`` those that raise, and
    return ``name -> error`` for them (a row reports them; the run goes on).
    ``synchronize``: as :func:`time_in_turns` takes it."""
    errors = {}
    wait = synchronize if isinstance(synchronize, dict) else dict.fromkeys(calls, synchronize)
    for name in list(calls):
        try:
            calls[name]()
            wait[name]()
        except Exception as e:  # one contender's refusal must not end the run
            errors[name] = f"{type(e).__name__}: {e}"
            del calls[name]
    return errors


HOST_BYTES_ENV = "CUPY_SWAP_BENCH_HOST_BYTES"  # host memory to assume where MemAvailable reads low


def _free_memory() -> tuple[int, int]:
    """(free GPU bytes, available host bytes): ``MemAvailable``, or
    ``$CUPY_SWAP_BENCH_HOST_BYTES`` where that is set (virtual machines whose
    memory grows as it is used report too little at first)."""
    import os

    import cupy

    gpu_free, _ = cupy.cuda.runtime.memGetInfo()
    if os.environ.get(HOST_BYTES_ENV):
        return gpu_free, int(float(os.environ[HOST_BYTES_ENV]))
    host = 0
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    host = int(line.split()[1]) * 1024
    except OSError:
        host = 1 << 62  # unknown: let the allocation say
    return gpu_free, host


class Harness:
    """What :func:`run_engines` does on the GPU, one method each, so that a
    test can stand in for the GPU and check the run's logic on the CPU."""

    def __init__(self, max_blocks: int):
        import cupy

        from ..swapper import BlockSwapper

        self.kernels = _Kernels()
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self.swapper = BlockSwapper(max_blocks=max(max_blocks, 1))

    def free_memory(self) -> tuple[int, int]:
        return _free_memory()

    def settle(self) -> None:
        from .bench import settle

        settle()

    def buffers(self, shape: EngineShape, n_max: int):
        return EngineBuffers(shape, n_max)

    def calls(self, bufs, direction: str, mapping) -> dict:
        return contender_calls(bufs, direction, mapping, self.stream, self.swapper, self.kernels)

    def synchronize(self) -> None:
        self.stream.synchronize()

    def last_path(self) -> str:
        return self.swapper.last_path


def fitting_buffers(h, shapes, counts, fits, footprint, on_skip):
    """Per shape, ``(shape, buffers for the largest count that fits, the
    counts that fit)``; each count left out (``fits(shape, counts, gpu_free,
    host_free)`` left it out, or the buffers could not be allocated) is told
    to ``on_skip(shape, count, reason)`` instead."""
    for shape in shapes:
        h.settle()
        gpu_free, host_free = h.free_memory()
        fit = fits(shape, counts, gpu_free, host_free)
        for n in sorted(set(counts) - set(fit)):
            if on_skip:
                gpu, host = footprint(shape, n)
                on_skip(shape, n, f"needs {gpu / 1e9:.1f} GB of GPU and {host / 1e9:.1f} GB of pinned memory")
        if not fit:
            continue
        try:
            bufs = h.buffers(shape, max(fit))
        except Exception as e:  # out of memory after all: say so, measure the other shapes
            for n in fit:
                if on_skip:
                    on_skip(shape, n, f"could not allocate its caches ({type(e).__name__}: {e})")
            continue
        yield shape, bufs, fit


def run_engines(
    shapes=SHAPE_KEYS,
    counts=ENGINE_COUNTS,
    directions=("in", "out"),
    *,
    reps: int = 30,
    rounds: int = 3,
    seed: int = 0,
    on_row=None,
    on_skip=None,
    harness=None,
) -> list:
    """Measure every shape x direction x count that fits in memory.

    Parameters
    ----------
    on_row : callable, optional
        Called with each finished row (to print it, or store it at once).
    on_skip : callable, optional
        Called with ``(shape, count, reason)`` for a count left out.
    harness : Harness, optional
        The GPU's side of the run (a test's stand-in); made here by default.

    Returns
    -------
    list of dict
        One per case: ``shape, parts, block_bytes, host_layout, num_blocks,
        direction, bytes, ceiling_gbps, ceiling_host_us``; per contender
        ``c``: ``c`` (GB/s), ``c + "_host_us"``, ``c + "_ok"`` (and
        ``c + "_error"`` when it raised); ``paths`` (what each cupy_swap
        contender took), and :func:`finish_row`'s keys.
    """
    from .bench import random_mapping

    rng = np.random.default_rng(seed)
    h = harness or Harness(max(counts))
    rows = []
    picked = [next(s for s in SHAPES if s.key == key) for key in shapes]
    for shape, bufs, fit in fitting_buffers(h, picked, counts, counts_that_fit, footprint, on_skip):
        key = shape.key
        for di, direction in enumerate(directions):
            bufs.fill(seed * 100 + SHAPE_KEYS.index(key) * 10 + di)
            for n in fit:
                mapping = random_mapping(n, bufs.blocks, bufs.blocks, rng)
                calls = h.calls(bufs, direction, mapping)
                errors = _try_each(calls, h.synchronize)
                h.settle()
                timed = time_in_turns(calls, h.synchronize, reps_for(shape.case_bytes(n), reps), rounds)
                row = {
                    "shape": key,
                    "parts": shape.parts,
                    "block_bytes": shape.block_bytes,
                    "host_layout": shape.host,
                    "num_blocks": n,
                    "direction": direction,
                    "bytes": shape.case_bytes(n),
                }
                blocking, host = timed.pop("memcpy", (float("nan"), float("nan")))
                row["ceiling_gbps"] = row["bytes"] / blocking / 1e9
                row["ceiling_host_us"] = host * 1e6
                paths = {}
                for name in CONTENDERS:
                    if name in errors:
                        row[name + "_error"], row[name + "_ok"] = errors[name], False
                        continue
                    blocking, host = timed[name]
                    row[name] = row["bytes"] / blocking / 1e9
                    row[name + "_host_us"] = host * 1e6
                    try:
                        bufs.poison(direction)  # then one call, checked
                        calls[name]()
                        h.synchronize()
                        if name in OURS:
                            paths[name] = h.last_path()
                        row[name + "_ok"] = bufs.verify(direction, mapping)
                    except Exception as e:  # reported in the row: a failed check is not a pass
                        row[name + "_ok"], row[name + "_error"] = False, f"{type(e).__name__}: {e}"
                row["paths"] = paths
                rows.append(finish_row(row))
                if on_row:
                    on_row(row)
                del calls
        del bufs
    return rows
