"""Carrying metadata between processes on one host, through a file.

Moving the bytes of :meth:`RemoteAgent.metadata` is the application's job
(vLLM uses ZMQ, Dynamo etcd).  For processes on one host this module offers
the smallest thing that works without opening a socket: the exporter writes
the blob to a file (mode 0600, renamed into place so a reader never sees half
of it) and the importer polls for the file.  Whoever can read the file can
read and write the registered pools, and whoever can write it can make the
importer connect to an agent of their choosing: :func:`fetch` refuses a file
that another user owns or that group or others may read or write.  Keep it in
a private directory (e.g. ``tempfile.mkdtemp()``, mode 0700) rather than a
shared one such as ``/dev/shm`` or ``/tmp``, and remove it when done.

Example::

    publish(f"{private_dir}/kv-prefill.md", prefill.metadata())       # process A
    decode.connect(fetch(f"{private_dir}/kv-prefill.md", timeout=30))  # process B
"""

from __future__ import annotations

import os
import stat
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

    The file must be a regular file owned by the current user with no
    permission for group or others (``mode & 0o077 == 0``, as :func:`publish`
    writes it); it is checked on the open file, so a swap after the check
    does not count.

    Raises
    ------
    TimeoutError
        No file appeared in time.
    PermissionError
        The file is another user's, or group or others may read or write it.
    """
    path = os.fspath(path)
    end = time.monotonic() + timeout
    while True:
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            if time.monotonic() > end:
                raise TimeoutError(f"no metadata at {path} after {timeout} s") from None
            time.sleep(0.01)
            continue
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
                raise PermissionError(
                    f"fetch: refusing metadata at {path}: it must be a regular file owned by this user "
                    f"(uid {os.getuid()}) with no group or other access (got uid {st.st_uid}, mode "
                    f"{oct(stat.S_IMODE(st.st_mode))}); publish() writes it so, in a private directory"
                )
            return f.read()
