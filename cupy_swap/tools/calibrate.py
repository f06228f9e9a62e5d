"""Per-device thresholds for ``mode="auto"``: measured by
``python -m cupy_swap calibrate``, stored in a small JSON file, loaded by
every ``BlockSwapper`` on that device.  Without a file the built-in defaults
(measured on an H200, PCIe Gen5; see ``benchmarks/NOTES.md``) apply.

Two numbers decide the path:

``dma_min_copy_bytes``
    Copies at least this large go to the copy engines (their ~1 us of
    per-copy overhead no longer matters, and they move 1.0x the memcpy
    ceiling where SM-issued PCIe traffic tops out near 0.92-0.95x).
``dma_max_copies``
    A swap of at most this many copies goes to the copy engines (one
    ``cudaMemcpyAsync`` beats a kernel launch for a single block).
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import numpy as np

from ..cuda.settings import calibration_path

__all__ = ["calibrate"]


def _latency(case, mode: str, reps: int, rng) -> float:
    from .bench import run_case

    return run_case(case, reps=reps, baseline=False, mode=mode, seed=int(rng.integers(1 << 30)))["latency_s"]


def calibrate(reps: int = 20, progress=None, device: int | None = None) -> tuple[dict, Path]:
    """Measure both thresholds on the current device and store them.

    Returns
    -------
    (dict, pathlib.Path)
        The thresholds and the file they were written to.
    """
    import cupy

    from .bench import SwapCase

    device = cupy.cuda.runtime.getDevice() if device is None else device
    rng = np.random.default_rng(0)
    say = progress or (lambda *_: None)

    min_copy = None
    for block in (64 << 10, 128 << 10, 256 << 10, 512 << 10, 1 << 20, 2 << 20):
        n = int(min(256, max(16, (64 << 20) // block)))
        kernel = dma = 0.0
        for d in ("in", "out"):
            kernel += _latency(SwapCase(d, block, n), "kernel", reps, rng)
            dma += _latency(SwapCase(d, block, n), "dma", reps, rng)
        say(f"  {block >> 10:5d} KiB blocks x {n}: kernel {kernel * 1e6:9.1f} us, dma {dma * 1e6:9.1f} us")
        if dma <= kernel:
            min_copy = block
            break
    max_copies = 0
    for n in (1, 2, 4, 8):
        kernel = dma = 0.0
        for d in ("in", "out"):
            kernel += _latency(SwapCase(d, 32 << 10, n), "kernel", reps, rng)
            dma += _latency(SwapCase(d, 32 << 10, n), "dma", reps, rng)
        say(f"  32 KiB blocks x {n}: kernel {kernel * 1e6:7.1f} us, dma {dma * 1e6:7.1f} us")
        if dma > kernel:
            break
        max_copies = n
    result = {"dma_min_copy_bytes": min_copy or (4 << 20), "dma_max_copies": max_copies}
    path = calibration_path(device)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = dict(result, measured=datetime.datetime.now().isoformat(timespec="seconds"))
    path.write_text(json.dumps(record, indent=1) + "\n")
    return result, path
