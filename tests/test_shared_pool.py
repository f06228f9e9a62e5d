"""The shared pool's segment on the CPU (no GPU needed): creating, opening,
and every refusal, named clearly (cupy_swap.hostpool.shared.open_segment); the
pool's lifecycle over a stand-in CUDA runtime (the ``fake_cuda`` fixture).
Page-locking and swaps across processes are in test_shared_pool_gpu.py."""

import gc
import mmap
import os
import uuid

import numpy as np
import pytest

from cupy_swap.cuda import memory, release
from cupy_swap.hostpool import shared

if not os.path.isdir(shared.SHM_DIR):
    pytest.skip("needs /dev/shm", allow_module_level=True)


def _private(path, flags):
    """open()'s opener for a pool file made by hand: mode 0o600, as a creator's."""
    return os.open(path, flags, 0o600)


@pytest.fixture
def name():
    n = f"test-{uuid.uuid4().hex[:12]}"
    yield n
    shared.unlink_shared(n, missing_ok=True)


def test_created_segment_is_opened_with_the_same_bytes(name):
    mm, nbytes = shared.open_segment(name, (4, 8), np.uint16, create=True)
    assert nbytes == 64 and len(mm) == shared.HEADER_BYTES + 64
    mm[shared.HEADER_BYTES : shared.HEADER_BYTES + 3] = b"abc"
    other, n2 = shared.open_segment(name, (4, 8), "uint16", create=False)
    assert n2 == 64 and other[shared.HEADER_BYTES : shared.HEADER_BYTES + 3] == b"abc"
    other[shared.HEADER_BYTES + 63] = 7  # one memory: writes show through either mapping
    assert mm[shared.HEADER_BYTES + 63] == 7
    mm.close()
    other.close()


def test_a_taken_name_is_refused(name):
    shared.open_segment(name, 16, np.uint8, create=True)[0].close()
    with pytest.raises(FileExistsError, match=f"shared pool '{name}' already exists"):
        shared.open_segment(name, 16, np.uint8, create=True)


def test_a_missing_name_is_refused(name):
    with pytest.raises(FileNotFoundError, match=f"no shared pool '{name}'; create it with create=True"):
        shared.open_segment(name, 16, np.uint8, create=False)


@pytest.mark.parametrize(("shape", "dtype"), [((4, 9), np.uint16), ((4, 8), np.float16), (32, np.uint16)])
def test_shape_or_dtype_mismatch_is_refused(name, shape, dtype):
    shared.open_segment(name, (4, 8), np.uint16, create=True)[0].close()
    with pytest.raises(ValueError, match=r"holds shape \(4, 8\) of uint16, expected shape"):
        shared.open_segment(name, shape, dtype, create=False)


@pytest.mark.parametrize("bad", ["", "a/b", "..", "x" * 201, 5, "sp ace"])
def test_malformed_names_are_refused(bad):
    with pytest.raises(ValueError, match="name: expected 1-200 characters"):
        shared.open_segment(bad, 16, np.uint8, create=True)


def test_a_segment_its_creator_never_finished_is_named(name):
    path = shared.segment_path(name)
    with open(path, "wb", opener=_private) as f:  # a creator that died after ftruncate, before the header
        f.truncate(shared.HEADER_BYTES + 16)
    with pytest.raises(RuntimeError, match="has not finished setting it up"):
        shared.open_segment(name, 16, np.uint8, create=False)
    with open(path, "r+b") as f:  # the header written, the ready byte not yet
        f.write(shared._header((16,), np.dtype(np.uint8)))
    with pytest.raises(RuntimeError, match="has not finished setting it up"):
        shared.open_segment(name, 16, np.uint8, create=False)


@pytest.mark.parametrize("last_byte", [0x00, 0x5A])
def test_a_foreign_file_is_not_taken_for_a_pool(name, last_byte):
    with open(shared.segment_path(name), "wb", opener=_private) as f:
        f.write(b"x" * (shared.HEADER_BYTES - 1) + bytes([last_byte]) + b"y" * 16)
    with pytest.raises(ValueError, match="is not a cupy_swap shared pool"):
        shared.open_segment(name, 16, np.uint8, create=False)


def test_a_damaged_header_is_named(name):
    with open(shared.segment_path(name), "wb", opener=_private) as f:
        body = shared._MAGIC + b'{"dtype": "|u1", "sha'
        f.write(body + b"\0" * (shared.HEADER_BYTES - 1 - len(body)) + bytes([0x5A]) + b"y" * 16)
    with pytest.raises(ValueError, match="damaged cupy_swap pool header"):
        shared.open_segment(name, 16, np.uint8, create=False)


def test_structured_dtypes_are_opened_again(name):
    dt = np.dtype([("k", "<f2", (4,)), ("v", [("x", "<i4"), ("y", "<u1")])])
    shared.open_segment(name, (3, 2), dt, create=True)[0].close()
    mm, nbytes = shared.open_segment(name, (3, 2), dt, create=False)
    assert nbytes == 6 * dt.itemsize
    mm.close()
    with pytest.raises(ValueError, match="holds shape"):
        shared.open_segment(name, (3, 2), np.dtype([("k", "<f2", (4,))]), create=False)


def test_a_zero_byte_pool_is_refused(name):
    with pytest.raises(ValueError, match="expected a pool of at least one byte"):
        shared.open_segment(name, (0, 16), np.uint8, create=True)
    assert not os.path.exists(shared.segment_path(name))


def test_unlink_removes_the_name_and_says_when_there_is_none(name):
    shared.open_segment(name, 16, np.uint8, create=True)[0].close()
    shared.unlink_shared(name)
    assert not os.path.exists(shared.segment_path(name))
    with pytest.raises(FileNotFoundError, match=f"no shared pool '{name}'"):
        shared.unlink_shared(name)
    shared.unlink_shared(name, missing_ok=True)


def test_object_dtype_is_refused(name):
    with pytest.raises(TypeError, match="dtype: expected a plain data type"):
        shared.open_segment(name, 4, object, create=True)
    assert not os.path.exists(shared.segment_path(name))


def test_pool_lifecycle_with_a_stand_in_runtime(name, fake_cuda):
    import cupy_swap as cs

    pool = cs.shared_pinned(name, (8, 512), np.float32, create=True)
    assert pool.shape == (8, 512) and pool.dtype == np.float32 and pool.flags.c_contiguous
    assert fake_cuda.registered == [(pool.ctypes.data, pool.nbytes)]
    assert pool.ctypes.data % mmap.PAGESIZE == 0  # page-aligned data after the header page(s)
    assert memory.host_alias(pool.ctypes.data, pool.nbytes) == pool.ctypes.data
    other = cs.shared_pinned(name, (8, 512), np.float32)  # a second mapping of the same pages
    pool[5, 7] = 2.5
    assert other[5, 7] == 2.5
    with pytest.raises(ValueError, match="expected an array passed to cupy_swap.register_host"):
        cs.unregister_host(pool)  # the pool's lifetime is cupy_swap's, not register_host's
    start = pool.ctypes.data
    view = pool[2:]
    del pool
    assert release.drain(timeout=10)  # runs whatever release is queued
    assert (
        memory._registry.holding(start, start + 1) is not None and start not in fake_cuda.unregistered
    )  # the view holds it
    del view
    assert release.drain(timeout=10)  # the releaser thread unpinned it, with no call of ours
    assert start in fake_cuda.unregistered and memory._registry.holding(start, start + 1) is None
    assert memory.host_alias(start, 1) == 0
    assert other[5, 7] == 2.5  # the other mapping is untouched
    cs.unlink_shared(name)
    assert other[5, 7] == 2.5  # unlinking removes the name, not the memory


def test_a_failed_page_lock_names_the_limit_and_leaves_no_name(name, fake_cuda, monkeypatch):
    import cupy_swap as cs

    def refuse(ptr, nbytes, flags):
        raise RuntimeError("cudaErrorMemoryAllocation: out of memory")

    monkeypatch.setattr(fake_cuda, "hostRegister", refuse)
    with pytest.raises(RuntimeError, match=r"expected to page-lock 16384 bytes .*out of memory.*ulimit -l"):
        cs.shared_pinned(name, (4, 4096), np.uint8, create=True)
    assert not os.path.exists(shared.segment_path(name))  # the creator cleaned up


def test_a_failed_unpin_keeps_the_mapping_and_warns(name, fake_cuda, monkeypatch):
    import cupy_swap as cs

    pool = cs.shared_pinned(name, (4, 4096), np.uint8, create=True)
    pool[...] = 7
    start = pool.ctypes.data

    def refuse(ptr):
        raise RuntimeError("cudaErrorStreamCaptureUnsupported")

    monkeypatch.setattr(fake_cuda, "hostUnregister", refuse)
    kept_before = len(release._kept)
    with pytest.warns(
        RuntimeWarning, match=f"could not release shared pool {name!r}.*StreamCaptureUnsupported"
    ):
        del pool
        assert release.drain(timeout=10)
    # The mapping outlives the failure record: once the failure was only held by
    # the traceback in release.failures, and dropping that unmapped the pages.
    release.failures.clear()
    gc.collect()
    (mm,) = release._kept[kept_before:]
    assert not mm.closed  # still mapped: CUDA may still hold it
    assert bytes(mm[shared.HEADER_BYTES : shared.HEADER_BYTES + 4]) == b"\x07" * 4
    assert memory._registry.holding(start, start + 1) is None


def test_the_header_fills_whole_pages_of_a_64_kib_page_host(name, fake_cuda, monkeypatch):
    """Pools once assumed 4 KiB pages: with 64 KiB pages (many aarch64 hosts)
    the data started inside the header's page."""
    import cupy_swap as cs

    assert shared.HEADER_BYTES == shared.header_bytes(mmap.PAGESIZE)
    for page in (4096, 16384, 1 << 16):  # x86-64, Apple silicon, many aarch64 servers
        assert shared.header_bytes(page) % page == 0
    monkeypatch.setattr(shared, "HEADER_BYTES", 1 << 16)  # what a 64 KiB-page host computes
    pool = cs.shared_pinned(name, (4, 4096), np.uint8, create=True)
    pool[...] = 3
    other = cs.shared_pinned(name, (4, 4096), np.uint8)
    assert os.path.getsize(shared.segment_path(name)) == (1 << 16) + 4 * 4096  # data after 64 KiB
    assert other[3, 4095] == 3  # the opener reads the same header size
    assert fake_cuda.registered[0] == (pool.ctypes.data, 4 * 4096)
    del pool, other
    cs.unlink_shared(name)
