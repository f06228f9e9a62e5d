"""``bench --plot``: a chart of the ``bench --peers`` or ``bench --engines``
measurements.

``--peers``: blocking GB/s against block size, one line per contender plus
the contiguous-memcpy ceiling, one panel per (direction, block count).
``--engines``: blocking GB/s against the number of blocks, one panel per
(direction, engine shape).  The rows are those the bench measures and
``bench --json FILE`` stores under ``"peers"`` or ``"engines"``, so a stored
run can be charted again on a machine without a GPU
(``bench --from-json FILE --plot out.png``).

matplotlib is imported only when a chart is drawn, and only through its
object API with the Agg canvas: no window, no change to pyplot's backend.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass

from . import engines
from .peers import CONTENDER_LABELS, CONTENDERS

__all__ = [
    "PLOT_FORMATS",
    "INSTALL_HINT",
    "StoredRun",
    "matplotlib_missing",
    "check_plot_file",
    "load_run",
    "size_label",
    "panel_title",
    "plot_peers",
    "plot_engines",
    "plot_run",
]

PLOT_FORMATS = ("png", "svg", "pdf")  # what the Agg canvas writes without further packages
# The project is not on PyPI: the extra comes from a checkout; matplotlib itself is on PyPI.
INSTALL_HINT = 'pip install ".[plot]" from a checkout of cupy_swap, or pip install matplotlib'
CEILING_LABEL = "one contiguous cudaMemcpyAsync (ceiling)"
DIRECTION_TEXT = {"in": "host -> GPU", "out": "GPU -> host"}
# The keys every stored row needs; each contender column is optional.
ROW_KEYS = ("direction", "block_bytes", "num_blocks", "ceiling_gbps")


def matplotlib_missing() -> str | None:
    """None when matplotlib imports, else what to tell the user."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as e:
        return f"needs matplotlib, which cannot be imported ({e}): {INSTALL_HINT}"
    return None


def check_plot_file(path: str) -> str:
    """``path`` when its suffix names a format the chart can be written in.

    Raises
    ------
    ValueError
        For a name without one of :data:`PLOT_FORMATS` as its suffix.
    """
    suffix = os.path.splitext(path)[1].lstrip(".").lower()
    if suffix not in PLOT_FORMATS:
        names = ", ".join("." + f for f in PLOT_FORMATS[:-1]) + " or ." + PLOT_FORMATS[-1]
        raise ValueError(f"expected a file name ending in {names}, got {path!r}")
    return path


@dataclass
class StoredRun:
    """The ``--peers`` part of a report written by ``bench --json``.

    Attributes
    ----------
    path : str
        The file it was read from.
    environment : list of str
        The report's description of the machine (GPU first), may be empty.
    rows : list of dict
        One per case, as :func:`cupy_swap.tools.peers.run_peers_case`
        (``kind == "peers"``) or :func:`cupy_swap.tools.engines.run_engines`
        (``kind == "engines"``) return them.
    kind : str
        ``"peers"`` or ``"engines"``: which part of the bench stored them.
    """

    path: str
    environment: list
    rows: list
    kind: str = "peers"


def load_run(path: str) -> StoredRun:
    """Read and check a report written by ``bench --peers --json FILE``.

    Raises
    ------
    ValueError
        When the file cannot be read, is not JSON, or holds no usable
        ``"peers"`` rows.
    """
    try:
        with open(path) as f:
            report = json.load(f)
    except OSError as e:
        raise ValueError(f"cannot read {path!r} ({e.strerror or e})") from None
    except ValueError as e:
        raise ValueError(f"expected a JSON file, but {path!r} is not one ({e})") from None
    rows = report.get("peers") if isinstance(report, dict) else None
    if not rows and isinstance(report, dict) and report.get("engines"):
        return _load_engines(path, report)
    if not isinstance(rows, list) or not rows:
        raise ValueError(
            f"expected a report of `bench --peers --json` or `bench --engines --json`, but {path!r} "
            'has no "peers" rows (nor "engines" rows)'
        )
    for i, row in enumerate(rows):
        problem = _row_problem(row)
        if problem:
            raise ValueError(f"{path!r}: peers row {i} {problem}")
    if not _contenders(rows):
        raise ValueError(f"{path!r}: the peers rows hold none of {', '.join(CONTENDERS)}")
    environment = report.get("environment") or []
    return StoredRun(path, [str(line) for line in environment], rows)


ENGINE_ROW_KEYS = ("shape", "direction", "num_blocks", "ceiling_gbps")


def _load_engines(path: str, report: dict) -> StoredRun:
    """The ``"engines"`` rows of a report of ``bench --engines --json``."""
    rows = report["engines"]
    if not isinstance(rows, list):
        raise ValueError(f'{path!r}: "engines" is not a list of rows')
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise ValueError(f"{path!r}: engines row {i} is not an object")
        missing = [k for k in ENGINE_ROW_KEYS if k not in row]
        if missing:
            raise ValueError(f"{path!r}: engines row {i} lacks {', '.join(missing)}")
        if row["direction"] not in DIRECTION_TEXT:
            raise ValueError(
                f"{path!r}: engines row {i} has direction {row['direction']!r}, expected in or out"
            )
    environment = report.get("environment") or []
    return StoredRun(path, [str(line) for line in environment], rows, "engines")


def _row_problem(row) -> str | None:
    """What makes a stored row unusable, or None."""
    if not isinstance(row, dict):
        return "is not an object"
    missing = [k for k in ROW_KEYS if k not in row]
    if missing:
        return f"lacks {', '.join(missing)}"
    if row["direction"] not in DIRECTION_TEXT:
        return f"has direction {row['direction']!r}, expected in or out"
    for key in ("block_bytes", "num_blocks"):
        if not isinstance(row[key], int) or row[key] <= 0:
            return f"has {key} {row[key]!r}, expected a positive whole number"
    return None


def size_label(n: int) -> str:
    """``4096`` -> ``"4 KiB"``, ``3 << 19`` -> ``"1.5 MiB"``, ``48`` -> ``"48 B"``."""
    for unit, size in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n} B"


def panel_title(direction: str, num_blocks: int) -> str:
    """``("in", 16)`` -> ``"host -> GPU, 16 blocks"``."""
    return f"{DIRECTION_TEXT.get(direction, direction)}, {num_blocks} block{'s' if num_blocks != 1 else ''}"


def _contenders(rows: list) -> list[str]:
    """The contenders measured in ``rows``, in the table's order."""
    return [name for name in CONTENDERS if any(name in r for r in rows)]


def _panels(rows: list) -> tuple[list[str], list[int]]:
    """Directions (in before out) and block counts (ascending) of ``rows``."""
    directions = [d for d in DIRECTION_TEXT if any(r["direction"] == d for r in rows)]
    return directions, sorted({r["num_blocks"] for r in rows})


def _series(rows: list, key: str) -> tuple[list[int], list[float]]:
    """Block sizes and GB/s of ``key``; a contender whose bytes did not
    match has no point there (its speed means nothing)."""
    points = sorted(
        (r["block_bytes"], r[key])
        for r in rows
        if key in r
        and r.get(key + "_ok", True)
        and isinstance(r[key], (int, float))
        and math.isfinite(r[key])
    )
    return [b for b, _ in points], [g for _, g in points]


def _draw_panel(ax, rows: list, contenders: list[str], title: str) -> None:
    from matplotlib.ticker import FixedLocator, NullLocator

    for i, name in enumerate(contenders):
        x, y = _series(rows, name)
        ours = name.startswith("cupy_swap")  # the library's own lines stand out
        ax.plot(x, y, marker="os^vDP"[i % 6], linewidth=2.2 if ours else 1.3, label=CONTENDER_LABELS[name])
    x, y = _series(rows, "ceiling_gbps")
    ax.plot(x, y, color="black", linestyle="--", linewidth=1.2, label=CEILING_LABEL)
    sizes = sorted({r["block_bytes"] for r in rows})
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(sizes))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticklabels([size_label(s) for s in sizes])
    ax.set_ylim(bottom=0)
    ax.set_title(title)
    ax.set_xlabel("block size")
    ax.set_ylabel("GB/s (blocking)")
    ax.grid(True, alpha=0.3)


def plot_peers(rows: list, path: str | None = None, *, title: str | None = None):
    """Draw the peers rows; write the chart to ``path`` when given.

    Parameters
    ----------
    rows : list of dict
        As :func:`cupy_swap.tools.peers.run_peers_case` returns them (the
        ``"peers"`` list of a ``bench --json`` report).
    path : str, optional
        Where to write the chart; the suffix picks the format
        (:data:`PLOT_FORMATS`).
    title : str, optional
        A line above the panels, e.g. the GPU the rows were measured on.

    Returns
    -------
    matplotlib.figure.Figure
        One axes per (direction, block count) present in ``rows``, each with
        one line per contender plus the ceiling, and one legend for all.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    directions, counts = _panels(rows)
    contenders = _contenders(rows)
    fig = Figure(figsize=(4.6 * len(counts), 3.6 * len(directions) + 1.2), layout="constrained")
    FigureCanvasAgg(fig)  # Agg: files only, never a window
    grid = fig.subplots(len(directions), len(counts), squeeze=False)
    for di, direction in enumerate(directions):
        for ci, n in enumerate(counts):
            ax = grid[di][ci]
            cell = [r for r in rows if r["direction"] == direction and r["num_blocks"] == n]
            if cell:
                _draw_panel(ax, cell, contenders, panel_title(direction, n))
            else:
                fig.delaxes(ax)  # a combination the run did not measure
    handles, labels = fig.axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=min(len(labels), 3), frameon=False)
    blocks = "consecutive blocks" if all(r.get("contiguous") for r in rows) else "random blocks"
    heading = f"blocking GB/s (submit + synchronize, median) by block size, {blocks}"
    fig.suptitle(f"{heading}\n{title}" if title else heading)
    if path is not None:
        fig.savefig(path, dpi=120, bbox_inches="tight")  # tight: a long legend is never cut off
    return fig


def _engine_series(rows: list, key: str) -> tuple[list[int], list[float]]:
    """Block counts and GB/s of ``key`` (points whose bytes did not match left out)."""
    points = sorted(
        (r["num_blocks"], r[key])
        for r in rows
        if key in r
        and r.get(key + "_ok", True)
        and isinstance(r[key], (int, float))
        and math.isfinite(r[key])
    )
    return [n for n, _ in points], [g for _, g in points]


def plot_engines(rows: list, path: str | None = None, *, title: str | None = None):
    """Draw ``bench --engines`` rows: GB/s against the number of blocks, one
    panel per (direction, shape), one line per contender and the ceiling.

    Parameters
    ----------
    rows : list of dict
        As :func:`cupy_swap.tools.engines.run_engines` returns them.
    path : str, optional
        Where to write the chart (:data:`PLOT_FORMATS`).
    title : str, optional
        A line above the panels.

    Returns
    -------
    matplotlib.figure.Figure
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import FixedLocator, NullLocator

    directions = [d for d in DIRECTION_TEXT if any(r["direction"] == d for r in rows)]
    keys = [s.key for s in engines.SHAPES if any(r["shape"] == s.key for r in rows)]
    keys += sorted({r["shape"] for r in rows} - set(keys))
    shapes = {s.key: s for s in engines.SHAPES}
    fig = Figure(figsize=(4.2 * len(keys), 3.5 * len(directions) + 1.2), layout="constrained")
    FigureCanvasAgg(fig)
    grid = fig.subplots(len(directions), len(keys), squeeze=False)
    for di, direction in enumerate(directions):
        for ki, key in enumerate(keys):
            ax = grid[di][ki]
            cell = [r for r in rows if r["direction"] == direction and r["shape"] == key]
            if not cell:
                fig.delaxes(ax)
                continue
            for i, name in enumerate(engines.CONTENDERS):
                x, y = _engine_series(cell, name)
                ours = name in engines.OURS
                ax.plot(
                    x, y, marker="os^vD"[i % 5], linewidth=2.2 if ours else 1.3, label=engines.LABELS[name]
                )
            x, y = _engine_series(cell, "ceiling_gbps")
            ax.plot(x, y, color="black", linestyle="--", linewidth=1.2, label=CEILING_LABEL)
            counts = sorted({r["num_blocks"] for r in cell})
            ax.set_xscale("log")
            ax.xaxis.set_major_locator(FixedLocator(counts))
            ax.xaxis.set_minor_locator(NullLocator())
            ax.set_xticklabels([str(n) for n in counts])
            ax.set_ylim(bottom=0)
            shape = shapes.get(key)
            ax.set_title(f"{shape.label() if shape else key}, {DIRECTION_TEXT[direction]}")
            ax.set_xlabel("blocks per swap")
            ax.set_ylabel("GB/s (blocking)")
            ax.grid(True, alpha=0.3)
    handles, labels = fig.axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=2, frameon=False)
    heading = "engine-shaped swaps: blocking GB/s (submit + synchronize) by blocks per swap, random blocks"
    fig.suptitle(f"{heading}\n{title}" if title else heading)
    if path is not None:
        fig.savefig(path, dpi=110, bbox_inches="tight")
    return fig


def plot_run(kind: str, rows: list, path: str | None = None, *, title: str | None = None):
    """:func:`plot_peers` or :func:`plot_engines`, by ``kind``."""
    return (plot_engines if kind == "engines" else plot_peers)(rows, path, title=title)
