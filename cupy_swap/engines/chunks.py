"""Which rows of which views one offloading transfer copies: NumPy only, no GPU.

vLLM's offloading connector keeps, per KV cache tensor, a GPU view of pages
``(num_gpu_blocks, page_bytes)`` and a CPU tensor of chunks
``(num_chunks, blocks_per_chunk * page_bytes)``: a chunk holds
``blocks_per_chunk`` GPU blocks side by side.  A chunk tensor is contiguous,
so it is also ``(num_chunks * blocks_per_chunk, page_bytes)``, its *chunk
rows*: block ``j`` of chunk ``c`` is row ``c * blocks_per_chunk + j``.  A
transfer then is one mapping of ``(gpu_block, chunk_row)`` pairs, the same for
every tensor of a KV cache group, and one prepared-op call moves it for all of
them (:mod:`cupy_swap.engines.offload`).

A transfer names, per KV cache group in group order, ``group_sizes[g]`` GPU
blocks and as many chunks as those blocks touch.  A group's first block is
block ``block_indices[g]`` of its request, so it sits at position
``block_indices[g] % blocks_per_chunk`` of its first chunk (an unaligned first
chunk); its last chunk may be only partly used (an unaligned last chunk).  A
group of size 0 names no block and no chunk.

Groups whose layers cover the same tensors with the same bytes per page share
one op (:func:`part_signatures`); their rows are concatenated
(:func:`merged_rows`).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class SpecError(ValueError):
    """The block and chunk lists of a transfer do not fit each other or the
    worker's groups (raised before anything is copied)."""


class GroupRows(NamedTuple):
    """One group's rows: ``gpu[i]`` is copied to or from chunk row ``cpu[i]``."""

    gpu: np.ndarray
    cpu: np.ndarray


_EMPTY = np.empty(0, np.int64)


def chunk_rows(chunk_ids, blocks_per_chunk: int, skip: int, count: int) -> np.ndarray:
    """Chunk rows of ``count`` consecutive blocks starting ``skip`` blocks into
    the first of ``chunk_ids`` (int64).  An id out of range gives rows out of
    range of the chunk-row view (negative, or at least ``num_chunks *
    blocks_per_chunk``), so the copy's own check refuses it."""
    chunks = np.asarray(chunk_ids, dtype=np.int64).reshape(-1)
    if blocks_per_chunk == 1:
        return chunks[skip : skip + count]
    rows = chunks[:, None] * blocks_per_chunk + np.arange(blocks_per_chunk, dtype=np.int64)
    return rows.reshape(-1)[skip : skip + count]


def transfer_rows(
    gpu_block_ids,
    group_sizes,
    block_indices,
    chunk_ids,
    blocks_per_chunk: int,
    num_groups: int,
) -> list[GroupRows]:
    """Per group, the GPU blocks and chunk rows one transfer pairs.

    Parameters
    ----------
    gpu_block_ids : sequence of int
        Every group's GPU blocks, group after group (``sum(group_sizes)``).
    group_sizes, block_indices : sequence of int
        Per group: its number of GPU blocks, and the index within its request
        of its first one (``num_groups`` each).
    chunk_ids : sequence of int
        Every group's chunks, group after group.
    blocks_per_chunk : int
        GPU blocks per chunk.

    Raises
    ------
    SpecError
        The lists do not add up (vLLM's own worker asserts the same).
    """
    if blocks_per_chunk < 1:
        raise SpecError(f"blocks_per_chunk: expected a positive int, got {blocks_per_chunk}")
    gpu = np.asarray(gpu_block_ids, dtype=np.int64).reshape(-1)
    chunks = np.asarray(chunk_ids, dtype=np.int64).reshape(-1)
    sizes, starts = list(group_sizes), list(block_indices)
    if len(sizes) != num_groups or len(starts) != num_groups:
        raise SpecError(
            f"expected {num_groups} group sizes and block indices (one per KV cache group), "
            f"got {len(sizes)} and {len(starts)}"
        )
    if sum(sizes) != len(gpu):
        raise SpecError(f"expected sum(group_sizes) == {len(gpu)} GPU blocks, got {sum(sizes)}")
    out, g_at, c_at = [], 0, 0
    for g, (size, start) in enumerate(zip(sizes, starts)):
        size = int(size)
        if size < 0:
            raise SpecError(f"group {g}: expected a size >= 0, got {size}")
        if size == 0:
            out.append(GroupRows(_EMPTY, _EMPTY))
            continue
        skip = int(start) % blocks_per_chunk
        n_chunks = -(-(size + skip) // blocks_per_chunk)
        if c_at + n_chunks > len(chunks):
            raise SpecError(
                f"group {g}: {size} blocks from position {skip} of a chunk need {n_chunks} chunks, "
                f"{len(chunks) - c_at} left of {len(chunks)}"
            )
        out.append(
            GroupRows(
                gpu[g_at : g_at + size],
                chunk_rows(chunks[c_at : c_at + n_chunks], blocks_per_chunk, skip, size),
            )
        )
        g_at, c_at = g_at + size, c_at + n_chunks
    if c_at != len(chunks):
        raise SpecError(f"expected {c_at} chunks for these groups, got {len(chunks)}")
    return out


def part_signatures(group_refs) -> tuple[list[tuple], list[int | None]]:
    """Which groups can share one op.

    ``group_refs[g]`` lists ``(tensor_idx, page_bytes)`` per layer of group
    ``g`` (vLLM's ``CanonicalKVCacheRef``: the first ``page_bytes`` of each
    page are the layer's).  A group's signature is the set of tensors it
    touches, each with the most bytes any of its layers uses there (two layers
    on one tensor copy the same bytes once).  Returns the distinct signatures
    and, per group, the index of its own (None for a group with no layers).
    """
    signatures: list[tuple] = []
    of_group: list[int | None] = []
    for refs in group_refs:
        widest: dict[int, int] = {}
        for tensor_idx, page_bytes in refs:
            widest[int(tensor_idx)] = max(widest.get(int(tensor_idx), 0), int(page_bytes))
        signature = tuple(sorted(widest.items()))
        if not signature:
            of_group.append(None)
            continue
        if signature not in signatures:
            signatures.append(signature)
        of_group.append(signatures.index(signature))
    return signatures, of_group


def merged_rows(
    per_group: list[GroupRows], of_group: list[int | None], num_ops: int, gpu_to_cpu: bool
) -> list:
    """Per op, its ``(N, 2)`` int64 ``(src, dst)`` rows (GPU block -> chunk
    row for a store, the other way for a load), or None where no group of the
    transfer uses it."""
    gathered: list[list] = [[] for _ in range(num_ops)]
    for rows, op in zip(per_group, of_group):
        if op is not None and len(rows.gpu):
            gathered[op].append(rows)
    out: list = []
    for parts in gathered:
        if not parts:
            out.append(None)
            continue
        gpu = np.concatenate([p.gpu for p in parts]) if len(parts) > 1 else parts[0].gpu
        cpu = np.concatenate([p.cpu for p in parts]) if len(parts) > 1 else parts[0].cpu
        out.append(np.stack((gpu, cpu) if gpu_to_cpu else (cpu, gpu), axis=1))
    return out


def out_of_range(rows: np.ndarray, src_limit: int, dst_limit: int) -> str | None:
    """What is wrong with the first row outside ``[0, limit)`` on its side,
    or None (two passes over the rows, for transfers of several ops)."""
    for side, limit in ((0, src_limit), (1, dst_limit)):
        column = rows[:, side]
        bad = np.flatnonzero((column < 0) | (column >= limit))
        if len(bad):
            name = ("source", "destination")[side]
            return f"{name} row {int(column[bad[0]])} in row {int(bad[0])} is out of range (expected 0 <= index < {limit})"
    return None
