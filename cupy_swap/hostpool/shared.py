"""A pinned host pool shared by processes: POSIX shared memory, page-locked
and mapped for kernels in every process that opens it, so a block swapped
out by one process can be swapped in by another.

Trust: a process maps only a pool file its own user could have made.  The
name is opened with ``O_NOFOLLOW | O_NONBLOCK`` (a symbolic link is refused,
a FIFO cannot block) and the opened file, by ``fstat``, must be a regular
file owned by the caller's effective uid with no permission bits beyond
0o600; with ``mode=0o660``, asked for at creation and at opening by ranks that
run as different users of one group, it may also be another user's, of mode
exactly 0o660 and of one of the caller's groups.  Anything else raises
:class:`PermissionError` before it is mapped: ``/dev/shm`` is writable by
every user, and a file planted or widened there would read or feed the KV
cache.  :func:`unlink_shared` removes only the caller's own entries.

The segment is ``/dev/shm/cupy_swap.<name>``: a one-page header (magic,
dtype, shape, a ready byte), then the data, page-aligned.  As with any POSIX
shared memory, the name lasts until :func:`unlink_shared`, and the memory
while the name exists or any process maps it (a process killed mid-swap
leaves only the blocks it was writing undefined).
"""

from __future__ import annotations

import ctypes
import errno
import functools
import json
import math
import mmap
import os
import re
import stat

import numpy as np

from ..cuda import memory, release
from ..cuda.availability import cuda_unavailable_error, translate_unavailable

SHM_DIR = "/dev/shm"
_PREFIX = "cupy_swap."
_MAGIC = b"cupy_swap shared pool v1\n"


def header_bytes(page_bytes: int) -> int:
    """Bytes before a pool's data: at least one page (64 KiB on many aarch64
    hosts), so the data starts page-aligned."""
    return max(4096, page_bytes)


HEADER_BYTES = header_bytes(mmap.PAGESIZE)
_READY = 0x5A  # last header byte, written once the header is complete
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,200}")


def segment_path(name: str) -> str:
    """``/dev/shm`` path of pool ``name`` (checked: letters, digits, ``_.-``)."""
    if not isinstance(name, str) or not _NAME.fullmatch(name) or name in (".", ".."):
        raise ValueError(f"name: expected 1-200 characters of letters, digits, '_', '.' or '-', got {name!r}")
    return os.path.join(SHM_DIR, _PREFIX + name)


def _octal(bits: int) -> str:
    return f"0o{bits:03o}"


def _check_mode(mode) -> None:
    if type(mode) is not int or mode not in (0o600, 0o660):
        got = _octal(mode) if type(mode) is int and mode >= 0 else repr(mode)
        raise ValueError(
            f"mode: expected 0o600 (only your user) or 0o660 (your user and your group), got {got}"
        )


def _why_untrusted(st: os.stat_result, mode: int) -> str | None:
    """Why the file of ``st`` may not be opened as a pool under ``mode``
    (the rule of the module docstring), or None."""
    perm = stat.S_IMODE(st.st_mode)
    if stat.S_ISLNK(st.st_mode):
        return "is a symbolic link"
    if stat.S_ISDIR(st.st_mode):
        return "is a directory"
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file"
    if perm & ~(0o700 | mode):
        return f"has mode bits {_octal(perm & ~(0o700 | mode))} beyond what mode={_octal(mode)} allows"
    if st.st_uid != os.geteuid() and (mode != 0o660 or perm != 0o660):
        return "is another user's"
    if perm & 0o070 and st.st_gid not in {os.getegid(), *os.getgroups()}:
        return f"gives group {st.st_gid} access, not one of your groups"
    return None


def _refusal(name: str, path: str, st: os.stat_result, why: str) -> PermissionError:
    if st.st_uid != os.geteuid():
        fix = f"have its owner (uid {st.st_uid}) remove it, e.g. unlink_shared({name!r}) as that user"
    elif stat.S_ISDIR(st.st_mode):
        fix = f"remove the directory {path} if it is yours to remove"
    else:
        fix = f"unlink_shared({name!r}) removes it if it is your own leftover"
    return PermissionError(
        errno.EACCES,
        f"name: shared pool {name!r} refused: {path} {why} (owner uid {st.st_uid}, gid {st.st_gid}, "
        f"mode {_octal(stat.S_IMODE(st.st_mode))}); expected a regular file of uid {os.geteuid()} with "
        f"mode 0o600 (or 0o660 of one of your groups, opened with mode=0o660); {fix}",
        path,
    )


def _header(shape: tuple[int, ...], dtype: np.dtype) -> bytes:
    # dtype_to_descr keeps structured dtypes' fields (dtype.str would say |V8).
    meta = json.dumps({"dtype": np.lib.format.dtype_to_descr(dtype), "shape": list(shape)}).encode()
    body = _MAGIC + meta + b"\n"
    if len(body) >= HEADER_BYTES:
        raise ValueError(
            f"shape, dtype: expected a shape and dtype that fit the pool header, got {len(body)} bytes"
        )
    return body


def _as_descr(value):
    """A dtype descr read back from JSON (lists where NumPy wants tuples)."""
    if isinstance(value, str):
        return value
    return [
        tuple(_as_descr(x) if isinstance(x, list) and i == 1 else x for i, x in enumerate(f)) for f in value
    ]


def _unfinished(name: str) -> RuntimeError:
    return RuntimeError(
        f"name: shared pool {name!r} exists but its creator has not finished setting it up "
        f"(or died while doing so); retry, or unlink_shared({name!r}) and create it again"
    )


def _read_header(head: bytes, name: str) -> tuple[tuple[int, ...], np.dtype]:
    """Shape and dtype from a pool's header page."""
    if not head.startswith(_MAGIC):
        if not any(head):  # a creator between ftruncate and its header
            raise _unfinished(name)
        raise ValueError(f"name: {segment_path(name)} exists but is not a cupy_swap shared pool")
    if head[-1] != _READY:
        raise _unfinished(name)
    try:
        meta = json.loads(head[len(_MAGIC) : head.index(b"\n", len(_MAGIC))])
        return tuple(int(x) for x in meta["shape"]), np.lib.format.descr_to_dtype(_as_descr(meta["dtype"]))
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"name: {segment_path(name)} has a damaged cupy_swap pool header ({e})") from None


def open_segment(name: str, shape, dtype, create: bool, mode: int = 0o600):
    """Create or open the segment of pool ``name`` and map it: ``(mapping of
    header and data, data bytes)``; raises as :func:`shared_pinned`."""
    path = segment_path(name)
    _check_mode(mode)
    shape = memory._normalize_shape(shape)
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    if dtype.hasobject:
        raise TypeError(f"dtype: expected a plain data type, got {dtype} (objects cannot be shared)")
    if nbytes == 0:
        raise ValueError(f"shape: expected a pool of at least one byte, got shape {shape} of {dtype}")
    if create:
        return _create(name, path, shape, dtype, nbytes, mode)
    return _open(name, path, shape, dtype, nbytes, mode)


def _create(name: str, path: str, shape, dtype: np.dtype, nbytes: int, mode: int):
    header = _header(shape, dtype)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, mode)
    except FileExistsError:
        raise FileExistsError(
            errno.EEXIST,
            f"name: shared pool {name!r} already exists; open it with create=False, or "
            f"unlink_shared({name!r}) first if it is left over from a run that ended",
            path,
        ) from None
    try:
        os.fchmod(fd, mode)  # exactly mode, whatever the umask took off
        os.ftruncate(fd, HEADER_BYTES + nbytes)
        # Reserve the pages now: a tmpfs too small for the pool fails here
        # with ENOSPC instead of a SIGBUS on first touch.
        os.posix_fallocate(fd, 0, HEADER_BYTES + nbytes)
        mm = mmap.mmap(fd, HEADER_BYTES + nbytes)
        mm[: len(header)] = header
        # The ready byte goes in by a system call after the header's stores,
        # and openers read it by one before the header: a fence both sides.
        os.pwrite(fd, bytes([_READY]), HEADER_BYTES - 1)
    except BaseException as e:  # Ctrl-C in a long fallocate included: leave no half-made name
        os.close(fd)
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        if isinstance(e, OSError) and e.errno == errno.ENOSPC:
            raise OSError(
                errno.ENOSPC,
                f"shape: a shared pool of {HEADER_BYTES + nbytes} bytes does not fit in "
                f"{SHM_DIR} ({e.strerror}); enlarge it (e.g. docker --shm-size)",
            ) from None
        raise
    os.close(fd)
    return mm, nbytes


def _open(name: str, path: str, shape, dtype: np.dtype, nbytes: int, mode: int):
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        raise FileNotFoundError(
            errno.ENOENT, f"name: no shared pool {name!r}; create it with create=True", path
        ) from None
    except OSError:  # a link (ELOOP), a directory (EISDIR), another's file (EACCES): say which
        try:
            st = os.lstat(path)
        except OSError:
            st = None
        why = None if st is None else _why_untrusted(st, mode)
        if why is None:
            raise  # the open's error
        raise _refusal(name, path, st, why) from None
    try:
        st = os.fstat(fd)  # the file opened, not whatever the name points to by now
        why = _why_untrusted(st, mode)
        if why is not None:
            raise _refusal(name, path, st, why)
        size = st.st_size
        head = os.pread(fd, HEADER_BYTES, 0) if size >= HEADER_BYTES else b""
        if len(head) < HEADER_BYTES:
            raise _unfinished(name)
        have_shape, have_dtype = _read_header(head, name)
        if have_shape != shape or have_dtype != dtype:
            raise ValueError(
                f"shape, dtype: shared pool {name!r} holds shape {have_shape} of {have_dtype}, "
                f"expected shape {shape} of {dtype}"
            )
        if size < HEADER_BYTES + nbytes:
            raise ValueError(f"name: shared pool {name!r} is truncated ({size} bytes)")
        return mmap.mmap(fd, HEADER_BYTES + nbytes), nbytes
    finally:
        os.close(fd)


class _SharedBuffer:
    """Owner of one process's mapping of a pool, exposed to NumPy; once every
    array on it is gone, the releaser unregisters and unmaps it
    (:func:`cupy_swap.cuda.memory.release_owned`)."""

    def __init__(self, mm, nbytes: int, shape, dtype: np.dtype, name: str):
        self.name = name
        # The buffer export dies with the temporary, so mm can close later.
        ptr = ctypes.addressof(ctypes.c_char.from_buffer(mm)) + HEADER_BYTES
        try:
            memory.register_range(ptr, nbytes, owned=True)
        except Exception as e:
            mm.close()
            raise _register_error(e, name, nbytes) from None
        device = memory._runtime().getDevice()
        unpin = functools.partial(memory.release_owned, ptr, functools.partial(_unpin, mm), device)
        self._finalizer = release.when_dropped(self, unpin, None, f"shared pool {name!r}")
        self.__array_interface__ = memory.array_interface(ptr, shape, dtype)


def _unpin(mm, ptr: int) -> None:
    """Unregister a dropped pool range, then unmap it (never before: CUDA
    would keep a registered range with no memory behind)."""
    try:
        memory._runtime().hostUnregister(ptr)
    except BaseException:
        release.keep_for_process(mm)  # CUDA may still hold the pages: never unmap them
        raise
    mm.close()


def _register_error(e: Exception, name: str, nbytes: int) -> Exception:
    unavailable = cuda_unavailable_error(e, f"shared_pinned({name!r})")
    if unavailable is not None:  # no driver or no GPU: not a locked-memory limit
        return unavailable
    limit = ""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
        if soft != resource.RLIM_INFINITY:
            limit = f"; the locked-memory limit (ulimit -l) is {soft} bytes"
    except (ImportError, ValueError, OSError):
        pass
    return RuntimeError(
        f"shared pool {name!r}: expected to page-lock {nbytes} bytes (cudaHostRegister), got {e}"
        f"{limit}; if the cause is memory, raise the locked-memory limit (`ulimit -l`, or the "
        f"container's memlock limit)"
    )


@translate_unavailable("shared_pinned()")
def shared_pinned(
    name: str, shape, dtype="float32", *, create: bool = False, mode: int = 0o600
) -> np.ndarray:
    """A pinned host pool shared by every process that opens ``name``.

    Like :func:`cupy_swap.empty_pinned`, but backed by POSIX shared memory, so
    other processes (one per GPU, as inference servers run) open the same
    bytes: a block one process swaps out, another can swap in (e.g. one copy
    of an MLA model's latent KV for all tensor-parallel ranks).

    Parameters
    ----------
    name : str
        Pool name (letters, digits, ``_``, ``.``, ``-``); the segment is
        ``/dev/shm/cupy_swap.<name>``.
    shape : int or tuple of int
        e.g. ``(num_blocks, 16, 8, 128)``; openers must pass the same.
    dtype : numpy dtype-like
        Openers must pass the same.
    create : bool
        True: make a new pool (zero-filled by the kernel) and fail if the
        name is taken.  False: open an existing one.
    mode : {0o600, 0o660}
        Who may open the pool; the creator and every opener pass the same.
        0o600 (default): only this user.  The file is made with mode 0o600;
        opening accepts only a regular file of this user (effective uid)
        with no group or other bits (a 0o660 pool is refused).
        0o660: ranks that run as different users of one group.  The file is
        made with mode exactly 0o660 (whatever the umask), of the creator's
        effective gid; opening accepts a regular file of this user of mode
        0o600, or of any user of mode exactly 0o660 whose group is one of
        the opener's.  No other mode exists: a pool is never world-readable.

    Returns
    -------
    numpy.ndarray
        C-contiguous, of ``shape`` and ``dtype``.  This process's mapping
        lasts until the array and every view are gone; the name lasts until
        :func:`unlink_shared`.

    Raises
    ------
    FileExistsError
        ``create=True`` and the name is taken.
    FileNotFoundError
        ``create=False`` and no pool has that name.
    PermissionError
        ``create=False`` and the file at the name breaks ``mode``'s rule: a
        symbolic link, a directory, a FIFO or other non-regular file,
        another user's file, or wider permissions (or a group not one's own).
        Raised before anything is mapped; the message names the file, its
        owner uid and mode, and who can remove it.
    ValueError
        The name or ``mode`` is malformed, or the pool's shape or dtype differ.
    RuntimeError
        The pool cannot be page-locked (the message gives the locked-memory
        limit), or its creator has not finished setting it up.
    """
    mm, nbytes = open_segment(name, shape, dtype, create, mode)
    shape, dtype = memory._normalize_shape(shape), np.dtype(dtype)
    try:
        return np.asarray(_SharedBuffer(mm, nbytes, shape, dtype, name))
    except BaseException:
        if create:
            unlink_shared(name, missing_ok=True)
        raise


def unlink_shared(name: str, *, missing_ok: bool = False) -> None:
    """Remove pool ``name``: no process can open it any more; the memory is
    freed once every process that maps it has dropped its array or exited.
    Only the caller's own entry is removed (a symbolic link itself, never
    what it points to).

    Raises
    ------
    FileNotFoundError
        No pool has that name (unless ``missing_ok``).
    PermissionError
        The entry at the name is another user's, or a directory.
    """
    path = segment_path(name)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        if not missing_ok:
            raise FileNotFoundError(errno.ENOENT, f"name: no shared pool {name!r}", path) from None
        return
    if st.st_uid != os.geteuid() or stat.S_ISDIR(st.st_mode):
        why = "is a directory" if stat.S_ISDIR(st.st_mode) else "is another user's"
        raise _refusal(name, path, st, why)
    try:
        os.unlink(path)
    except FileNotFoundError:
        if not missing_ok:
            raise FileNotFoundError(errno.ENOENT, f"name: no shared pool {name!r}", path) from None
