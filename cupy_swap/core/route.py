"""Which path serves a swap, decided once per op from its layout: a pure
function of the layout, the mode and two measured thresholds.  NumPy only,
so every decision is tested on the CPU (tests/test_route.py).

Paths: ``"kernel"`` (one launch; SM loads and stores reach scattered host
blocks cheaply), ``"dma"`` (copy engines, one copy per run of consecutive
blocks: they win for large copies and lose about 1 us per copy), ``"staged"``
(asked for with ``mode="staged"``: copy engines move host runs through a GPU
arena, a kernel scatters or gathers the GPU blocks; see :mod:`cupy_swap.staged.plan`).
Nothing here looks at a mapping's rows: sampling them on every call cost
more host time than it saved (``benchmarks/NOTES.md``, item 42).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .layout import GPU_TO_GPU, IN, OUT, Layout
from .parts import groups_problem

MODES = ("auto", "kernel", "dma", "staged")


def check_mode(mode) -> str:
    if mode not in MODES:
        raise ValueError(f"mode: expected one of {', '.join(map(repr, MODES))}, got {mode!r}")
    return mode


HOST_COLUMN = {IN: 0, OUT: 1}  # mapping column of host blocks


@dataclass(frozen=True)
class Policy:
    """The thresholds ``auto`` decides with (defaults measured on an H200;
    ``python -m cupy_swap calibrate`` measures them per machine).

    Attributes
    ----------
    dma_min_copy_bytes : int
        Layouts whose every block is this large go to the copy engines.
    dma_max_copies : int
        A swap of at most this many copies (rows x parts) goes to the copy
        engines (the one test a call makes: it needs only the row count).
    staging_bytes : int
        Staging arena per direction (0: staging is off).
    """

    dma_min_copy_bytes: int = 2 << 20  # benchmarks/NOTES.md, item 35
    dma_max_copies: int = 1
    staging_bytes: int = 64 << 20

    def staging_rows(self, bytes_per_pair: int) -> int:
        """Rows of ``bytes_per_pair`` bytes a staging arena holds."""
        return (self.staging_bytes // 256 * 256) // bytes_per_pair if bytes_per_pair else 0


def prepared_route(layout: Layout, mode: str, policy: Policy) -> str:
    """The path of every swap of ``layout`` under ``mode``.

    Parameters
    ----------
    layout : Layout
        Resolved (``kernel_ok`` set).
    mode : {"auto", "kernel", "dma", "staged"}
    policy : Policy

    Raises
    ------
    ValueError
        ``mode`` names a path this layout cannot take.
    """
    if mode == "staged":
        why = staged_refusal(layout, policy)
        if why:
            raise ValueError(f"mode: 'staged' {why}")
        return "staged"
    if not layout.kernel_ok:
        if mode == "kernel":
            raise ValueError(
                f"mode: 'kernel' needs host memory mapped into the GPU's address space, but "
                f"{layout.unmapped_reason}; use mode='dma' or 'auto'"
            )
        return "dma"
    if mode != "auto":
        return mode
    if layout.min_block_bytes >= policy.dma_min_copy_bytes:
        return "dma"  # every copy is large: the copy engines win
    return "kernel"


def run_rows(layout: Layout, policy: Policy) -> int | None:
    """Fewest rows from which ``auto`` looks for one run in a kernel swap's
    mapping (:func:`run_route`): where one run's copy of the smallest part
    reaches ``dma_min_copy_bytes``; None for GPU -> GPU layouts and zero-byte
    blocks."""
    if layout.direction == GPU_TO_GPU or not layout.min_block_bytes:
        return None
    return max(2, -(-policy.dma_min_copy_bytes // layout.min_block_bytes))


def run_route(rows, n: int, direction: str, staged_ok: bool) -> str | None:
    """``auto``'s look at an ``(n, 2)`` mapping (or its flat list) of a kernel layout, in
    constant time (the ends of its columns only): ``"dma"`` when both
    columns span exactly ``n`` consecutive blocks (one run each side: one
    copy per part), ``"staged"`` when the host column does (its blocks come
    or go as one copy per part through the staging arena), else None (the
    kernel).  A mapping whose ends span ``n`` blocks but which is not one
    run is still copied right, in more copies (the copy list and the staged
    plan find the runs themselves)."""
    flat = rows.item if type(rows) is np.ndarray else rows.__getitem__  # (n, 2) array or flat list
    last = 2 * n - 2
    s_run = flat(last) - flat(0) == n - 1
    d_run = flat(last + 1) - flat(1) == n - 1
    if s_run and d_run:
        return "dma"
    if staged_ok and (s_run if direction == IN else d_run):
        return "staged"
    return None


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
