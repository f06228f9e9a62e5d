"""The chunk size of host-pool registration: one setting with a getter, a
setter, a reset, a context manager and an environment variable
(``CUPY_SWAP_PIN_CHUNK_BYTES``), as kvikio keeps its settings.

**Invariant.**  :func:`chunk_bytes` always returns a positive int: the value
set by :func:`set_chunk_bytes` (or :func:`chunk_bytes_set`), else the
environment variable read at each call, else :data:`DEFAULT_CHUNK_BYTES`
(64 GiB: vLLM saw one ``cudaHostRegister`` of 512 GiB fail, #51081).  A bad
value is refused when it is set, or, for the environment variable, when it
is read, naming the variable.
"""

from __future__ import annotations

import contextlib
import os
import re

ENV = "CUPY_SWAP_PIN_CHUNK_BYTES"
DEFAULT_CHUNK_BYTES = 64 << 30
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_TEXT = re.compile(r"\s*(\d+)\s*([kmgt]?)(?:i?b)?\s*", re.IGNORECASE)
_set: list = []  # [value] while set in this process


def parse_bytes(value, name: str) -> int:
    """A positive byte count from an int or a text such as ``"1G"``,
    ``"512MiB"`` or ``"4096"`` (binary units).

    Raises
    ------
    TypeError, ValueError
        Naming ``name``, what was expected and what came.
    """
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise TypeError(f"{name}: expected a positive int of bytes or a text like '1G', got {value!r}")
    if isinstance(value, str):
        m = _TEXT.fullmatch(value)
        if not m:
            raise ValueError(f"{name}: expected a byte count like '4096', '512M' or '64G', got {value!r}")
        value = int(m.group(1)) * _UNITS[m.group(2).lower()]
    if value <= 0:
        raise ValueError(f"{name}: expected a positive number of bytes, got {value}")
    return int(value)


def chunk_bytes() -> int:
    """Largest number of bytes one ``cudaHostRegister`` call pins (pools are
    cut at block-row boundaries below it)."""
    if _set:
        return _set[0]
    env = os.environ.get(ENV, "")
    return parse_bytes(env, ENV) if env.strip() else DEFAULT_CHUNK_BYTES


def set_chunk_bytes(value) -> None:
    """Set the chunk size for this process (int or text, e.g. ``"1G"``)."""
    value = parse_bytes(value, "value")
    _set[:] = [value]


def reset_chunk_bytes() -> None:
    """Back to the environment variable, else the default."""
    _set.clear()


@contextlib.contextmanager
def chunk_bytes_set(value):
    """The chunk size ``value`` inside the block, the previous one after."""
    saved = list(_set)
    set_chunk_bytes(value)
    try:
        yield chunk_bytes()
    finally:
        _set[:] = saved
