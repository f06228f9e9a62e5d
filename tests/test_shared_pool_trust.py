"""Issue 42 on the CPU: a shared pool is opened only from a regular file of
the caller's own user with no wider mode than asked for (cupy_swap.hostpool.shared,
the rule of its module docstring); everything else is refused with a
PermissionError before anything is mapped.  Pool files live in a temporary
directory (``shared.SHM_DIR`` redirected)."""

import mmap
import os
import threading

import numpy as np
import pytest

from cupy_swap.hostpool import shared

NOBODY = 65534


@pytest.fixture(autouse=True)
def shm_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(shared, "SHM_DIR", str(tmp_path))
    return tmp_path


@pytest.fixture
def name():
    return "trust"


@pytest.fixture
def path(name):
    return shared.segment_path(name)


@pytest.fixture
def maps(monkeypatch):
    """The mmap.mmap calls of the test; a refused open must make none."""
    calls = []
    real = mmap.mmap

    def recording(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(mmap, "mmap", recording)
    return calls


def _pool(name, mode=0o600):
    shared.open_segment(name, 16, np.uint8, create=True, mode=mode)[0].close()


def _give_away(path, uid=-1, gid=-1):
    try:
        os.chown(path, uid, gid, follow_symlinks=False)
    except PermissionError:
        pytest.skip(f"needs root to give a file to uid {uid}, gid {gid}")


def _refused(name, maps, mode=0o600, match=""):
    maps.clear()  # the creator's mapping
    with pytest.raises(PermissionError, match=match) as e:
        shared.open_segment(name, 16, np.uint8, create=False, mode=mode)
    assert maps == []  # refused before any mapping
    return str(e.value)


@pytest.mark.parametrize("mode", [0o600, 0o660])
def test_create_then_open_makes_exactly_the_mode_asked(name, path, mode):
    old = os.umask(0o077)  # a umask that would take the group's bits off
    try:
        _pool(name, mode)
    finally:
        os.umask(old)
    assert os.stat(path).st_mode & 0o7777 == mode
    mm, nbytes = shared.open_segment(name, 16, np.uint8, create=False, mode=mode)
    assert nbytes == 16 and len(mm) == shared.HEADER_BYTES + 16
    mm.close()


@pytest.mark.parametrize("mode", [0o600, 0o660])
def test_another_users_private_file_is_refused(name, path, maps, mode):
    _pool(name)
    _give_away(path, NOBODY)
    msg = _refused(name, maps, mode, match="is another user's")
    assert path in msg and f"owner uid {NOBODY}" in msg and "mode 0o600" in msg
    assert f"have its owner (uid {NOBODY}) remove it, e.g. unlink_shared('{name}') as that user" in msg


def test_another_users_group_pool_is_opened_only_with_mode_0o660(name, path, maps):
    _pool(name, 0o660)
    _give_away(path, NOBODY, os.getegid())
    msg = _refused(name, maps, match="mode bits 0o060 beyond what mode=0o600 allows")
    assert "mode 0o660" in msg and "opened with mode=0o660" in msg
    mm, _ = shared.open_segment(name, 16, np.uint8, create=False, mode=0o660)
    mm.close()


@pytest.mark.parametrize(
    ("perm", "mode"),
    [(0o666, 0o600), (0o644, 0o600), (0o660, 0o600), (0o604, 0o600), (0o640, 0o600), (0o2600, 0o600)]
    + [(0o666, 0o660), (0o664, 0o660), (0o670, 0o660), (0o606, 0o660)],
)
def test_wider_modes_are_refused(name, path, maps, perm, mode):
    _pool(name)
    os.chmod(path, perm)
    msg = _refused(name, maps, mode, match="beyond what mode=")
    assert f"mode 0o{perm:03o})" in msg and f"unlink_shared('{name}') removes it" in msg


def test_a_group_pool_of_a_group_not_ones_own_is_refused(name, path, maps):
    if NOBODY in {os.getegid(), *os.getgroups()}:
        pytest.skip(f"gid {NOBODY} is one of this user's groups")
    _pool(name, 0o660)
    _give_away(path, -1, NOBODY)
    _refused(name, maps, 0o660, match=f"gives group {NOBODY} access, not one of your groups")


def test_another_users_group_pool_of_mode_0o600_is_refused(name, path, maps):
    _pool(name)  # the owner did not share it with the group
    _give_away(path, NOBODY, os.getegid())
    _refused(name, maps, 0o660, match="is another user's")


@pytest.mark.parametrize("target", ["a pool of ours", "nothing"])
def test_a_symbolic_link_at_the_name_is_refused(name, path, maps, target):
    if target == "a pool of ours":
        _pool("real")
    os.symlink(shared.segment_path("real"), path)
    msg = _refused(name, maps, match="is a symbolic link")
    assert path in msg


def test_a_directory_at_the_name_is_refused(name, path, maps):
    os.mkdir(path, 0o700)
    msg = _refused(name, maps, match="is a directory")
    assert f"remove the directory {path}" in msg


def test_a_fifo_at_the_name_is_refused_without_blocking(name, path, maps):
    os.mkfifo(path, 0o600)
    errors = []

    def open_it():
        try:
            shared.open_segment(name, 16, np.uint8, create=False)
        except Exception as e:
            errors.append(e)

    opener = threading.Thread(target=open_it, daemon=True)
    opener.start()
    opener.join(10)
    assert not opener.is_alive(), "opening a FIFO at the pool's name blocked"
    (e,) = errors
    assert isinstance(e, PermissionError) and "is not a regular file" in str(e)
    assert maps == []


@pytest.mark.parametrize("create", [True, False])
@pytest.mark.parametrize(
    ("bad", "shown"),
    [(0o644, "0o644"), (0o666, "0o666"), (0o700, "0o700"), (600, "0o1130"), ("0o600", "'0o600'")]
    + [(None, "None"), (True, "True"), (384.0, "384.0"), (-1, "-1")],
)
def test_a_bad_mode_is_refused_naming_it(name, path, create, bad, shown):
    if not create:
        _pool(name)
    expected = "mode: expected 0o600 (only your user) or 0o660 (your user and your group), got "
    with pytest.raises(ValueError) as e:
        shared.open_segment(name, 16, np.uint8, create=create, mode=bad)
    assert str(e.value) == expected + shown
    assert os.path.exists(path) is not create  # nothing made


def test_unlink_refuses_another_users_file(name, path):
    _pool(name)
    _give_away(path, NOBODY)
    gid = os.stat(path).st_gid
    with pytest.raises(
        PermissionError, match=f"is another user's .owner uid {NOBODY}, gid {gid}, mode 0o600"
    ):
        shared.unlink_shared(name)
    assert os.path.exists(path)


def test_unlink_removes_a_link_never_its_target(name, path):
    _pool("real")
    os.symlink(shared.segment_path("real"), path)
    shared.unlink_shared(name)
    assert not os.path.lexists(path) and os.path.exists(shared.segment_path("real"))


def test_unlink_refuses_a_directory(name, path):
    os.mkdir(path, 0o700)
    with pytest.raises(PermissionError, match="is a directory"):
        shared.unlink_shared(name)
    assert os.path.isdir(path)


def test_shared_pinned_takes_the_mode(name, fake_cuda):
    import cupy_swap as cs

    pool = cs.shared_pinned(name, (4, 4096), np.uint8, create=True, mode=0o660)
    with pytest.raises(PermissionError, match="beyond what mode=0o600 allows"):
        cs.shared_pinned(name, (4, 4096), np.uint8)
    assert len(fake_cuda.registered) == 1  # the refused open registered nothing
    other = cs.shared_pinned(name, (4, 4096), np.uint8, mode=0o660)
    pool[3, 7] = 9
    assert other[3, 7] == 9
    with pytest.raises(ValueError, match="mode: expected 0o600"):
        cs.shared_pinned(name, (4, 4096), np.uint8, mode=0o666)
    del pool, other
    cs.unlink_shared(name)
