"""What every command of the command line shares: exit codes, the GPU check,
the machine's description, argument types checked while parsing (so a bad
one exits 2 before any GPU is looked for), and writing a report.

Imported by :mod:`.cli` and the command modules (:mod:`.cli_demo`,
:mod:`.cli_bench`, :mod:`.cli_info`, :mod:`.remote_bench`); nothing here imports CuPy at module
level.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

from .. import __version__
from ..cuda.availability import no_gpu_message
from .bench import gpu_status

__all__ = [
    "EXIT_OK",
    "EXIT_MISMATCH",
    "EXIT_USAGE",
    "EXIT_NO_GPU",
    "EXIT_TEXT",
    "default_prog",
    "gpu_status",
    "require_gpu",
    "device_count",
    "environment_lines",
    "Progress",
    "parse_sizes",
    "sizes_arg",
    "positive_int",
    "gpus_arg",
    "check_output_file",
    "output_file_arg",
    "counts_arg",
    "choices_arg",
    "Given",
    "GivenFlag",
    "write_report",
    "chart_title",
]

EXIT_OK = 0
EXIT_MISMATCH = 1  # a swap's bytes did not match (demo, bench)
EXIT_USAGE = 2  # argparse's own code for a bad command line
EXIT_NO_GPU = 3  # no usable NVIDIA GPU: no driver, no device, driver too old, or no CuPy


EXIT_TEXT = f"""\
exit status:
  {EXIT_OK}  success
  {EXIT_MISMATCH}  a swap's bytes did not match
  {EXIT_USAGE}  bad command line (checked before anything is measured; bench --gpus as soon as
     the GPU count is known, the rest before any GPU is looked for)
  {EXIT_NO_GPU}  no usable NVIDIA GPU (no driver, no device, a driver too old, or CuPy missing)"""


def default_prog() -> str:
    """How the user ran the command line: ``python -m cupy_swap`` or
    ``cupy-swap`` (the console script, and anything else)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return "python -m cupy_swap" if getattr(spec, "name", None) == "cupy_swap.__main__" else "cupy-swap"


def require_gpu() -> str:
    """The GPU's description, or exit :data:`EXIT_NO_GPU` saying what is
    missing: CuPy, or a usable GPU (and why)."""
    ok, what = gpu_status()
    if not ok:
        if what.startswith("CuPy"):  # gpu_status's reason when `import cupy` failed
            needs = f"CuPy (exit status {EXIT_NO_GPU}: CuPy missing)"
        else:
            needs = f"an NVIDIA GPU and its driver (exit status {EXIT_NO_GPU}: no usable GPU)"
        print(f"cupy_swap: {no_gpu_message(what)}; this command needs {needs}.", file=sys.stderr)  # one line
        raise SystemExit(EXIT_NO_GPU)
    return what


def device_count() -> int:
    """CUDA devices visible to this process (CUDA is known to answer)."""
    from cupy.cuda import runtime

    return runtime.getDeviceCount()


def environment_lines() -> list[str]:
    """GPU, PCIe link (NVML, when available), driver, CUDA and CuPy versions."""
    import cupy
    from cupy.cuda import runtime

    dev = runtime.getDevice()
    props = runtime.getDeviceProperties(dev)
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    drv, rt = runtime.driverGetVersion(), runtime.runtimeGetVersion()
    lines = [
        f"GPU {dev}: {name}, {props['multiProcessorCount']} SMs",
        f"driver CUDA {drv // 1000}.{drv % 1000 // 10}, runtime CUDA {rt // 1000}.{rt % 1000 // 10}, "
        f"CuPy {cupy.__version__}, cupy_swap {__version__}",
    ]
    try:
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(dev)
        gen = pynvml.nvmlDeviceGetCurrPcieLinkGeneration(h)
        width = pynvml.nvmlDeviceGetCurrPcieLinkWidth(h)
        mgen = pynvml.nvmlDeviceGetMaxPcieLinkGeneration(h)
        mwidth = pynvml.nvmlDeviceGetMaxPcieLinkWidth(h)
        ver = pynvml.nvmlSystemGetDriverVersion()
        ver = ver.decode() if isinstance(ver, bytes) else ver
        lines.append(f"PCIe link: Gen{gen} x{width} (max Gen{mgen} x{mwidth}), driver {ver}")
    except Exception as e:  # NVML missing or refused: say so, do not guess
        lines.append(f"PCIe link: unknown (NVML unavailable: {type(e).__name__})")
    return lines


class Progress:
    """A one-line progress bar on stderr, shown only for sweeps that run
    longer than a couple of seconds and only on a terminal."""

    def __init__(self, total: int, enabled: bool = True):
        self.total, self.done, self.t0 = total, 0, time.perf_counter()
        self.enabled = enabled and sys.stderr.isatty()

    def step(self, label: str) -> None:
        self.done += 1
        if self.enabled and time.perf_counter() - self.t0 > 2.0:
            width = 30
            fill = width * self.done // self.total
            sys.stderr.write(f"\r[{'#' * fill}{'.' * (width - fill)}] {self.done}/{self.total} {label:<40}")
            sys.stderr.flush()

    def close(self) -> None:
        if self.enabled and time.perf_counter() - self.t0 > 2.0:
            sys.stderr.write("\r" + " " * 80 + "\r")


def parse_sizes(text: str) -> list[int]:
    """``"4k,32KiB,2m,16b,48"`` -> byte counts.

    Raises
    ------
    ValueError
        For a token that is not a positive whole number with an optional
        ``b``, ``k``/``KiB`` or ``m``/``MiB`` suffix.
    """
    out = []
    for raw in text.split(","):
        tok = raw.strip().lower()
        mult = 1
        for suffix, m in (("kib", 1 << 10), ("k", 1 << 10), ("mib", 1 << 20), ("m", 1 << 20), ("b", 1)):
            if tok.endswith(suffix):
                tok, mult = tok[: -len(suffix)], m
                break
        if not tok.strip().isdigit() or int(tok) <= 0:
            raise ValueError(f"{raw.strip()!r} is not a size such as 4096, 4k, 32KiB or 2m")
        out.append(int(tok) * mult)
    return out


def sizes_arg(text: str) -> list[int]:
    try:
        return parse_sizes(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive whole number")
    return n


def gpus_arg(text: str):
    if text == "all":
        return "all"
    try:
        devices = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected 'all' or a comma list of GPU indices, got {text!r}"
        ) from None
    if not devices or any(d < 0 for d in devices) or len(set(devices)) != len(devices):
        raise argparse.ArgumentTypeError(f"expected distinct non-negative GPU indices, got {text!r}")
    return devices


def check_output_file(path: str) -> str:
    """``path`` when a file can be written there, checked before a run so
    that its figures are not lost at the end.

    Parameters
    ----------
    path : str
        A file to create or overwrite.

    Returns
    -------
    str
        ``path`` unchanged.

    Raises
    ------
    ValueError
        When ``path`` is empty or a directory, its directory does not exist
        or is not a directory, or the file or its directory is not writable.
    """
    if not path:
        raise ValueError("expected a file name, got ''")
    if os.path.isdir(path):
        raise ValueError(f"expected a file name, got {path!r}, a directory")
    parent = os.path.dirname(path) or "."
    if not os.path.exists(parent):
        raise ValueError(f"expected an existing directory for {path!r}, but {parent!r} does not exist")
    if not os.path.isdir(parent):
        raise ValueError(f"expected a directory for {path!r}, but {parent!r} is not one")
    if os.path.exists(path):
        if not os.access(path, os.W_OK):
            raise ValueError(f"expected a writable file, but {path!r} is not writable")
    elif not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"expected a writable directory for {path!r}, but {parent!r} is not writable")
    return path


def output_file_arg(text: str) -> str:
    try:
        return check_output_file(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def counts_arg(text: str) -> list[int]:
    return [positive_int(t.strip()) for t in text.split(",")]


def choices_arg(allowed: tuple[str, ...]):
    def parse(text: str) -> list[str]:
        out = [t.strip() for t in text.split(",")]
        bad = [t for t in out if t not in allowed]
        if bad:
            raise argparse.ArgumentTypeError(
                f"{', '.join(map(repr, bad))} not among {', '.join(allowed)} (a comma list of those)"
            )
        return out

    parse.__name__ = "comma list"  # argparse names the type in its messages
    return parse


class Given(argparse.Action):
    """``store``, noting the option's dest in ``namespace.given``, so that
    ``bench`` can tell an option the user gave from one left at its default."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        namespace.given = getattr(namespace, "given", frozenset()) | {self.dest}


class GivenFlag(Given):
    """``store_true`` that notes the option as :class:`Given` does."""

    def __init__(self, option_strings, dest, default=False, help=None):
        super().__init__(option_strings, dest, nargs=0, default=default, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        super().__call__(parser, namespace, True, option_string)


def write_report(path: str, report: dict) -> None:
    """Write ``report`` as JSON to ``path``; should that fail after all (the
    path was checked before the run), keep the figures in a temporary file
    and say where."""
    try:
        with open(path, "w") as f:
            json.dump(report, f, indent=1)
    except OSError as e:
        fd, spare = tempfile.mkstemp(prefix="cupy_swap-bench-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump(report, f, indent=1)
        print(f"cupy_swap: could not write --json {path} ({e}); the figures are in {spare}", file=sys.stderr)


def chart_title(environment: list) -> str | None:
    """The GPU and its PCIe link, from a report's environment lines."""
    wanted = [line for line in environment if line.startswith(("GPU", "PCIe link"))]
    return "; ".join(wanted) or None
