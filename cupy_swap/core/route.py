"""Which path serves a swap: the routing policy, a pure function of the
layout, the mapping and a few measured thresholds.  NumPy only, so every
decision is tested on the CPU (tests/test_route.py).

Paths: ``"kernel"`` (one launch; SM loads and stores reach scattered host
blocks cheaply), ``"dma"`` (copy engines, one copy per run: they win for
large copies and lose about 1 us per copy), ``"staged"`` (copy engines move
host runs through a GPU arena, a kernel scatters or gathers the GPU blocks;
see :mod:`.staged_plan`).  The reasoning behind each threshold is in
``benchmarks/NOTES.md``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .copies import copy_count
from .layout import GPU_TO_GPU, IN, OUT, Layout
from .mapping import may_have_runs, sampled_steps
from .staged_plan import StagedPlan, chunk_sizes, groups_problem, plan_chunks

__all__ = ["Policy", "route", "staged_refusal", "MODES", "HOST_COLUMN"]

MODES = ("auto", "kernel", "dma", "staged")
HOST_COLUMN = {IN: 0, OUT: 1}  # mapping column of host blocks


@dataclass(frozen=True)
class Policy:
    """The thresholds ``auto`` decides with (defaults measured on an H200;
    ``python -m cupy_swap calibrate`` measures them per machine).

    Attributes
    ----------
    dma_min_copy_bytes : int
        Copies this large or larger go to the copy engines.
    dma_max_copies : int
        A swap of at most this many copies goes to the copy engines.
    staged_min_bytes : int
        Swaps of at least this many bytes whose host blocks lie in long
        runs are staged; smaller ones lose more to the extra host work.
    staged_min_avg_copy_bytes : int
        ... when their copy-engine copies average at least this many bytes.
    staging_bytes : int
        Staging arena per direction (0: staging is off).
    """

    dma_min_copy_bytes: int = 2 << 20  # benchmarks/NOTES.md, item 35
    dma_max_copies: int = 1
    staged_min_bytes: int = 16 << 20
    staged_min_avg_copy_bytes: int = 512 << 10
    staging_bytes: int = 64 << 20

    def staging_rows(self, bytes_per_pair: int) -> int:
        """Rows of ``bytes_per_pair`` bytes a staging arena holds."""
        return (self.staging_bytes // 256 * 256) // bytes_per_pair if bytes_per_pair else 0


def as_array(mapping) -> np.ndarray:
    """An ``(N, 2)`` int64 array of a checked mapping (flat lists of short
    ones are converted)."""
    if type(mapping) is list:
        return np.array(mapping, dtype=np.int64).reshape(-1, 2)
    return mapping


def route(layout: Layout, mapping, mode: str, policy: Policy, capturing) -> tuple[str, StagedPlan | None]:
    """The path of a swap and, for ``"staged"``, the plan of its chunks.

    Parameters
    ----------
    layout : Layout
        Resolved (``kernel_ok`` set).
    mapping : numpy.ndarray of shape (N, 2), int64, or list of 2N ints
        Checked, ``N >= 1``.
    mode : {"auto", "kernel", "dma", "staged"}
    policy : Policy
    capturing : bool
        The swap's stream captures a graph (staged swaps cannot be captured).

    Raises
    ------
    ValueError
        ``mode`` names a path this swap cannot take.
    """
    if mode == "staged":
        why, plan = _staged_plan(layout, mapping, policy, capturing)
        if why:
            raise ValueError(f"mode: 'staged' {why}")
        return "staged", plan
    if not layout.kernel_ok:
        if mode == "kernel":
            raise ValueError(
                f"mode: 'kernel' needs host memory mapped into the GPU's address space, but "
                f"{layout.unmapped_reason}; use mode='dma' or 'auto'"
            )
        plan = _staged_if_better(layout, mapping, policy, capturing) if mode == "auto" else None
        return ("staged", plan) if plan is not None else ("dma", None)
    if mode != "auto":
        return mode, None
    if layout.min_block_bytes >= policy.dma_min_copy_bytes:
        return "dma", None  # every copy is large: the copy engines win
    n = len(mapping) if type(mapping) is not list else len(mapping) // 2
    if n * len(layout.src) <= policy.dma_max_copies:
        return "dma", None
    # A mix of large and small blocks falls through: one large part does not
    # send every small part's blocks to the copy engines one by one.
    if layout.max_block_bytes * n < policy.dma_min_copy_bytes:
        return "kernel", None  # no run of these can be large enough
    m = as_array(mapping)
    steps = sampled_steps(m)
    if type(mapping) is list or may_have_runs(m, steps=steps):
        copies = copy_count(layout, m)
        if copies <= policy.dma_max_copies or layout.bytes_per_pair * n >= copies * policy.dma_min_copy_bytes:
            return "dma", None
    plan = _staged_if_better(layout, m, policy, capturing, steps)
    return ("staged", plan) if plan is not None else ("kernel", None)


def _staged_if_better(layout: Layout, mapping, policy: Policy, capturing, steps=None) -> StagedPlan | None:
    """auto: the plan of a staged swap when it beats the kernel (a large
    swap whose host blocks lie in long runs), else None."""
    if (
        layout.host_groups is None
        or type(mapping) is list
        or len(mapping) * layout.bytes_per_pair < policy.staged_min_bytes
        or not may_have_runs(mapping, column=HOST_COLUMN[layout.direction], steps=steps)
    ):
        return None
    why, plan = _staged_plan(layout, mapping, policy, capturing)
    if why:
        return None
    copies = plan.num_copies_per_group * len(layout.host_groups)
    if len(mapping) * layout.bytes_per_pair < copies * policy.staged_min_avg_copy_bytes:
        return None
    return plan


def staged_refusal(layout: Layout, policy: Policy) -> str:
    """Why a staged swap of this layout cannot run, or "" (mapping aside)."""
    if layout.direction == GPU_TO_GPU:
        return "moves between host and GPU memory, got GPU -> GPU"
    if not policy.staging_bytes:
        return "needs staging memory, but this swapper has staging_bytes=0"
    if layout.host_groups is None:
        return groups_problem(layout.src if layout.direction == IN else layout.dst)
    if policy.staging_rows(layout.bytes_per_pair) < 2:
        return (
            f"needs room for two blocks of all parts ({2 * layout.bytes_per_pair} bytes) in "
            f"staging_bytes={policy.staging_bytes}; raise staging_bytes"
        )
    return ""


def _staged_plan(layout: Layout, mapping, policy: Policy, capturing) -> tuple[str, StagedPlan | None]:
    """``("", plan)`` for a staged swap, or ``(why not, None)``."""
    why = staged_refusal(layout, policy)
    if not why and capturing:
        why = "cannot be captured into a CUDA graph; use mode='kernel' or graph_swap()"
    if why:
        return why, None
    m = as_array(mapping)
    sizes = chunk_sizes(m.shape[0], layout.bytes_per_pair, policy.staging_rows(layout.bytes_per_pair) // 2)
    if layout.direction == OUT:
        sizes.reverse()  # a short first gather lets the copy engine start early
    return "", plan_chunks(m, sizes, HOST_COLUMN[layout.direction])
