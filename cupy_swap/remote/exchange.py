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

import errno
import os
import socket
import stat
import struct
import time

__all__ = ["publish", "fetch", "fetch_from"]


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
    writes it), and not a symbolic link; it is opened with ``O_NONBLOCK |
    O_NOFOLLOW`` (a FIFO or device there cannot block the open) and checked
    with ``fstat`` on the open file before a byte is read, so a swap after
    the check does not count.

    Raises
    ------
    TimeoutError
        No file appeared in time.
    PermissionError
        The file is another user's, group or others may read or write it, it
        is not a regular file, or it is a symbolic link.
    """
    path = os.fspath(path)
    end = time.monotonic() + timeout
    while True:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError:
            if time.monotonic() > end:
                raise TimeoutError(f"no metadata at {path} after {timeout} s") from None
            time.sleep(0.01)
            continue
        except OSError as e:
            if e.errno == errno.ELOOP:  # O_NOFOLLOW met a symbolic link
                raise PermissionError(
                    f"fetch: refusing metadata at {path}: it is a symbolic link; publish() writes a "
                    "regular file, in a private directory"
                ) from None
            raise
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
                raise PermissionError(
                    f"fetch: refusing metadata at {path}: it must be a regular file owned by this user "
                    f"(uid {os.getuid()}) with no group or other access (got uid {st.st_uid}, mode "
                    f"{oct(stat.S_IMODE(st.st_mode))}, {_kind(st.st_mode)}); publish() writes it so, in a "
                    "private directory"
                )
            chunks = []
            while True:
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    return b"".join(chunks)
                chunks.append(chunk)
        finally:
            os.close(fd)


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISREG, "a regular file"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISDIR, "a directory"),
    ):
        if test(mode):
            return name
    return "not a regular file"


# The most bytes fetch_from() accepts: an agent's metadata is a few KiB a
# pool (NIXL's memory keys and the layouts), so this leaves room for
# thousands of pools while a server that claims more cannot make a client
# allocate without bound.
MAX_METADATA_BYTES = 64 << 20


def fetch_from(host: str, port: int, timeout: float = 30.0, *, max_bytes: int = MAX_METADATA_BYTES) -> bytes:
    """The metadata a :class:`RemoteAgent` made with ``listen_port=port``
    serves at ``host`` (it serves to anyone who can reach that address:
    loopback only unless it was given another ``listen_host``).

    Parameters
    ----------
    host : str
    port : int
    timeout : float
        Seconds for the whole fetch: connecting (retried while refused),
        and every byte of the answer.  A server that trickles its answer
        cannot hold the caller past it.
    max_bytes : int
        The largest answer accepted (:data:`MAX_METADATA_BYTES` by default).

    Raises
    ------
    TimeoutError
        Nothing answered, or the whole answer did not come, within ``timeout``.
    ValueError
        The answer is not an agent's metadata, or it announces more than ``max_bytes``.
    """
    end = time.monotonic() + timeout
    while True:
        try:
            try:
                conn = socket.create_connection((host, port), timeout=_left(end, host, port, timeout))
            except TimeoutError as e:  # the connect itself used what was left
                _left(end, host, port, timeout, e)
                continue
            with conn as s:
                head = _recv_exactly(s, 4, end, host, port, timeout)
                if len(head) < 4:
                    raise ValueError(
                        f"fetch_from: {host}:{port} sent {len(head)} bytes, not an agent's metadata"
                    )
                (n,) = struct.unpack("<I", head)
                if n > max_bytes:
                    raise ValueError(
                        f"fetch_from: {host}:{port} announced {n} bytes of metadata, more than the limit of "
                        f"{max_bytes} (max_bytes)"
                    )
                blob = _recv_exactly(s, n, end, host, port, timeout)
        except ConnectionRefusedError as e:  # not listening yet: try again until the deadline
            _left(end, host, port, timeout, e)
            time.sleep(min(0.01, max(0.0, end - time.monotonic())))
            continue
        if len(blob) != n:
            raise ValueError(
                f"fetch_from: {host}:{port} sent {len(blob) + 4} bytes where it announced {n + 4}, not an "
                "agent's metadata"
            )
        return blob


def _left(end: float, host: str, port: int, timeout: float, cause=None) -> float:
    """Seconds left before ``end``; TimeoutError once none are."""
    left = end - time.monotonic()
    if left <= 0:
        raise TimeoutError(f"no metadata served at {host}:{port} within {timeout} s") from cause
    return left


def _recv_exactly(s: socket.socket, n: int, end: float, host: str, port: int, timeout: float) -> bytes:
    """Up to ``n`` bytes (fewer only when the server closed), each read bounded by what is left of ``end``."""
    chunks, got = [], 0
    while got < n:
        s.settimeout(_left(end, host, port, timeout))
        try:
            chunk = s.recv(min(n - got, 1 << 20))
        except TimeoutError as e:
            _left(end, host, port, timeout, e)
            continue  # woke a hair early: the deadline decides
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)
