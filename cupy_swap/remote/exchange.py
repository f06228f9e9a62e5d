"""Carrying metadata between processes on one host, through a file.

Moving the bytes of :meth:`RemoteAgent.metadata` is the application's job
(vLLM uses ZMQ, Dynamo etcd).  For processes on one host this module offers
the smallest thing that works without opening a socket: the exporter writes
the blob to a file (mode 0600, renamed into place so a reader never sees half
of it) and the importer polls for the file.  Whoever can read the file can
read and write the registered pools, so keep it in a directory only the
serving user can read, and remove it when done.

Example::

    publish("/dev/shm/kv-prefill.md", prefill.metadata())       # process A
    decode.connect(fetch("/dev/shm/kv-prefill.md", timeout=30))  # process B
"""

from __future__ import annotations

import os
import time

__all__ = ["publish", "fetch"]


def publish(path: str | os.PathLike, blob: bytes) -> None:
    """Write ``blob`` to ``path`` atomically, readable by this user only."""
    path = os.fspath(path)
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def fetch(path: str | os.PathLike, timeout: float = 30.0) -> bytes:
    """Read the blob at ``path``, waiting up to ``timeout`` seconds for it.

    Raises
    ------
    TimeoutError
        No file appeared in time.
    """
    end = time.monotonic() + timeout
    while True:
        try:
            with open(path, "rb") as f:
                return f.read()
        except FileNotFoundError:
            if time.monotonic() > end:
                raise TimeoutError(f"no metadata at {os.fspath(path)} after {timeout} s") from None
            time.sleep(0.01)
