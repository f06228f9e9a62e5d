"""``bench --engines``' adapter rows (issue 51): the engine adapters of
:mod:`cupy_swap.engines` driven as the engines drive them, each beside the
engine's own way on the same buffers: vLLM's offloading worker (spec
objects in, ``get_finished()`` out) against vLLM's worker pattern
(:class:`VllmWorkerPattern`), and SGLang's kvcacheio functions against
SGLang's kernel (sgl-kernel, or :class:`SglKernelTranscription`), both
called as SGLang's host pool calls them (:class:`SglangPools`); GB/s and
host µs per transfer, every transfer checked bit for bit after its timing.
They need torch with CUDA (the engines hand the adapters torch tensors) and
are left out, with the reason, without it.  Their NumPy parts are tested
on the CPU (tests/test_engines_adapter_rows.py).
"""

from __future__ import annotations

import itertools
import time
import types
from collections import deque
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from .engines import (
    ENGINE_COUNTS,
    KIB,
    POISON,
    SPARE,
    _fill,
    _free_memory,
    _try_each,
    fitting_buffers,
    reps_for,
    time_in_turns,
)

__all__ = [
    "VllmShape",
    "SglangShape",
    "ADAPTER_SHAPES",
    "ADAPTER_KEYS",
    "ADAPTER_ENGINES",
    "ADAPTER_CONTENDERS",
    "adapter_shapes",
    "adapter_footprint",
    "adapter_counts_that_fit",
    "vllm_plan",
    "sglang_plan",
    "sglang_launch",
    "vllm_sub_block_ptrs",
    "vllm_copy_lists",
    "VllmWorkerPattern",
    "SglKernelTranscription",
    "SglangPools",
    "finish_adapter_row",
    "adapter_summary",
    "adapter_goal_lines",
    "adapter_table_head",
    "adapter_table_line",
    "adapter_markdown_table",
    "adapter_findings",
    "run_adapters",
]


def adapter_findings(rows: list) -> list[str]:
    """The adapters' section of a results page: what they are measured
    against, issue 51's goals and the table (nothing without rows)."""
    if not rows:
        return []
    return [
        "## The adapters, driven as the engines drive them",
        "",
        "GB/s per transfer (blocking: submit and the engine's wait), host µs per transfer (the submit) in",
        "brackets; a row's count is GPU blocks (vLLM) or pages of 16 tokens (SGLang). Every transfer of",
        "both contenders checked bit for bit after its timing. Contenders:",
        "",
        *[f"- {ADAPTER_LABELS[c]}" for pair in ADAPTER_CONTENDERS.values() for c in pair],
        "",
        *[f"- {line}" for line in adapter_goal_lines(rows)],
        "",
        *adapter_markdown_table(rows),
        "",
    ]


# ================================================================ the adapters' rows
#
# Issue 51, item 4: the engine adapters of cupy_swap.engines driven as their
# engines drive them, beside what the engines do today, on the same buffers:
#
# * vLLM: cupy_swap's offloading worker (cupy_swap.engines.vllm.make_worker,
#   the worker CupySwapOffloadingSpec.get_worker returns): spec objects in
#   through submit_store / submit_load, results out through get_finished(),
#   against vLLM's own worker pattern (VllmWorkerPattern: a pointer per block
#   and KV cache tensor computed in NumPy, one cuMemcpyBatchAsync per
#   transfer, streams and events from pools, as vLLM's CPU worker does);
# * SGLang: cupy_swap.engines.sglang's kvcacheio functions against SGLang's
#   kernel (sgl-kernel's kvcacheio where it imports, else
#   SglKernelTranscription), both called by the same stand-in of SGLang's host
#   pool (SglangPools.load / .backup) with the arguments the host pool passes.
#
# One row per shape x direction x count: blocking GB/s (submit + the
# engine's wait) and host µs per transfer (the submit alone), and every
# contender checked bit for bit after its timing.

VLLM_GPU_WORKER = (  # the vLLM source the worker pattern transcribes
    "vllm/v1/kv_offload/cpu/gpu_worker.py at 003ffff6b4d753da7b4a53d5fbbec843eb5b4da3 "
    "(SingleDirectionOffloadingHandler.transfer_async, compute_sub_block_ptrs), with vLLM 0.33.0's "
    "handlers and stream waits (an expedited load handler; loads, too, wait for the current stream)"
)
SGL_TRANSFER_CU = (  # the sgl-kernel source the transcription follows (cupy_swap.engines.sglang's too)
    "sgl-kernel/csrc/kvcacheio/transfer.cu at 1243cf3da37cb08cb73faa12db09653eb997d142"
)
SGL_PAGE_TOKENS = 16  # tokens per page of the SGLang rows (a row's count is in pages)


@dataclass(frozen=True)
class VllmShape:
    """A KV cache as vLLM hands it to an offloading worker.

    Attributes
    ----------
    key : str
    tensors : int
        KV cache tensors (one per layer), each int8 pages ``(blocks, page_bytes)``.
    page_bytes : int
    blocks_per_chunk : int
        GPU blocks per CPU chunk (vLLM's ``blocks_per_chunk``).
    first : int
        The transfer's ``block_indices``: its first block's index in its
        request (``first % blocks_per_chunk`` blocks of the first chunk are
        skipped).
    text : str
    """

    key: str
    tensors: int
    page_bytes: int
    blocks_per_chunk: int
    first: int
    text: str

    engine = "vllm"

    @property
    def skip(self) -> int:
        return self.first % self.blocks_per_chunk

    def label(self) -> str:
        chunk = f", {self.blocks_per_chunk}/chunk" if self.blocks_per_chunk > 1 else ""
        return f"{self.tensors} x {self.page_bytes // KIB} KiB{chunk}"

    def case_bytes(self, n: int) -> int:
        return n * self.tensors * self.page_bytes

    def chunks_for(self, n: int) -> int:
        """CPU chunks a transfer of ``n`` blocks names."""
        return -(-(n + self.skip) // self.blocks_per_chunk)


@dataclass(frozen=True)
class SglangShape:
    """A HiCache host pool and its device pool, as SGLang builds them.

    Attributes
    ----------
    key : str
    layout : str
        The host pool's ``layer_first``, ``page_first`` or ``page_head``.
    layers, heads, head_dim : int
        bf16 elements; MLA: one head of ``kv_lora_rank + qk_rope_head_dim``.
    mla : bool
    text : str
    """

    key: str
    layout: str
    layers: int
    heads: int
    head_dim: int
    mla: bool
    text: str

    engine = "sglang"
    page_size = SGL_PAGE_TOKENS

    @property
    def item_bytes(self) -> int:
        """SGLang's ``token_stride_size``: one token of one layer (K or V)."""
        return self.heads * self.head_dim * 2

    @property
    def kv(self) -> int:
        return 1 if self.mla else 2

    def label(self) -> str:
        return f"{'MLA ' if self.mla else ''}{self.layout}"

    def case_bytes(self, n: int) -> int:
        """Bytes of ``n`` pages over every layer (K and V)."""
        return n * self.page_size * self.item_bytes * self.layers * self.kv


VLLM_SHAPES = (
    VllmShape(
        "vllm-llama",
        32,
        64 * KIB,
        1,
        0,
        "vLLM worker, Llama-3-8B: 32 KV cache tensors of 64 KiB int8 pages (K and V of 16 tokens x 8 heads x "
        "128 x bf16; the bytes of 64 parts x 32 KiB), 1 block a CPU chunk",
    ),
    VllmShape(
        "vllm-llama-c4",
        32,
        64 * KIB,
        4,
        1,
        "the same, 4 blocks a chunk, the transfer from block 1 of its first chunk (unaligned first and last chunks)",
    ),
    VllmShape(
        "vllm-mla",
        61,
        72 * KIB,
        1,
        0,
        "vLLM worker, DeepSeek-V3 MLA: 61 tensors of 72 KiB pages (64 tokens x 576 x bf16), 1 block a chunk",
    ),
)
SGLANG_SHAPES = (
    SglangShape(
        "sglang-lf",
        "layer_first",
        32,
        8,
        128,
        False,
        "SGLang HiCache, Llama-3-8B (32 layers, K and V of 8 heads x 128 x bf16 a token), host pool layer_first "
        f"[2, layers, tokens, 8, 128]; {SGL_PAGE_TOKENS}-token pages",
    ),
    SglangShape(
        "sglang-pf",
        "page_first",
        32,
        8,
        128,
        False,
        "the same, host pool page_first [2, tokens, layers, 8, 128]",
    ),
    SglangShape(
        "sglang-ph",
        "page_head",
        32,
        8,
        128,
        False,
        "the same, host pool page_head [2, pages, 8 heads, page tokens, layers, 128]",
    ),
    SglangShape(
        "sglang-mla",
        "layer_first",
        61,
        1,
        576,
        True,
        "SGLang HiCache, DeepSeek-V3 MLA (61 layers of 576 x bf16 a token), host pool layer_first "
        "[layers, tokens, 1, 576]",
    ),
)
ADAPTER_SHAPES = VLLM_SHAPES + SGLANG_SHAPES
ADAPTER_KEYS = tuple(s.key for s in ADAPTER_SHAPES)
ADAPTER_ENGINES = ("vllm", "sglang")
# Per engine: (the engine's own way, cupy_swap's adapter).
ADAPTER_CONTENDERS = {
    "vllm": ("vllm_pattern", "vllm_worker"),
    "sglang": ("sglang_kernel", "sglang_functions"),
}
ADAPTER_LABELS = {
    "vllm_pattern": "vLLM's worker pattern: per transfer a pointer per block and KV cache tensor computed in "
    "NumPy (compute_sub_block_ptrs), streams and timing events from pools, one cuMemcpyBatchAsync",
    "vllm_worker": "cupy_swap's vLLM worker (cupy_swap.engines.vllm): spec objects in through "
    "submit_store / submit_load, results out through get_finished()",
    "sglang_kernel": "SGLang's kernel as its host pool launches it: sgl-kernel's kvcacheio where it imports, "
    f"else a transcription of {SGL_TRANSFER_CU} (a warp per token, 2 x 32 warps of CTAs)",
    "sglang_functions": "cupy_swap's SGLang functions (cupy_swap.engines.sglang), called by the same host "
    "pool calls",
}
ADAPTER_DIRECTIONS = {
    "vllm": {
        "in": "submit_load (CPU chunks -> GPU blocks)",
        "out": "submit_store (GPU blocks -> CPU chunks)",
    },
    "sglang": {
        "in": "load_to_device_per_layer for every layer (one call per layer)",
        "out": "backup_from_device_all_layer (one call)",
    },
}
# The goal of issue 51 for the vLLM rows: (shape, blocks, GB/s ratio, host-time ratio).
VLLM_GOAL = ("vllm-llama", 16, 2.0, 10.0)


def adapter_shapes(engines_asked) -> tuple:
    """The keys of :data:`ADAPTER_SHAPES` of the engines asked for
    (``"vllm"``, ``"sglang"``), in table order."""
    asked = set(engines_asked)
    unknown = asked - set(ADAPTER_ENGINES)
    if unknown:
        raise ValueError(
            f"expected engines among {', '.join(ADAPTER_ENGINES)}, got {', '.join(sorted(unknown))}"
        )
    return tuple(s.key for s in ADAPTER_SHAPES if s.engine in asked)


def _adapter_shape(key: str):
    for s in ADAPTER_SHAPES:
        if s.key == key:
            return s
    raise KeyError(f"no adapter shape {key!r} (expected one of {', '.join(ADAPTER_KEYS)})")


def vllm_sizes(shape: VllmShape, n_max: int) -> tuple[int, int]:
    """(GPU blocks, CPU chunks) of the caches a vLLM shape is measured on up
    to ``n_max`` blocks: :data:`SPARE` times what the largest transfer names."""
    blocks = max(SPARE * n_max, n_max + 1)
    chunks = max(SPARE * shape.chunks_for(n_max), shape.chunks_for(n_max) + 1)
    return blocks, chunks


def adapter_footprint(shape, n: int) -> tuple[int, int]:
    """(GPU bytes, pinned host bytes) that measuring ``shape`` up to ``n``
    blocks (vLLM) or pages (SGLang) allocates: the caches, one contiguous
    range a side for the ceiling, and what the checks hold at once."""
    flat = shape.case_bytes(n)
    if shape.engine == "vllm":
        blocks, chunks = vllm_sizes(shape, n)
        gpu_cache = shape.tensors * blocks * shape.page_bytes
        host_cache = shape.tensors * chunks * shape.blocks_per_chunk * shape.page_bytes
        check = chunks * shape.blocks_per_chunk * shape.page_bytes + 2 * n * shape.page_bytes  # one tensor
        return gpu_cache + flat + check, host_cache + flat
    pages = max(SPARE * n, n + 1)
    pool = pages * shape.page_size * shape.item_bytes * shape.layers * shape.kv  # each side
    check = 2 * pages * shape.page_size * shape.item_bytes  # one layer's tokens, gathered
    return 2 * pool + flat + check, pool + flat  # device pool, the host pool's GPU mirror


def adapter_counts_that_fit(shape, counts, gpu_free: int, host_free: int, margin: float = 0.8) -> list:
    """The counts of ``counts`` whose :func:`adapter_footprint` fits in
    ``margin`` of the free GPU and host memory."""
    out = []
    for n in sorted(counts):
        gpu, host = adapter_footprint(shape, n)
        if gpu <= margin * gpu_free and host <= margin * host_free:
            out.append(n)
    return out


# ------------------------------------------------------------------ plans (NumPy)


class VllmCase(NamedTuple):
    """One vLLM transfer: the specs' fields and the copy they mean.

    ``gpu_ids`` (int32, vLLM's ``GPULoadStoreSpec.block_ids``), ``chunk_ids``
    (int32, the CPU spec's), ``group_sizes``, ``block_indices`` (one group),
    and ``pairs``: ``(gpu block, chunk row)`` per block, a chunk row being
    ``chunk * blocks_per_chunk + position``."""

    gpu_ids: np.ndarray
    chunk_ids: np.ndarray
    group_sizes: tuple
    block_indices: tuple
    pairs: np.ndarray


def vllm_plan(shape: VllmShape, n: int, gpu_blocks: int, num_chunks: int, rng) -> VllmCase:
    """A transfer of ``n`` distinct random GPU blocks to or from distinct
    random chunks, the first block at position ``shape.skip`` of its chunk."""
    need = shape.chunks_for(n)
    if n > gpu_blocks or need > num_chunks:
        raise ValueError(
            f"{n} blocks need {n} GPU blocks and {need} chunks, have {gpu_blocks} and {num_chunks}"
        )
    gpu = rng.choice(gpu_blocks, size=n, replace=False).astype(np.int32)
    chunks = rng.choice(num_chunks, size=need, replace=False).astype(np.int32)
    at = shape.skip + np.arange(n)
    rows = (
        chunks[at // shape.blocks_per_chunk].astype(np.int64) * shape.blocks_per_chunk
        + at % shape.blocks_per_chunk
    )
    return VllmCase(gpu, chunks, (n,), (shape.first,), np.column_stack((gpu.astype(np.int64), rows)))


class SglangCase(NamedTuple):
    """One HiCache transfer of whole pages: token indices (int64) of the
    device pool and of the host pool, and ``pages``: ``(device page, host
    page)`` per page."""

    device_tokens: np.ndarray
    host_tokens: np.ndarray
    pages: np.ndarray


def sglang_plan(
    n: int, device_pages: int, host_pages: int, rng, page_size: int = SGL_PAGE_TOKENS
) -> SglangCase:
    """``n`` distinct random pages a side, as HiCache names them: every
    token of each page, in order."""
    dev = rng.choice(device_pages, size=n, replace=False).astype(np.int64)
    host = rng.choice(host_pages, size=n, replace=False).astype(np.int64)
    step = np.arange(page_size, dtype=np.int64)
    tokens = lambda pages: (pages[:, None] * page_size + step).reshape(-1)  # noqa: E731
    return SglangCase(tokens(dev), tokens(host), np.column_stack((dev, host)))


def sglang_launch(
    num_items: int, block_quota: int = 2, num_warps_per_block: int = 32
) -> tuple[int, int, int]:
    """sgl-kernel's launch of one transfer (``transfer_kv_launcher``):
    ``(items per warp, CTAs, threads per CTA)``; ``(0, 0, threads)`` for no
    item (nothing is launched)."""
    threads = num_warps_per_block * 32
    if num_items <= 0:
        return 0, 0, threads
    per_warp = -(-num_items // (block_quota * num_warps_per_block))
    return per_warp, -(-num_items // (per_warp * num_warps_per_block)), threads


# ------------------------------------------------- vLLM's worker pattern (NumPy part)


def vllm_sub_block_ptrs(
    block_ids, factor: int, out: np.ndarray, base: int, row_stride: int, row_bytes: int, skip=0
):
    """vLLM's ``compute_sub_block_ptrs``: into ``out``, the address of each of
    ``len(out)`` sub-blocks from sub-block ``skip`` of the first of
    ``block_ids`` (``factor`` sub-blocks of ``row_bytes // factor`` bytes a
    block, blocks ``row_stride`` bytes apart from ``base``)."""
    assert skip < factor
    count = len(out)
    if factor == 1:
        out[:] = base + np.asarray(block_ids[:count]).astype(np.int64) * row_stride
        return
    assert row_bytes % factor == 0
    sub = row_bytes // factor
    every = (base + np.asarray(block_ids).astype(np.int64)[:, None] * row_stride) + (
        np.arange(factor, dtype=np.int64) * sub
    )[None, :]
    out[:] = every.ravel()[skip : skip + count]


def vllm_copy_lists(
    src_tensors,
    dst_tensors,
    group_refs,
    src_ids,
    dst_ids,
    group_sizes,
    block_indices,
    src_factor,
    dst_factor,
):
    """vLLM's worker's per-transfer work before its batch copy
    (``transfer_async``): per KV cache group and layer, a source address,
    destination address and size per block.

    Parameters
    ----------
    src_tensors, dst_tensors : lists of 2-D arrays (torch, CuPy or NumPy)
        Per KV cache tensor, its rows (GPU pages or CPU chunks); their
        address, row stride and row bytes are read at every call, as vLLM
        reads them (``tensor.data_ptr()``, ``tensor.stride(0)``).
    group_refs : list of list of (tensor_idx, page_bytes)
    src_ids, dst_ids : arrays of int
        The specs' block ids (GPU blocks or CPU chunks).
    group_sizes, block_indices : sequences of int
        From the GPU spec.
    src_factor, dst_factor : int
        Sub-blocks per source / destination block (1 on the GPU side,
        ``blocks_per_chunk`` on the CPU side).

    Returns
    -------
    tuple
        ``src, dst, sizes`` (int64 arrays, group-major, then layer-major),
        and the bytes moved.
    """
    assert len(group_sizes) == len(group_refs) and len(block_indices) == len(group_refs)
    ops = sum(int(size) * len(refs) for size, refs in zip(group_sizes, group_refs))
    all_src, all_dst, all_sizes = (np.empty(ops, dtype=np.int64) for _ in range(3))
    src_at = dst_at = op = nbytes = 0
    for size, index, refs in zip(group_sizes, block_indices, group_refs):
        size = int(size)
        if size == 0:
            continue
        src_skip, dst_skip = int(index) % src_factor, int(index) % dst_factor
        src_end = src_at + -(-(size + src_skip) // src_factor)
        dst_end = dst_at + -(-(size + dst_skip) // dst_factor)
        assert src_end <= len(src_ids) and dst_end <= len(dst_ids)
        group_src, group_dst = src_ids[src_at:src_end], dst_ids[dst_at:dst_end]
        for tensor_idx, page_bytes in refs:
            end = op + size
            vllm_sub_block_ptrs(
                group_src, src_factor, all_src[op:end], *_geometry(src_tensors[tensor_idx]), skip=src_skip
            )
            vllm_sub_block_ptrs(
                group_dst, dst_factor, all_dst[op:end], *_geometry(dst_tensors[tensor_idx]), skip=dst_skip
            )
            all_sizes[op:end] = page_bytes
            nbytes += size * page_bytes
            op = end
        src_at, dst_at = src_end, dst_end
    assert src_at == len(src_ids) and dst_at == len(dst_ids) and op == ops
    return all_src, all_dst, all_sizes, nbytes


def _geometry(array) -> tuple[int, int, int]:
    """``(base, row_stride, row_bytes)`` of a 2-D torch, CuPy or NumPy array."""
    if hasattr(array, "data_ptr"):  # torch
        size = array.element_size()
        return array.data_ptr(), array.stride(0) * size, array.shape[1] * size
    base = array.data.ptr if hasattr(array.data, "ptr") else array.ctypes.data
    return base, array.strides[0], array.shape[1] * array.itemsize


class _PatternTransfer(NamedTuple):
    job_id: int
    stream: object
    start: object
    end: object
    nbytes: int


class _PatternHandler:
    """One direction of :class:`VllmWorkerPattern` (vLLM's
    ``SingleDirectionOffloadingHandler``): transfers in submission order,
    each on a stream from a pool that first waits for the current stream
    and for the previous transfer's end event (vLLM 0.33.0: loads, too,
    wait for pending writes to their blocks)."""

    def __init__(self, gpu_pages, cpu_chunks, blocks_per_chunk: int, group_refs, gpu_to_cpu: bool, kit):
        self.src, self.dst = (gpu_pages, cpu_chunks) if gpu_to_cpu else (cpu_chunks, gpu_pages)
        self.src_factor = 1 if gpu_to_cpu else blocks_per_chunk
        self.dst_factor = blocks_per_chunk if gpu_to_cpu else 1
        self.refs, self.gpu_to_cpu, self.kit = group_refs, gpu_to_cpu, kit
        self.transfers: deque = deque()
        self.ends: dict = {}
        self.stream_pool: list = []
        self.event_pool: list = []

    def transfer_async(self, job_id: int, spec) -> bool:
        src_spec, dst_spec = spec
        gpu_spec = src_spec if self.gpu_to_cpu else dst_spec
        src, dst, sizes, nbytes = vllm_copy_lists(
            self.src,
            self.dst,
            self.refs,
            np.asarray(src_spec.block_ids),
            np.asarray(dst_spec.block_ids),
            gpu_spec.group_sizes,
            gpu_spec.block_indices,
            self.src_factor,
            self.dst_factor,
        )
        kit = self.kit
        batch = kit.batch(src, dst, sizes)  # vLLM: torch.from_numpy of each
        stream = self.stream_pool.pop() if self.stream_pool else kit.new_stream()
        start = self.event_pool.pop() if self.event_pool else kit.new_event()
        end = self.event_pool.pop() if self.event_pool else kit.new_event()
        stream.wait_stream(kit.current_stream())  # the compute that wrote (or last used) the blocks
        if self.transfers:
            stream.wait_event(self.transfers[-1].end)  # after the previous transfer
        with kit.on(stream):
            start.record(stream)
            if len(sizes):
                kit.copy(batch, self.gpu_to_cpu)  # vLLM: ops.swap_blocks_batch
            end.record(stream)
        self.ends[job_id] = end
        self.transfers.append(_PatternTransfer(job_id, stream, start, end, nbytes))
        return True

    def get_finished(self) -> list:
        out = []
        while self.transfers and self.transfers[0].end.query():
            t = self.transfers.popleft()
            seconds = self.kit.elapsed(t.start, t.end)
            out.append(self._result(t.job_id, t.nbytes, seconds))
            self.stream_pool.append(t.stream)
            self.event_pool += [t.end, t.start]
            del self.ends[t.job_id]
        return out

    def _result(self, job_id, nbytes, seconds):
        from ..engines.offload import TransferResult

        return TransferResult(job_id=job_id, success=True, transfer_size=nbytes, transfer_time=seconds)

    def wait(self, job_ids) -> None:
        for job_id in job_ids:
            end = self.ends.get(job_id)
            if end is not None:
                end.synchronize()


class VllmWorkerPattern:
    """vLLM's CPU offloading worker, transcribed for the bench (no vLLM
    needed): ``submit_store`` / ``submit_load`` / ``get_finished`` / ``wait``
    over three :class:`_PatternHandler` (stores, loads, expedited loads), as
    vLLM's worker serves them (in that order in ``get_finished``; every
    result ``success=True``, as vLLM's).  Followed: :data:`VLLM_GPU_WORKER`.

    ``kit`` does what vLLM does through torch: ``batch(src, dst, sizes)``
    (its CPU tensors of the three arrays), ``copy(batch, gpu_to_cpu)`` (one
    ``swap_blocks_batch`` on the current stream), ``new_stream()``,
    ``new_event()`` (timing), ``current_stream()``, ``on(stream)`` (a
    context making it current), ``elapsed(start, end)`` (seconds); default
    :class:`_TorchKit`."""

    def __init__(self, gpu_pages, cpu_chunks, blocks_per_chunk: int, group_refs, kit=None):
        kit = kit or _TorchKit()
        args = (gpu_pages, cpu_chunks, blocks_per_chunk, group_refs)
        self._store = _PatternHandler(*args, True, kit)
        self._load = _PatternHandler(*args, False, kit)
        self._expedited = _PatternHandler(*args, False, kit)
        self._handlers = (self._store, self._load, self._expedited)

    def submit_store(self, job_id: int, src_spec, dst_spec) -> bool:
        return self._store.transfer_async(job_id, (src_spec, dst_spec))

    def submit_load(self, job_id: int, src_spec, dst_spec, expedited: bool = False) -> bool:
        return (self._expedited if expedited else self._load).transfer_async(job_id, (src_spec, dst_spec))

    def get_finished(self) -> list:
        return [r for handler in self._handlers for r in handler.get_finished()]

    def wait(self, job_ids) -> None:
        for handler in self._handlers:
            handler.wait(job_ids)

    def shutdown(self) -> None:
        for handler in self._handlers:
            for t in handler.transfers:
                t.end.synchronize()
            handler.transfers.clear()


class _TorchKit:
    """:class:`VllmWorkerPattern`'s calls on torch, as vLLM makes them; the
    batch copy through cupy_swap's ``cuMemcpyBatchAsync`` call (the one the
    V1 pattern of :func:`contender_calls` uses)."""

    def __init__(self):
        import torch

        from ..cuda.copy_engine import DmaCopier

        self.torch, self.copier = torch, DmaCopier()

    def batch(self, src, dst, sizes):
        from_numpy = self.torch.from_numpy
        return from_numpy(src), from_numpy(dst), from_numpy(sizes)

    def copy(self, batch, gpu_to_cpu: bool) -> None:
        src, dst, sizes = (t.numpy().view(np.uint64) for t in batch)
        stream = self.torch.cuda.current_stream().cuda_stream
        self.copier.issue(dst, src, sizes, stream, 2 if gpu_to_cpu else 1)

    def new_stream(self):
        return self.torch.cuda.Stream()

    def new_event(self):
        return self.torch.cuda.Event(enable_timing=True)

    def current_stream(self):
        return self.torch.cuda.current_stream()

    def on(self, stream):
        return self.torch.cuda.stream(stream)

    def elapsed(self, start, end) -> float:
        return start.elapsed_time(end) * 1e-3


# -------------------------------------------------- SGLang's kernel, transcribed

# sgl-kernel's transfer kernels (SGL_TRANSFER_CU), written again for NVRTC:
# a warp per item (one token of one layer, K then V), 8-byte words read
# with ld.global.nc and written with st.global.cg; the address modes are
# sgl-kernel's get_global_offset_* functions (0 layer-first base, 1
# page-first base, 2 layer table, 3 page-head base, 4 layer-first base per
# head, 5 layer table per head).  SRC_MODE, DST_MODE and KV (2: K and V,
# 1: MLA) are set when compiling; cs_sgl_items serves the token layouts,
# cs_sgl_heads the page-head ones (a head at a time).
SGL_KERNEL_SOURCE = r"""
#ifndef SRC_MODE
#define SRC_MODE 0
#endif
#ifndef DST_MODE
#define DST_MODE 0
#endif
#ifndef KV
#define KV 2
#endif

template <int MODE>
__device__ __forceinline__ char* cs_at(char* base, const unsigned long long* table, long long layer,
                                       long long dim, long long id, long long item, long long head,
                                       long long heads, long long page_size) {
  if (MODE == 0) return base + layer * dim + id * item;
  if (MODE == 1) return base + id * dim + layer * item;
  if (MODE == 2) return reinterpret_cast<char*>(table[layer]) + id * item;
  if (MODE == 3)
    return base + id / page_size * page_size * dim + dim / heads * head * page_size +
           id % page_size * dim / heads + layer * item / heads;
  if (MODE == 4) return base + layer * dim + id * item + item / heads * head;
  return reinterpret_cast<char*>(table[layer]) + id * item + item / heads * head;
}

__device__ __forceinline__ void cs_warp_copy(int lane, const char* from, char* to, long long bytes) {
  const unsigned long long* s = reinterpret_cast<const unsigned long long*>(from);
  unsigned long long* d = reinterpret_cast<unsigned long long*>(to);
  const int words = (int)(bytes / 8);
#pragma unroll
  for (int j = lane; j < words; j += 32) {
    unsigned long long w;
    asm volatile("ld.global.nc.b64 %0,[%1];" : "=l"(w) : "l"(s + j) : "memory");
    asm volatile("st.global.cg.b64 [%0],%1;" ::"l"(d + j), "l"(w) : "memory");
  }
}

extern "C" __global__ void cs_sgl_items(
    char* src_k, char* dst_k, char* src_v, char* dst_v,
    const long long* __restrict__ src_idx, const long long* __restrict__ dst_idx,
    long long first_layer, long long layers, long long items, long long per_warp, long long item,
    long long src_dim, long long dst_dim,
    const unsigned long long* src_k_tbl, const unsigned long long* dst_k_tbl,
    const unsigned long long* src_v_tbl, const unsigned long long* dst_v_tbl,
    long long page_size, long long heads) {
  const int tid = blockIdx.x * blockDim.x + threadIdx.x;
  const int lane = tid % 32, warp = tid / 32, warps = gridDim.x * blockDim.x / 32;
  for (int i = 0; i < per_warp; ++i) {
    const long long k = (long long)i * warps + warp;
    if (k >= items) break;
    const long long s = src_idx[k], d = dst_idx[k];
    if (s < 0 || d < 0) continue;
    for (long long layer = first_layer; layer < first_layer + layers; ++layer) {
      cs_warp_copy(lane, cs_at<SRC_MODE>(src_k, src_k_tbl, layer, src_dim, s, item, 0, 1, 1),
                   cs_at<DST_MODE>(dst_k, dst_k_tbl, layer, dst_dim, d, item, 0, 1, 1), item);
#if KV == 2
      cs_warp_copy(lane, cs_at<SRC_MODE>(src_v, src_v_tbl, layer, src_dim, s, item, 0, 1, 1),
                   cs_at<DST_MODE>(dst_v, dst_v_tbl, layer, dst_dim, d, item, 0, 1, 1), item);
#endif
    }
  }
}

extern "C" __global__ void cs_sgl_heads(
    char* src_k, char* dst_k, char* src_v, char* dst_v,
    const long long* __restrict__ src_idx, const long long* __restrict__ dst_idx,
    long long first_layer, long long layers, long long items, long long per_warp, long long item,
    long long src_dim, long long dst_dim,
    const unsigned long long* src_k_tbl, const unsigned long long* dst_k_tbl,
    const unsigned long long* src_v_tbl, const unsigned long long* dst_v_tbl,
    long long page_size, long long heads) {
  const int tid = blockIdx.x * blockDim.x + threadIdx.x;
  const int lane = tid % 32, warp = tid / 32;
  const long long head_bytes = item / heads;
  for (int i = 0; i < per_warp; ++i) {
    const long long k = (long long)warp * per_warp + i;
    if (k >= items) break;
    const long long s = src_idx[k], d = dst_idx[k];
    for (long long layer = first_layer; layer < first_layer + layers; ++layer) {
      for (long long h = 0; h < heads; ++h) {
        cs_warp_copy(lane, cs_at<SRC_MODE>(src_k, src_k_tbl, layer, src_dim, s, item, h, heads, page_size),
                     cs_at<DST_MODE>(dst_k, dst_k_tbl, layer, dst_dim, d, item, h, heads, page_size),
                     head_bytes);
        cs_warp_copy(lane, cs_at<SRC_MODE>(src_v, src_v_tbl, layer, src_dim, s, item, h, heads, page_size),
                     cs_at<DST_MODE>(dst_v, dst_v_tbl, layer, dst_dim, d, item, h, heads, page_size),
                     head_bytes);
      }
    }
  }
}
"""

LF, PF, TABLE, PH, HEAD_LF, HEAD_TABLE = range(6)  # SGL_KERNEL_SOURCE's address modes
# Per function: (kernel, source mode, destination mode, KV), as sgl-kernel's transfer.cu binds them.
SGL_FUNCTIONS = {
    "transfer_kv_per_layer": ("cs_sgl_items", LF, LF, 2),
    "transfer_kv_per_layer_pf_lf": ("cs_sgl_items", PF, LF, 2),
    "transfer_kv_per_layer_ph_lf": ("cs_sgl_heads", PH, HEAD_LF, 2),
    "transfer_kv_all_layer": ("cs_sgl_items", TABLE, TABLE, 2),
    "transfer_kv_all_layer_lf_pf": ("cs_sgl_items", TABLE, PF, 2),
    "transfer_kv_all_layer_lf_ph": ("cs_sgl_heads", HEAD_TABLE, PH, 2),
    "transfer_kv_per_layer_mla": ("cs_sgl_items", LF, LF, 1),
    "transfer_kv_all_layer_mla": ("cs_sgl_items", TABLE, TABLE, 1),
}


def sgl_kernel_options(name: str) -> tuple:
    """NVRTC options compiling :data:`SGL_KERNEL_SOURCE` for function ``name``."""
    _, src, dst, kv = SGL_FUNCTIONS[name]
    return (f"-DSRC_MODE={src}", f"-DDST_MODE={dst}", f"-DKV={kv}", "-std=c++17")


class SglKernelTranscription:
    """The kvcacheio functions the host pools call, with sgl-kernel's names
    and arguments, launching :data:`SGL_KERNEL_SOURCE` as sgl-kernel's
    ``transfer_kv_launcher`` launches its kernel (:func:`sglang_launch`,
    torch's current stream, the tensors' addresses as they are: pinned host
    memory by its UVA address).  For the bench only: no checks."""

    source = f"transcription of {SGL_TRANSFER_CU}"

    def __init__(self):
        self._kernels: dict = {}
        self._streams: dict = {}

    def _kernel(self, name: str):
        kernel = self._kernels.get(name)
        if kernel is None:
            import cupy

            kernel = cupy.RawKernel(
                SGL_KERNEL_SOURCE, SGL_FUNCTIONS[name][0], options=sgl_kernel_options(name)
            )
            self._kernels[name] = kernel
        return kernel

    def _stream(self):
        import cupy
        import torch

        handle = torch.cuda.current_stream().cuda_stream
        stream = self._streams.get(handle)
        if stream is None:
            stream = self._streams[handle] = cupy.cuda.ExternalStream(handle)
        return stream

    def _launch(
        self, name, k, v, indices, first, layers, item, dims, tables, quota, warps, page_size=1, heads=1
    ):
        n = indices[0].numel()
        per_warp, ctas, threads = sglang_launch(n, quota, warps)
        if not ctas:
            return
        ptr = lambda t: np.uint64(0 if t is None else t.data_ptr())  # noqa: E731
        args = (
            ptr(k[0]), ptr(k[1]), ptr(v[0]), ptr(v[1]), ptr(indices[0]), ptr(indices[1]),
            np.int64(first), np.int64(layers), np.int64(n), np.int64(per_warp), np.int64(item),
            np.int64(dims[0]), np.int64(dims[1]), *(ptr(t) for t in tables),
            np.int64(page_size), np.int64(heads),
        )  # fmt: skip
        self._kernel(name)((ctas,), (threads,), args, stream=self._stream())

    def transfer_kv_per_layer(
        self,
        src_k,
        dst_k,
        src_v,
        dst_v,
        src_indices,
        dst_indices,
        item_size,
        block_quota=2,
        num_warps_per_block=32,
    ):
        self._launch(
            "transfer_kv_per_layer", (src_k, dst_k), (src_v, dst_v), (src_indices, dst_indices), 0, 1, item_size,
            (0, 0), (None,) * 4, block_quota, num_warps_per_block,
        )  # fmt: skip

    def transfer_kv_per_layer_pf_lf(
        self, src_k, dst_k, src_v, dst_v, src_indices, dst_indices, layer_id, item_size, src_layout_dim,
        block_quota=2, num_warps_per_block=32,
    ):  # fmt: skip
        self._launch(
            "transfer_kv_per_layer_pf_lf", (src_k, dst_k), (src_v, dst_v), (src_indices, dst_indices), layer_id, 1,
            item_size, (src_layout_dim, 0), (None,) * 4, block_quota, num_warps_per_block,
        )  # fmt: skip

    def transfer_kv_per_layer_ph_lf(
        self, src_k, dst_k, src_v, dst_v, src_indices, dst_indices, layer_id, item_size, src_layout_dim, page_size,
        head_num, block_quota=2, num_warps_per_block=32,
    ):  # fmt: skip
        self._launch(
            "transfer_kv_per_layer_ph_lf", (src_k, dst_k), (src_v, dst_v), (src_indices, dst_indices), layer_id, 1,
            item_size, (src_layout_dim, 0), (None,) * 4, block_quota, num_warps_per_block, page_size, head_num,
        )  # fmt: skip

    def transfer_kv_all_layer(
        self, src_k_layers, dst_k_layers, src_v_layers, dst_v_layers, src_indices, dst_indices, item_size,
        num_layers, block_quota=2, num_warps_per_block=32,
    ):  # fmt: skip
        self._launch(
            "transfer_kv_all_layer", (None, None), (None, None), (src_indices, dst_indices), 0, num_layers,
            item_size, (0, 0), (src_k_layers, dst_k_layers, src_v_layers, dst_v_layers), block_quota,
            num_warps_per_block,
        )  # fmt: skip

    def transfer_kv_all_layer_lf_pf(
        self, src_k_layers, dst_k, src_v_layers, dst_v, src_indices, dst_indices, item_size, dst_layout_dim,
        num_layers, block_quota=2, num_warps_per_block=32,
    ):  # fmt: skip
        self._launch(
            "transfer_kv_all_layer_lf_pf", (None, dst_k), (None, dst_v), (src_indices, dst_indices), 0,
            num_layers, item_size, (0, dst_layout_dim), (src_k_layers, None, src_v_layers, None), block_quota,
            num_warps_per_block,
        )  # fmt: skip

    def transfer_kv_all_layer_lf_ph(
        self, src_k_layers, dst_k, src_v_layers, dst_v, src_indices, dst_indices, item_size, dst_layout_dim,
        num_layers, page_size, head_num, block_quota=2, num_warps_per_block=32,
    ):  # fmt: skip
        self._launch(
            "transfer_kv_all_layer_lf_ph", (None, dst_k), (None, dst_v), (src_indices, dst_indices), 0,
            num_layers, item_size, (0, dst_layout_dim), (src_k_layers, None, src_v_layers, None), block_quota,
            num_warps_per_block, page_size, head_num,
        )  # fmt: skip

    def transfer_kv_per_layer_mla(
        self, src, dst, src_indices, dst_indices, item_size, block_quota=2, num_warps_per_block=32
    ):
        self._launch(
            "transfer_kv_per_layer_mla", (src, dst), (None, None), (src_indices, dst_indices), 0, 1, item_size,
            (0, 0), (None,) * 4, block_quota, num_warps_per_block,
        )  # fmt: skip

    def transfer_kv_all_layer_mla(
        self, src_layers, dst_layers, src_indices, dst_indices, item_size, num_layers, block_quota=2,
        num_warps_per_block=32,
    ):  # fmt: skip
        self._launch(
            "transfer_kv_all_layer_mla", (None, None), (None, None), (src_indices, dst_indices), 0, num_layers,
            item_size, (0, 0), (src_layers, dst_layers, None, None), block_quota, num_warps_per_block,
        )  # fmt: skip


def sglang_kernel():
    """SGLang's kernel for the bench: ``(functions, source)``: sgl-kernel's
    ``kvcacheio`` module where it imports, else :class:`SglKernelTranscription`."""
    try:
        from sgl_kernel import kvcacheio
    except ImportError:
        t = SglKernelTranscription()
        return t, t.source
    try:
        from importlib.metadata import version

        return kvcacheio, f"sgl-kernel {version('sgl-kernel')}"
    except Exception:  # noqa: BLE001 - the version only labels the row
        return kvcacheio, "sgl-kernel"


# ------------------------------------------------- SGLang's host pool, as it calls


class SglangPools:
    """A HiCache host pool and its device pool with the attributes SGLang's
    ``MHATokenToKVPoolHost`` / ``MLATokenToKVPoolHost`` give them (buffers,
    per-layer views, tables of layer addresses, ``token_stride_size``,
    ``layout_dim``), so that :func:`cupy_swap.engines.sglang.adopt` registers
    them as the patch does; :meth:`load` and :meth:`backup` call a kvcacheio
    namespace as ``load_to_device_per_layer`` (every layer) and
    ``backup_from_device_all_layer`` call it with ``io_backend="kernel"``
    and no JIT kernel (pool_host/mha.py at 0047d99, pool_host/mla.py at
    01c0ede).

    ``alloc(shape, pinned)`` makes a buffer (torch by default) and
    ``table(buffers)`` a table of their addresses, so that a test can stand
    in for torch."""

    def __init__(self, shape: SglangShape, device_pages: int, host_pages: int, alloc=None, table=None):
        alloc = alloc or _torch_alloc
        table = table or _torch_table
        self.shape, self.layout, self.layer_num = shape, shape.layout, shape.layers
        self.page_size, self.head_num = shape.page_size, shape.heads
        self.token_stride_size = shape.item_bytes
        self.layout_dim = shape.item_bytes * shape.layers
        dev_tokens, host_tokens = device_pages * shape.page_size, host_pages * shape.page_size
        self.size = host_tokens
        token = (shape.heads, shape.head_dim)
        L = shape.layers
        d = types.SimpleNamespace(layer_num=L)
        if shape.mla:
            d.kv_buffer = [alloc((dev_tokens, *token), False) for _ in range(L)]
            d.data_ptrs = table(d.kv_buffer)
            self.kv_buffer = alloc((L, host_tokens, *token), True)
            self.data_refs = [self.kv_buffer[i] for i in range(L)]
            self.data_ptrs = table(self.data_refs)
        else:
            d.k_buffer = [alloc((dev_tokens, *token), False) for _ in range(L)]
            d.v_buffer = [alloc((dev_tokens, *token), False) for _ in range(L)]
            d.k_data_ptrs, d.v_data_ptrs = table(d.k_buffer), table(d.v_buffer)
            dims = {
                "layer_first": (2, L, host_tokens, *token),
                "page_first": (2, host_tokens, L, *token),
                "page_head": (2, host_pages, shape.heads, shape.page_size, L, shape.head_dim),
            }[shape.layout]
            self.kv_buffer = alloc(dims, True)
            self.k_buffer, self.v_buffer = self.kv_buffer[0], self.kv_buffer[1]
            if shape.layout == "page_first":
                k, v = self.k_buffer.swapaxes(0, 1), self.v_buffer.swapaxes(0, 1)  # SGLang: transpose(0, 1)
            else:
                k, v = self.k_buffer, self.v_buffer
            self.k_data_refs = [k[i] for i in range(L)]
            self.v_data_refs = [v[i] for i in range(L)]
            self.k_data_ptrs, self.v_data_ptrs = table(self.k_data_refs), table(self.v_data_refs)
        self.device_pool = d

    def load(self, io, host_indices, device_indices) -> None:
        """``load_to_device_per_layer`` of every layer, in order."""
        d = self.device_pool
        for layer in range(self.layer_num):
            if self.shape.mla:
                io.transfer_kv_per_layer_mla(
                    src=self.kv_buffer[layer],
                    dst=d.kv_buffer[layer],
                    src_indices=host_indices,
                    dst_indices=device_indices,
                    item_size=self.token_stride_size,
                )
            elif self.layout == "layer_first":
                io.transfer_kv_per_layer(
                    src_k=self.k_buffer[layer],
                    dst_k=d.k_buffer[layer],
                    src_v=self.v_buffer[layer],
                    dst_v=d.v_buffer[layer],
                    src_indices=host_indices,
                    dst_indices=device_indices,
                    item_size=self.token_stride_size,
                )
            elif self.layout == "page_first":
                io.transfer_kv_per_layer_pf_lf(
                    src_k=self.k_buffer,
                    dst_k=d.k_buffer[layer],
                    src_v=self.v_buffer,
                    dst_v=d.v_buffer[layer],
                    src_indices=host_indices,
                    dst_indices=device_indices,
                    layer_id=layer,
                    item_size=self.token_stride_size,
                    src_layout_dim=self.layout_dim,
                )
            else:
                io.transfer_kv_per_layer_ph_lf(
                    src_k=self.k_buffer,
                    dst_k=d.k_buffer[layer],
                    src_v=self.v_buffer,
                    dst_v=d.v_buffer[layer],
                    src_indices=host_indices,
                    dst_indices=device_indices,
                    layer_id=layer,
                    item_size=self.token_stride_size,
                    src_layout_dim=self.layout_dim,
                    page_size=self.page_size,
                    head_num=self.head_num,
                )

    def backup(self, io, host_indices, device_indices) -> None:
        """``backup_from_device_all_layer``: one call over every layer."""
        d = self.device_pool
        if self.shape.mla:
            io.transfer_kv_all_layer_mla(
                src_layers=d.data_ptrs,
                dst_layers=self.data_ptrs,
                src_indices=device_indices,
                dst_indices=host_indices,
                item_size=self.token_stride_size,
                num_layers=self.layer_num,
            )
        elif self.layout == "layer_first":
            io.transfer_kv_all_layer(
                src_k_layers=d.k_data_ptrs,
                dst_k_layers=self.k_data_ptrs,
                src_v_layers=d.v_data_ptrs,
                dst_v_layers=self.v_data_ptrs,
                src_indices=device_indices,
                dst_indices=host_indices,
                item_size=self.token_stride_size,
                num_layers=self.layer_num,
            )
        elif self.layout == "page_first":
            io.transfer_kv_all_layer_lf_pf(
                src_k_layers=d.k_data_ptrs,
                dst_k=self.k_buffer,
                src_v_layers=d.v_data_ptrs,
                dst_v=self.v_buffer,
                src_indices=device_indices,
                dst_indices=host_indices,
                item_size=self.token_stride_size,
                dst_layout_dim=self.layout_dim,
                num_layers=self.layer_num,
            )
        else:
            io.transfer_kv_all_layer_lf_ph(
                src_k_layers=d.k_data_ptrs,
                dst_k=self.k_buffer,
                src_v_layers=d.v_data_ptrs,
                dst_v=self.v_buffer,
                src_indices=device_indices,
                dst_indices=host_indices,
                item_size=self.token_stride_size,
                dst_layout_dim=self.layout_dim,
                num_layers=self.layer_num,
                page_size=self.page_size,
                head_num=self.head_num,
            )

    def tables(self) -> list:
        """Every table of layer addresses this pool and its device pool hold."""
        d = self.device_pool
        if self.shape.mla:
            return [d.data_ptrs, self.data_ptrs]
        return [d.k_data_ptrs, d.v_data_ptrs, self.k_data_ptrs, self.v_data_ptrs]


def _torch_alloc(shape, pinned: bool):
    import torch

    if pinned:
        return torch.empty(shape, dtype=torch.bfloat16, pin_memory=True)
    return torch.empty(shape, dtype=torch.bfloat16, device="cuda")


def _torch_table(buffers):
    """SGLang's table of layer addresses: a uint64 CUDA tensor of ``data_ptr()``s."""
    import torch

    return torch.tensor([b.data_ptr() for b in buffers], dtype=torch.uint64, device="cuda")


def host_tokens_view(pool_mirror, shape: SglangShape, kv: int, layer: int):
    """The tokens of one layer (K: ``kv`` 0, V: 1) of a host pool laid out
    as ``shape.layout`` (its array, or a copy of it with the same shape), as
    ``(tokens, heads * head_dim)`` elements: from SGLang's ``init_kv_buffer``
    dims, not from any address arithmetic."""
    if shape.mla:
        layer_tokens = pool_mirror[layer]
    elif shape.layout == "layer_first":
        layer_tokens = pool_mirror[kv, layer]
    elif shape.layout == "page_first":
        layer_tokens = pool_mirror[kv, :, layer]
    else:  # page_head: [pages, heads, page tokens, layers, dim] -> [pages, page tokens, heads, dim]
        layer_tokens = pool_mirror[kv, :, :, :, layer].transpose(0, 2, 1, 3)
    return layer_tokens.reshape(-1, shape.heads * shape.head_dim)


# ----------------------------------------------------------- the rows

POISON16 = np.uint16(POISON * 0x101).view(np.int16)  # a poisoned bf16 element


def finish_adapter_row(row: dict) -> dict:
    """Add ``lead`` (the faster contender whose bytes matched), ``gain``
    (cupy_swap's GB/s over the engine's) and ``host_gain`` (the engine's
    host time over cupy_swap's) to a measured adapter row."""
    theirs, ours = ADAPTER_CONTENDERS[row["engine"]]
    ok = [c for c in (theirs, ours) if row.get(c + "_ok") and c in row]
    row["lead"] = max(ok, key=lambda c: row[c]) if ok else None
    if theirs in ok and ours in ok:
        row["gain"] = row[ours] / row[theirs]
        if row.get(ours + "_host_us"):
            row["host_gain"] = row[theirs + "_host_us"] / row[ours + "_host_us"]
    return row


def adapter_summary(rows: list) -> dict:
    """Per engine: ``rows`` (with both contenders' bytes matched),
    ``leads`` (rows where cupy_swap is at or above the engine's GB/s),
    ``gain`` and ``host_gain`` (min, max), ``worst`` (the row of the
    lowest gain: shape, count, direction)."""
    out = {}
    for engine in ADAPTER_ENGINES:
        measured = [r for r in rows if r.get("engine") == engine and "gain" in r]
        if not measured:
            continue
        gains = [r["gain"] for r in measured]
        host = [r["host_gain"] for r in measured if "host_gain" in r]
        worst = min(measured, key=lambda r: r["gain"])
        out[engine] = {
            "rows": len(measured),
            "leads": sum(g >= 1.0 for g in gains),
            "gain": (min(gains), max(gains)),
            "host_gain": (min(host, default=float("nan")), max(host, default=float("nan"))),
            "worst": (worst["shape"], worst["num_blocks"], worst["direction"]),
        }
    return out


def adapter_goal_lines(rows: list) -> list[str]:
    """Issue 51's goals, against ``rows``: the vLLM worker at least 2x the
    worker pattern's GB/s and 10x less host time at 16 blocks of Llama-3-8B
    (each direction measured), and the SGLang functions at or above SGLang's
    kernel in every row; a goal whose rows are missing says so."""
    key, n, want_gain, want_host = VLLM_GOAL
    lines = []
    found = [r for r in rows if r.get("shape") == key and r.get("num_blocks") == n]
    if not found:
        lines.append(
            f"vLLM goal ({want_gain:g}x GB/s, {want_host:g}x less host time at {n} blocks of {key}): not measured"
        )
    for r in found:
        where = f"vLLM goal at {n} blocks of {_adapter_shape(key).label()}, {r['direction']}"
        if "gain" not in r:
            lines.append(f"{where}: not decided (a contender's bytes did not match or it failed)")
            continue
        met = r["gain"] >= want_gain and r.get("host_gain", 0.0) >= want_host
        lines.append(
            f"{where}: {r['gain']:.2f}x GB/s, {r.get('host_gain', float('nan')):.1f}x less host time "
            f"(goal {want_gain:g}x and {want_host:g}x): {'met' if met else 'NOT met'}"
        )
    s = adapter_summary(rows).get("sglang")
    if s is None:
        lines.append("SGLang goal (at or above SGLang's kernel in every row): not measured")
    else:
        met = s["leads"] == s["rows"]
        worst = ", ".join(map(str, s["worst"]))
        lines.append(
            f"SGLang goal: at or above SGLang's kernel in {s['leads']} of {s['rows']} rows "
            f"(lowest {s['gain'][0]:.2f}x at {worst}): {'met' if met else 'NOT met'}"
        )
    return lines


def adapter_legend_lines() -> list[str]:
    lines = ["adapter rows (cupy_swap.engines, driven as the engines drive them):"]
    lines += [f"  {s.key:<14} {s.label():<22} {s.text}" for s in ADAPTER_SHAPES]
    lines.append("  a row's n: GPU blocks (vLLM), pages of 16 tokens (SGLang); one transfer:")
    for engine in ADAPTER_ENGINES:
        lines += [f"    {engine} {d}: {text}" for d, text in ADAPTER_DIRECTIONS[engine].items()]
    lines.append("columns: GB/s blocking (host µs per transfer); * = faster, ! = bytes did not match")
    lines.append(f"  {'memcpy':<16} one contiguous cudaMemcpyAsync of the same bytes (the ceiling)")
    lines += [f"  {name:<16} {ADAPTER_LABELS[name]}" for pair in ADAPTER_CONTENDERS.values() for name in pair]
    lines.append(
        "  x GB/s: cupy_swap's GB/s over the engine's; x host: the engine's host time over cupy_swap's"
    )
    return lines


def adapter_table_head() -> str:
    return (
        f"{'shape':<14} {'n':>5} {'dir':>3} {'memcpy':>7} {'engine':>15} {'cupy_swap':>15} "
        f"{'x GB/s':>7} {'x host':>7}  path"
    )


def adapter_table_line(r: dict) -> str:
    """One row of the adapters' table; a contender the row lacks shows ``-``."""
    cells = []
    for c in ADAPTER_CONTENDERS[r["engine"]]:
        if c not in r:
            cells.append(f"{'-':>15}")
            continue
        mark = "!" if not r.get(c + "_ok", True) else ("*" if r.get("lead") == c else " ")
        cells.append(f"{r[c]:6.1f} ({r.get(c + '_host_us', float('nan')):5.0f}){mark}".rjust(15))
    gain = f"{r['gain']:7.2f}" if "gain" in r else f"{'-':>7}"
    host = f"{r['host_gain']:7.1f}" if "host_gain" in r else f"{'-':>7}"
    return (
        f"{r['shape']:<14} {r['num_blocks']:>5} {r['direction']:>3} {r['ceiling_gbps']:7.1f} "
        + " ".join(cells)
        + f" {gain} {host}  {r.get('path', '-')}"
    )


def adapter_skip_line(shape, n: int, why: str) -> str:
    return f"{shape.key:<14} {n:>5}  left out: {why}"


def adapter_markdown_table(rows: list) -> list[str]:
    """A Markdown table of adapter rows: GB/s with host µs per transfer in
    brackets; bold: the faster whose bytes matched; ``!``: a mismatch."""
    lines = [
        "| engine | cache | blocks or pages | direction | memcpy | the engine's way | cupy_swap | x GB/s | x host |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        shape = _adapter_shape(r["shape"])
        cells = [
            "vLLM" if r["engine"] == "vllm" else "SGLang",
            shape.label(),
            str(r["num_blocks"]),
            "host -> GPU" if r["direction"] == "in" else "GPU -> host",
            f"{r['ceiling_gbps']:.1f}",
        ]
        for c in ADAPTER_CONTENDERS[r["engine"]]:
            if c not in r:
                cells.append("-")
                continue
            text = f"{r[c]:.1f} ({r.get(c + '_host_us', float('nan')):.0f})"
            if not r.get(c + "_ok", True):
                text += " !"
            elif r.get("lead") == c:
                text = f"**{text}**"
            cells.append(text)
        cells.append(f"{r['gain']:.2f}" if "gain" in r else "-")
        cells.append(f"{r['host_gain']:.1f}" if "host_gain" in r else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


# ------------------------------------------------------------- on the GPU


def _cupy_view(tensor):
    """A CuPy array over a torch CUDA tensor's memory (its bytes as int8 /
    int16 as its element size says)."""
    import cupy
    import torch

    if tensor.element_size() == 2:
        return cupy.asarray(tensor.view(torch.int16))
    return cupy.asarray(tensor.view(torch.int8))


def _fill_bytes(array, seed: int) -> None:
    """Random bytes in a contiguous CuPy array of any dtype (8-byte multiple)."""
    import cupy

    _fill(array.reshape(-1).view(cupy.uint8), seed)


class _Jobs:
    """One contender driven as vLLM's connector drives a worker: a new job id
    per transfer (``submit``), results collected with ``get_finished()``
    until every submitted job is reported (``finish``); a result with
    ``success=False`` or another size than the transfer's raises, and so
    does a job not reported within ``timeout`` seconds."""

    _ids = itertools.count(1)

    def __init__(self, worker, store: bool, gpu_spec, cpu_spec, nbytes: int):
        self.worker, self.store, self.nbytes = worker, store, nbytes
        self.gpu_spec, self.cpu_spec = gpu_spec, cpu_spec
        self.waiting: set = set()

    def submit(self) -> None:
        job = next(self._ids)
        self.waiting.add(job)
        if self.store:
            self.worker.submit_store(job, self.gpu_spec, self.cpu_spec)
        else:
            self.worker.submit_load(job, self.cpu_spec, self.gpu_spec)

    def finish(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while self.waiting:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"jobs {sorted(self.waiting)} not reported by get_finished() within {timeout:g} s"
                )
            for r in self.worker.get_finished():
                self.waiting.discard(r.job_id)
                if not r.success:
                    raise RuntimeError(
                        f"job {r.job_id}: success=False ({getattr(r, 'error', 'no reason given')})"
                    )
                if r.transfer_size != self.nbytes:
                    raise RuntimeError(
                        f"job {r.job_id}: transfer_size {r.transfer_size}, expected {self.nbytes}"
                    )


def _vllm_specs(case: VllmCase):
    """(GPU spec, CPU spec) of ``case``: vLLM's classes where vLLM imports,
    else objects with their fields."""
    try:
        from vllm.v1.kv_offload.base import GPULoadStoreSpec
        from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec
    except ImportError:
        gpu = types.SimpleNamespace(
            block_ids=case.gpu_ids, group_sizes=case.group_sizes, block_indices=case.block_indices
        )
        return gpu, types.SimpleNamespace(block_ids=case.chunk_ids)
    return (
        GPULoadStoreSpec(case.gpu_ids.tolist(), list(case.group_sizes), list(case.block_indices)),
        CPULoadStoreSpec(case.chunk_ids.tolist()),
    )


def _vllm_kv_caches(pages, page_bytes: int):
    """vLLM's ``CanonicalKVCaches`` of ``pages`` (one group over every
    tensor): its classes where vLLM imports, else objects with their fields."""
    try:
        from vllm.v1.kv_offload import base

        tensor, ref, caches = base.CanonicalKVCacheTensor, base.CanonicalKVCacheRef, base.CanonicalKVCaches
    except ImportError:
        tensor = ref = caches = types.SimpleNamespace
    return caches(
        tensors=[tensor(tensor=t, page_size_bytes=page_bytes) for t in pages],
        group_data_refs=[[ref(tensor_idx=i, page_size_bytes=page_bytes) for i in range(len(pages))]],
    )


class _Ceiling:
    """One contiguous cudaMemcpyAsync of ``nbytes`` on torch's current stream."""

    def __init__(self, nbytes: int):
        import cupy

        from ..cuda import memory

        self.host = memory.empty_pinned((max(nbytes, 1),), np.uint8)
        self.gpu = cupy.empty((max(nbytes, 1),), cupy.uint8)

    def calls(self, nbytes: int, direction: str):
        import torch
        from cupy.cuda import runtime

        if direction == "in":
            args = (self.gpu.data.ptr, self.host.ctypes.data, nbytes, runtime.memcpyHostToDevice)
        else:
            args = (self.host.ctypes.data, self.gpu.data.ptr, nbytes, runtime.memcpyDeviceToHost)

        def submit():
            runtime.memcpyAsync(*args, torch.cuda.current_stream().cuda_stream)

        return submit, torch.cuda.current_stream().synchronize


class VllmBuffers:
    """A vLLM shape's caches: GPU pages (torch int8, one tensor per layer),
    cupy_swap's worker (which allocates the CPU chunks, as vLLM's does),
    vLLM's worker pattern over the same tensors, and the ceiling's ranges."""

    def __init__(self, shape: VllmShape, n_max: int):
        import torch

        from ..engines import vllm as cv

        self.shape = shape
        self.gpu_blocks, self.num_chunks = vllm_sizes(shape, n_max)
        self.pages = [
            torch.empty((self.gpu_blocks, shape.page_bytes), dtype=torch.int8, device="cuda")
            for _ in range(shape.tensors)
        ]
        kv = _vllm_kv_caches(self.pages, shape.page_bytes)
        self.worker = cv.make_worker(kv, shape.blocks_per_chunk, self.num_chunks)
        self.chunks = self.worker.cpu_chunks  # pinned NumPy, (chunks, blocks_per_chunk x page)
        self.rows = [c.reshape(-1, shape.page_bytes) for c in self.chunks]  # chunk rows
        refs = [[(i, shape.page_bytes) for i in range(shape.tensors)]]
        self.pattern = VllmWorkerPattern(
            self.pages, [torch.from_numpy(c) for c in self.chunks], shape.blocks_per_chunk, refs
        )
        self.ceiling = _Ceiling(shape.case_bytes(n_max))
        self.notes = {
            "vllm_classes": "vLLM's" if type(kv).__module__.startswith("vllm") else "stand-ins of vLLM's"
        }

    def plan(self, n: int, rng) -> VllmCase:
        return vllm_plan(self.shape, n, self.gpu_blocks, self.num_chunks, rng)

    def fill(self, seed: int) -> None:
        """Random bytes in every GPU page and CPU chunk."""
        import cupy
        from cupy.cuda import runtime

        for i, t in enumerate(self.pages):
            _fill_bytes(_cupy_view(t), seed * 1000 + i)
        scratch = cupy.empty(self.chunks[0].nbytes, cupy.uint8)
        for i, c in enumerate(self.chunks):
            _fill_bytes(scratch, seed * 1000 + 500 + i)
            runtime.memcpy(c.ctypes.data, scratch.data.ptr, c.nbytes, runtime.memcpyDeviceToHost)
        cupy.cuda.Device().synchronize()

    def poison(self, direction: str) -> None:
        """Every destination byte set to :data:`POISON`."""
        import cupy

        if direction == "in":
            for t in self.pages:
                _cupy_view(t).fill(POISON - 256)  # int8
        else:
            for c in self.chunks:
                c.view(np.uint8).fill(POISON)
        cupy.cuda.Device().synchronize()

    def verify(self, direction: str, case: VllmCase) -> bool:
        """Every mapped block equal on both sides, every other destination
        block (GPU block or chunk row) still :data:`POISON`; compared on the
        GPU, one tensor at a time."""
        import cupy

        gpu_at, row_at = cupy.asarray(case.pairs[:, 0]), cupy.asarray(case.pairs[:, 1])
        dst_count = self.gpu_blocks if direction == "in" else len(self.rows[0])
        untouched = np.setdiff1d(np.arange(dst_count), case.pairs[:, 0 if direction == "in" else 1])
        rest = cupy.asarray(untouched) if untouched.size else None
        for t, rows in zip(self.pages, self.rows):
            gpu, host = _cupy_view(t).view(cupy.uint8), cupy.asarray(rows.view(np.uint8))
            if not bool(cupy.array_equal(gpu[gpu_at], host[row_at])):
                return False
            dst = gpu if direction == "in" else host
            if rest is not None and not bool((dst[rest] == POISON).all()):
                return False
        return True

    def calls(self, direction: str, case: VllmCase) -> dict:
        """``name -> (submit, finish)``: the ceiling, vLLM's worker pattern
        and cupy_swap's worker, on the same specs."""
        gpu_spec, cpu_spec = _vllm_specs(case)
        nbytes = self.shape.case_bytes(len(case.pairs))
        store = direction == "out"
        pattern = _Jobs(self.pattern, store, gpu_spec, cpu_spec, nbytes)
        ours = _Jobs(self.worker, store, gpu_spec, cpu_spec, nbytes)
        return {
            "memcpy": self.ceiling.calls(nbytes, direction),
            "vllm_pattern": (pattern.submit, pattern.finish),
            "vllm_worker": (ours.submit, ours.finish),
        }

    def path(self) -> str | None:
        return getattr(getattr(self.worker, "_swapper", None), "last_path", None)

    def close(self) -> None:
        self.worker.shutdown()
        self.pattern.shutdown()


class SglangBuffers:
    """An SGLang shape's device pool and host pool (:class:`SglangPools`, on
    torch), a GPU mirror of the host pool (the reference of loads, the
    landing place of backups' checks), the index tensors, and the ceiling."""

    def __init__(self, shape: SglangShape, n_max: int):
        import cupy
        import torch

        from ..engines import sglang as sg

        self.shape = shape
        # SGLang's page_head pool indexes its buffer's page axis by layer for
        # its per-layer views: a pool has at least as many pages as layers.
        self.device_pages = self.host_pages = max(SPARE * n_max, n_max + 1, shape.layers)
        self.pools = SglangPools(shape, self.device_pages, self.host_pages)
        sg.adopt(self.pools)  # what patch_host_pools() does to each host pool it sees built
        self.host = _cupy_host(self.pools.kv_buffer)
        self.mirror = cupy.empty(self.host.shape, self.host.dtype)
        self.ceiling = _Ceiling(shape.case_bytes(n_max))
        self.io, source = sglang_kernel()
        self.notes = {"sglang_kernel_source": source}
        self.stream = torch.cuda.Stream()

    def _device_layers(self):
        d = self.pools.device_pool
        return [d.kv_buffer] if self.shape.mla else [d.k_buffer, d.v_buffer]

    def plan(self, n: int, rng) -> SglangCase:
        import torch

        case = sglang_plan(n, self.device_pages, self.host_pages, rng, self.shape.page_size)
        self._indices = (
            torch.from_numpy(case.host_tokens).to("cuda"),
            torch.from_numpy(case.device_tokens).to("cuda"),
        )
        return case

    def _copy_host(self, to_host: bool) -> None:
        from cupy.cuda import runtime

        h, m = self.host, self.mirror
        if to_host:
            runtime.memcpy(h.ctypes.data, m.data.ptr, h.nbytes, runtime.memcpyDeviceToHost)
        else:
            runtime.memcpy(m.data.ptr, h.ctypes.data, h.nbytes, runtime.memcpyHostToDevice)

    def fill(self, seed: int) -> None:
        import cupy

        for kv, layers in enumerate(self._device_layers()):
            for i, t in enumerate(layers):
                _fill_bytes(_cupy_view(t), seed * 1000 + 100 * kv + i)
        _fill_bytes(self.mirror, seed * 1000 + 999)
        cupy.cuda.Device().synchronize()
        self._copy_host(to_host=True)

    def poison(self, direction: str) -> None:
        import cupy

        if direction == "in":
            for layers in self._device_layers():
                for t in layers:
                    _cupy_view(t).fill(POISON16)
        else:
            self.mirror.view(cupy.uint8).fill(POISON)
            cupy.cuda.Device().synchronize()
            self._copy_host(to_host=True)
        cupy.cuda.Device().synchronize()

    def verify(self, direction: str, case: SglangCase) -> bool:
        """Every token of every mapped page equal on both sides, in every
        layer (K and V), and every other destination token still
        :data:`POISON`; compared on the GPU, the host pool through its mirror
        (a backup's host pool copied there first; a load's reference is the
        mirror :meth:`fill` wrote)."""
        import cupy

        if direction == "out":
            self._copy_host(to_host=False)
        dev_at, host_at = cupy.asarray(case.device_tokens), cupy.asarray(case.host_tokens)
        dst_tokens = (self.device_pages if direction == "in" else self.host_pages) * self.shape.page_size
        mapped = case.device_tokens if direction == "in" else case.host_tokens
        untouched = np.setdiff1d(np.arange(dst_tokens), mapped)
        rest = cupy.asarray(untouched) if untouched.size else None
        width = self.shape.heads * self.shape.head_dim
        for kv, layers in enumerate(self._device_layers()):
            for layer, t in enumerate(layers):
                dev = _cupy_view(t).reshape(-1, width)
                host = host_tokens_view(self.mirror, self.shape, kv, layer)
                if not bool(cupy.array_equal(dev[dev_at], host[host_at])):
                    return False
                dst = dev if direction == "in" else host
                if rest is not None and not bool((dst[rest] == POISON16).all()):
                    return False
        return True

    def calls(self, direction: str, case: SglangCase) -> dict:
        """``name -> (submit, finish)``: the ceiling, SGLang's kernel and
        cupy_swap's functions, each called by the host pool's calls on
        torch's current stream (a side stream made current, as HiCache's
        load and write-back streams are)."""
        import torch

        from ..engines import sglang as sg

        host_idx, dev_idx = self._indices
        transfer = self.pools.load if direction == "in" else self.pools.backup
        stream = self.stream

        def through(io):
            def submit():
                with torch.cuda.stream(stream):
                    transfer(io, host_idx, dev_idx)

            return submit

        memcpy, _ = self.ceiling.calls(self.shape.case_bytes(len(case.pages)), direction)

        def ceiling():
            with torch.cuda.stream(stream):
                memcpy()

        return {
            "memcpy": (ceiling, stream.synchronize),
            "sglang_kernel": (through(self.io), stream.synchronize),
            "sglang_functions": (through(sg), stream.synchronize),
        }

    def path(self) -> str | None:
        from ..engines import sglang as sg

        swapper = sg._swapper_for(self._device_layers()[0])
        return getattr(swapper, "last_path", None)

    def close(self) -> None:
        from ..engines import sglang as sg

        self.stream.synchronize()
        sg.use_swapper(None)  # drops the module's ops over these buffers
        for table in self.pools.tables():  # and its registry entries (they hold the buffers)
            sg._tables.pop(table.data_ptr(), None)


def _cupy_host(tensor):
    """A pinned torch CPU tensor's memory as a NumPy array of its shape (int16 for bf16)."""
    import torch

    return tensor.view(torch.int16).numpy() if tensor.element_size() == 2 else tensor.numpy()


class AdapterHarness:
    """What :func:`run_adapters` does on the GPU, one method each, so that a
    test can stand in for the GPU (and for torch) on the CPU."""

    def unavailable(self, engine: str) -> str | None:
        """Why ``engine``'s rows cannot run here (the adapters take torch
        tensors, as the engines hand them), or None."""
        try:
            import torch
        except ImportError:
            return "needs PyTorch (the engines hand the adapters torch tensors): pip install torch"
        if not torch.cuda.is_available():
            return "needs PyTorch with CUDA (this torch build or machine has none)"
        return None

    def free_memory(self) -> tuple[int, int]:
        return _free_memory()

    def settle(self) -> None:
        from .bench import settle

        settle()

    def buffers(self, shape, n_max: int):
        return VllmBuffers(shape, n_max) if shape.engine == "vllm" else SglangBuffers(shape, n_max)

    def release(self) -> None:
        """After a shape: what CuPy's and torch's allocators keep of its
        buffers goes back to the GPU, so the next shape's counts are sized
        against the memory really free."""
        import cupy
        import torch

        from .bench import settle

        settle()
        cupy.get_default_memory_pool().free_all_blocks()
        cupy.get_default_pinned_memory_pool().free_all_blocks()
        torch.cuda.empty_cache()


def run_adapters(
    shapes=ADAPTER_KEYS,
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
    """Measure every adapter shape x direction x count that fits in memory.

    Parameters
    ----------
    shapes : sequence of str
        Keys of :data:`ADAPTER_SHAPES` (:func:`adapter_shapes` picks them
        by engine).
    on_row, on_skip, harness
        As :func:`run_engines` takes them (:class:`AdapterHarness`).

    Returns
    -------
    list of dict
        One per case: ``engine, shape, num_blocks`` (GPU blocks for vLLM,
        pages for SGLang), ``direction, bytes, ceiling_gbps,
        ceiling_host_us``; per contender ``c`` of the engine
        (:data:`ADAPTER_CONTENDERS`): ``c`` (GB/s), ``c + "_host_us"``,
        ``c + "_ok"`` (and ``c + "_error"``); ``path`` (what cupy_swap's
        last call took); the buffers' notes (``vllm_classes``,
        ``sglang_kernel_source``); and :func:`finish_adapter_row`'s keys.
    """
    rng = np.random.default_rng(seed + 51)
    h = harness or AdapterHarness()
    rows = []
    available = []
    for shape in map(_adapter_shape, shapes):
        why = h.unavailable(shape.engine)
        if not why:
            available.append(shape)
        elif on_skip:
            for n in sorted(counts):
                on_skip(shape, n, why)
    fitting = fitting_buffers(h, available, counts, adapter_counts_that_fit, adapter_footprint, on_skip)
    for shape, bufs, fit in fitting:
        key = shape.key
        try:
            for di, direction in enumerate(directions):
                bufs.fill(seed * 100 + ADAPTER_KEYS.index(key) * 10 + di)
                for n in fit:
                    row = _adapter_row(h, bufs, shape, direction, n, rng, reps, rounds)
                    rows.append(row)
                    if on_row:
                        on_row(row)
        finally:
            bufs.close()
            del bufs
            release = getattr(h, "release", None)
            if release is not None:
                release()
    return rows


def _adapter_row(h, bufs, shape, direction: str, n: int, rng, reps: int, rounds: int) -> dict:
    case = bufs.plan(n, rng)
    pairs = bufs.calls(direction, case)
    submits = {name: fn for name, (fn, _) in pairs.items()}
    waits = {name: wait for name, (_, wait) in pairs.items()}
    errors = _try_each(submits, waits)
    h.settle()
    timed = time_in_turns(submits, waits, reps_for(shape.case_bytes(n), reps), rounds)
    row = {
        "engine": shape.engine,
        "shape": shape.key,
        "num_blocks": n,
        "direction": direction,
        "bytes": shape.case_bytes(n),
    }
    blocking, host = timed.pop("memcpy", (float("nan"), float("nan")))
    row["ceiling_gbps"] = row["bytes"] / blocking / 1e9
    row["ceiling_host_us"] = host * 1e6
    theirs, ours = ADAPTER_CONTENDERS[shape.engine]
    for name in (theirs, ours):
        if name in errors:
            row[name + "_error"], row[name + "_ok"] = errors[name], False
            continue
        blocking, host = timed[name]
        row[name] = row["bytes"] / blocking / 1e9
        row[name + "_host_us"] = host * 1e6
        try:
            bufs.poison(direction)  # then one transfer, checked
            submits[name]()
            waits[name]()
            if name == ours:
                path = bufs.path()
                if path:
                    row["path"] = path
            row[name + "_ok"] = bufs.verify(direction, case)
        except Exception as e:  # reported in the row: a failed check is not a pass
            row[name + "_ok"], row[name + "_error"] = False, f"{type(e).__name__}: {e}"
    row.update(bufs.notes)
    return finish_adapter_row(row)
