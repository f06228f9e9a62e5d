"""Where ``python -m cupy_swap calibrate`` stores a GPU's thresholds for
``mode="auto"``, and loading them (every ``BlockSwapper`` on that GPU
does; without a file the built-in defaults of
:class:`cupy_swap.core.route.Policy` apply)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

KEYS = ("dma_min_copy_bytes", "dma_max_copies")


def _cache_dir() -> Path:
    env = os.environ.get("CUPY_SWAP_CACHE_DIR")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "cupy_swap"


def calibration_path(device: int) -> Path:
    """File holding ``device``'s thresholds: named after the GPU model and
    its PCI bus id, so each card of a machine has its own."""
    import cupy

    dev = cupy.cuda.Device(device)
    props = cupy.cuda.runtime.getDeviceProperties(device)
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    slug = re.sub(r"[^A-Za-z0-9]+", "-", f"{name}-{dev.pci_bus_id}").strip("-").lower()
    return _cache_dir() / f"calibration-{slug}.json"


def load_calibration(device: int) -> dict | None:
    """The stored thresholds for ``device``, or None (missing or unreadable
    files are ignored: the defaults are safe)."""
    try:
        data = json.loads(calibration_path(device).read_text())
    except (OSError, ValueError):
        return None
    if not all(isinstance(data.get(k), int) and data[k] >= 0 for k in KEYS):
        return None
    return {k: data[k] for k in KEYS}
