"""A plain-text progress bar for pinning large pools (stderr by default).

**Invariant.**  The bar only formats and writes what it is given: it is
called from the registering thread with a :class:`~.handle.Progress`, never
waits, and never raises into the registration (a closed stream is ignored).
On a terminal it redraws one line (``\\r``); elsewhere (a log file) it writes
a line at most every ``every`` percent, and once at 100 %.
"""

from __future__ import annotations

import sys


class ProgressBar:
    """``bar = ProgressBar("pinning"); pin_pool(..., progress=bar)``.

    Parameters
    ----------
    label : str
        Leading text.
    stream : file, optional
        Where to write (``sys.stderr`` by default).
    width : int
        Characters of the bar.
    every : float
        Percent between lines when the stream is not a terminal.
    """

    def __init__(self, label: str = "pinning", stream=None, width: int = 30, every: float = 10.0):
        self.label, self.stream, self.width, self.every = label, stream, width, every
        self._last = float("-inf")

    def line(self, p) -> str:
        """The text shown for progress ``p``."""
        filled = int(round(self.width * p.fraction))
        rate = p.seconds / (p.bytes_done / 2**30) if p.bytes_done else 0.0
        return (
            f"{self.label} [{'#' * filled}{'.' * (self.width - filled)}] {p.bytes_done / 2**30:7.2f}/"
            f"{p.bytes_total / 2**30:.2f} GiB {100 * p.fraction:5.1f}% chunk {p.chunks_done}/{p.chunks_total} "
            f"{p.seconds:6.1f} s ({rate:.3f} s/GiB)"
        )

    def __call__(self, p) -> None:
        stream = self.stream or sys.stderr
        try:
            tty = stream.isatty()
            pct = 100 * p.fraction
            if tty:
                stream.write("\r" + self.line(p) + ("\n" if p.bytes_done >= p.bytes_total else ""))
            elif pct >= 100 or pct - self._last >= self.every:
                stream.write(self.line(p) + "\n")
                self._last = pct
            stream.flush()
        except (OSError, ValueError):
            pass
