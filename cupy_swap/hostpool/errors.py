"""A failed registration: one clear error, and no CUDA error left pending.

**Invariant.**  After :func:`clear_pending` returns, ``cudaGetLastError`` of
every CUDA runtime loaded in the process (CuPy's, torch's) reports success in
the calling thread, so a later, unrelated call does not report the failed
``cudaHostRegister`` as its own (vLLM saw a bogus out-of-memory that way,
#51081).  :func:`registration_error` names the size, the locked-memory limit
(``ulimit -l``) and the free memory.
"""

from __future__ import annotations

import ctypes
import re


class PinError(RuntimeError):
    """A host pool could not be page-locked.

    Attributes
    ----------
    nbytes : int
        Bytes of the failing ``cudaHostRegister`` call (one chunk).
    chunk : int
        Its index.
    pinned_rows : int
        Rows ``[0, pinned_rows)`` of the pool were pinned before it and stay
        usable until the pool is freed.
    """

    def __init__(self, message: str, nbytes: int = 0, chunk: int = -1, pinned_rows: int = 0):
        super().__init__(message)
        self.nbytes, self.chunk, self.pinned_rows = nbytes, chunk, pinned_rows


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


def memlock_limit() -> str:
    """The locked-memory limit in words (``ulimit -l``)."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    except (ImportError, ValueError, OSError):
        return "unknown"
    return "unlimited" if soft == resource.RLIM_INFINITY else f"{soft} bytes ({_gib(soft)})"


def available_memory(meminfo: str = "/proc/meminfo") -> int | None:
    """``MemAvailable`` in bytes, or None."""
    try:
        text = open(meminfo).read()
    except OSError:
        return None
    m = re.search(r"^MemAvailable:\s+(\d+)\s*kB", text, re.MULTILINE)
    return int(m.group(1)) * 1024 if m else None


def registration_error(
    cause: BaseException, what: str, nbytes: int, total: int, chunk: int, chunks: int, pinned_rows: int
) -> PinError:
    """The one error a failed chunk registration raises."""
    avail = available_memory()
    free = "unknown" if avail is None else _gib(avail)
    return PinError(
        f"{what}: expected to page-lock chunk {chunk} of {chunks} ({nbytes} bytes, {_gib(nbytes)}; pool "
        f"{_gib(total)}) with cudaHostRegister, got {type(cause).__name__}: {cause}. Locked-memory limit "
        f"(ulimit -l): {memlock_limit()}; memory available: {free}. Raise the limit (`ulimit -l unlimited`, "
        f"the container's memlock limit), pin a smaller pool, or free memory; rows [0, {pinned_rows}) "
        f"stay pinned until the pool is freed. No CUDA error is left pending.",
        nbytes,
        chunk,
        pinned_rows,
    )


def _loaded_cudarts() -> list[str]:
    """Paths of the CUDA runtimes mapped into this process."""
    paths = []
    try:
        for line in open("/proc/self/maps"):
            fields = line.split()
            path = fields[5] if len(fields) >= 6 else ""
            if "libcudart" in path and path not in paths:
                paths.append(path)
    except OSError:
        pass
    return paths


def clear_pending() -> list[int]:
    """Read (and so clear) the last error of every loaded CUDA runtime in this
    thread; the codes read (0 where none was pending)."""
    codes = []
    try:
        from cupy.cuda import runtime

        get = getattr(runtime, "getLastError", None)
        if get is not None:
            codes.append(int(get() or 0))
    except Exception:  # noqa: BLE001 - best effort: no CuPy, no runtime
        pass
    for path in _loaded_cudarts():
        try:
            lib = ctypes.CDLL(path, mode=getattr(ctypes, "RTLD_NOLOAD", 4) | ctypes.RTLD_GLOBAL)
            codes.append(int(lib.cudaGetLastError()))
        except (OSError, AttributeError):
            pass
    return codes
