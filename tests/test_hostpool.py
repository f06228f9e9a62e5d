"""Host pools pinned in chunks (issue 41), on the CPU: the chunk setting,
where pools are cut, the NUMA decision over a stand-in sysfs, registration
chunk by chunk under the CUDA stand-in (``fake_cuda``), the refusal of rows
not pinned yet, non-contiguous chunk aliases, failures and release."""

from __future__ import annotations

import gc
import io
import threading
import types

import numpy as np
import pytest

import cupy_swap.hostpool as hp
from cupy_swap.core.layout import layout_from_parts
from cupy_swap.core.parts import as_parts
from cupy_swap.cuda import capture, memory, pools, release
from cupy_swap.cuda.resolve import resolve_layout
from cupy_swap.hostpool import errors, numa
from cupy_swap.hostpool.chunks import plan_chunks

PAGE = 4096


# -- the setting -------------------------------------------------------------
def test_chunk_setting_default_env_set_reset_and_context(monkeypatch):
    monkeypatch.delenv(hp.ENV, raising=False)
    hp.reset_chunk_bytes()
    assert hp.chunk_bytes() == 64 << 30
    monkeypatch.setenv(hp.ENV, "1G")
    assert hp.chunk_bytes() == 1 << 30
    monkeypatch.setenv(hp.ENV, "512MiB")
    assert hp.chunk_bytes() == 512 << 20
    hp.set_chunk_bytes(8192)
    assert hp.chunk_bytes() == 8192
    with hp.chunk_bytes_set("2g") as value:
        assert value == hp.chunk_bytes() == 2 << 30
    assert hp.chunk_bytes() == 8192
    hp.reset_chunk_bytes()
    assert hp.chunk_bytes() == 512 << 20
    monkeypatch.setenv(hp.ENV, "lots")
    with pytest.raises(ValueError, match=f"{hp.ENV}: expected a byte count like .* got 'lots'"):
        hp.chunk_bytes()


@pytest.mark.parametrize("bad", [0, -1, "0", 1.5, True, None, "1X"])
def test_chunk_setting_refuses_bad_values(bad):
    with pytest.raises((TypeError, ValueError), match="value: expected"):
        hp.set_chunk_bytes(bad)
    hp.reset_chunk_bytes()


# -- where a pool is cut -------------------------------------------------------
@pytest.mark.parametrize("row_bytes", [16, 48, 4096, 4096 + 16, 32 << 10, 2 << 20, 3 * 4096 + 1])
@pytest.mark.parametrize("rows", [1, 3, 17, 1250])
@pytest.mark.parametrize("chunk", [1, 4096, 100_000, 1 << 20])
@pytest.mark.parametrize("base", [0x10000, 0x10000 + 48])
def test_chunks_cover_the_pool_and_cut_on_row_and_page_boundaries(row_bytes, rows, chunk, base):
    chunks = plan_chunks(base, rows, row_bytes, chunk, PAGE)
    assert chunks[0].first_row == 0 and chunks[-1].end_row == rows
    assert chunks[0].start == base and chunks[-1].end == base + rows * row_bytes
    period = PAGE // np.gcd(row_bytes, PAGE)
    for a, b in zip(chunks, chunks[1:]):
        assert a.end_row == b.first_row and a.end == b.start
        assert b.start % PAGE == 0  # two registrations never share a page
        assert b.start == base + b.first_row * row_bytes  # a block never straddles two chunks
    for c in chunks[:-1]:
        # At most chunk bytes, unless one page-aligned run of rows is longer.
        assert c.nbytes <= max(chunk, (period + period) * row_bytes)
    assert [c.index for c in chunks] == list(range(len(chunks)))


def test_chunks_of_a_1_gib_setting_over_2_5_gib_of_2_mib_blocks():
    chunks = plan_chunks(0x7F0000000000, 1280, 2 << 20, 1 << 30)
    assert [(c.first_row, c.end_row) for c in chunks] == [(0, 512), (512, 1024), (1024, 1280)]


def test_chunks_refuse_bad_arguments():
    with pytest.raises(ValueError, match="row_bytes: expected a positive int, got 0"):
        plan_chunks(0, 4, 0, 4096)
    with pytest.raises(ValueError, match="chunk_bytes: expected a positive int, got -5"):
        plan_chunks(0, 4, 16, -5)
    assert plan_chunks(0, 0, 16, 4096) == []


# -- NUMA: the decision over a stand-in sysfs ---------------------------------
def _sysfs(tmp_path, online: str, gpus: dict):
    node_dir = tmp_path / "devices" / "system" / "node"
    node_dir.mkdir(parents=True)
    (node_dir / "online").write_text(online + "\n")
    for bus, node in gpus.items():
        d = tmp_path / "bus" / "pci" / "devices" / bus
        d.mkdir(parents=True)
        (d / "numa_node").write_text(f"{node}\n")
    return str(tmp_path)


def test_numa_places_a_pool_on_its_gpus_node(tmp_path):
    root = _sysfs(tmp_path, "0-1", {"0000:1a:00.0": 0, "0000:9b:00.0": 1})
    bus = {0: "0000:1A:00.0", 1: "00000000:9B:00.0"}  # CUDA's and NVML's spellings
    p = numa.placement_for([1], numa="auto", sysfs=root, bus_ids=bus)
    assert (p.policy, p.nodes) == ("preferred", (1,)) and "GPU 1 (00000000:9B:00.0) on node 1" in p.reason
    shared = numa.placement_for([0, 1], shared=True, sysfs=root, bus_ids=bus)
    assert (shared.policy, shared.nodes) == ("interleave", (0, 1))
    assert "interleave nodes [0, 1]" in shared.describe()
    one_node = numa.placement_for([0, 1], shared=True, sysfs=root, bus_ids={0: bus[0], 1: bus[0]})
    assert (one_node.policy, one_node.nodes) == ("preferred", (0,))


def test_numa_is_a_no_op_with_the_reason_on_one_node_or_an_unknown_node(tmp_path):
    root = _sysfs(tmp_path / "a", "0", {"0000:1a:00.0": 0})
    p = numa.placement_for([0], sysfs=root, bus_ids={0: "0000:1a:00.0"})
    assert p.policy == "none" and p.describe() == "not placed: one NUMA node online (0): nothing to place"
    root = _sysfs(tmp_path / "b", "0-1", {"0000:1a:00.0": -1})
    p = numa.placement_for([0], sysfs=root, bus_ids={0: "0000:1a:00.0"})
    assert p.policy == "none" and "NUMA node of the GPU unknown" in p.reason
    assert numa.placement_for([0], numa="off").describe() == "not placed: numa='off'"
    assert numa.online_nodes(str(tmp_path / "missing")) == [0]  # no NUMA support: one node


def test_numa_forced_nodes_are_checked(tmp_path):
    root = _sysfs(tmp_path, "0-1", {})
    assert numa.placement_for([0], numa=[1, 0], sysfs=root).nodes == (0, 1)
    with pytest.raises(ValueError, match=r"numa: expected online nodes \[0, 1\], got \[3\]"):
        numa.placement_for([0], numa=3, sysfs=root)
    with pytest.raises(TypeError, match="numa: expected 'auto', 'off', a node number"):
        numa.placement_for([0], numa="near", sysfs=root)
    with pytest.raises(ValueError, match="bus_id: expected a PCI address"):
        numa.sysfs_bus_id("gpu0")
    assert numa.parse_node_list("0-2,5") == [0, 1, 2, 5]


def test_numa_bind_of_a_one_node_placement_is_applied_or_says_why():
    import mmap

    mm = mmap.mmap(-1, 4 * PAGE)
    try:
        import ctypes

        addr = ctypes.addressof(ctypes.c_char.from_buffer(mm))
        p = numa.bind_range(addr, 4 * PAGE, numa.Placement("preferred", (0,), "test"))
        assert p.applied is True or "mbind failed" in p.reason
        with numa.thread_policy(numa.Placement("preferred", (0,), "test")) as q:
            assert q.applied is True or "set_mempolicy failed" in q.reason
    finally:
        mm.close()


# -- registration under the CUDA stand-in ------------------------------------
@pytest.fixture
def no_numa(monkeypatch):
    monkeypatch.setattr(numa, "online_nodes", lambda sysfs="/sys": [0])


def test_pin_pool_registers_chunk_by_chunk_in_relaxed_mode(fake_cuda, no_numa, monkeypatch):
    modes = []
    monkeypatch.setattr(capture, "exchange", lambda mode: modes.append(mode) or 0)
    calls = []
    fake_cuda.hostRegister = lambda ptr, n, flags: (
        calls.append((ptr, n, list(modes))),
        fake_cuda.registered.append((ptr, n)),
    )
    seen = []
    h = hp.pin_pool((40, 1024), np.uint8, chunk_bytes=8192, progress=seen.append)
    assert h.done and h.error is None and h.wait(timeout=0) is True
    assert [n for _, n, _ in calls] == [8192] * 5
    assert all(m and m[-1] == capture.RELAXED for _, _, m in calls)  # each call inside a relaxed block
    assert [p.chunks_done for p in seen] == [1, 2, 3, 4, 5] and seen[-1].fraction == 1.0
    assert h.progress.bytes_done == 40 * 1024 and h.usable_rows == 40
    a = h.array
    assert a.shape == (40, 1024) and not a.any()  # zero-filled
    # Each chunk is an ordinary registered range: a view inside one resolves by bisection.
    assert memory.host_alias(a[8:16].ctypes.data, 8192) == a[8:16].ctypes.data
    assert memory.is_pinned(a[16:24])
    assert h.placement.policy == "none" and "one NUMA node" in repr(h)
    del a, h, seen
    gc.collect()
    assert release.drain(timeout=10)
    assert {p for p, _, _ in calls} <= set(fake_cuda.unregistered)  # every chunk unpinned
    assert len(pools.registry) == 0


def _gpu_part(fake_gpu, rows, row_bytes):
    return fake_gpu.part(np.zeros((rows, row_bytes), np.uint8), "dst")


def _layout(fake_gpu, host, name="src"):
    src = as_parts(host, name)
    dst = [_gpu_part(fake_gpu, len(host), host.shape[1])]
    return layout_from_parts(src, dst)


def _gated_registration(fake_cuda):
    """``(gate, entered)``: each chunk's registration releases ``entered``,
    then waits for ``gate``."""
    gate, entered = threading.Semaphore(0), threading.Semaphore(0)

    def register(ptr, n, flags):
        entered.release()
        assert gate.acquire(timeout=30)
        fake_cuda.registered.append((ptr, n))

    fake_cuda.hostRegister = register
    return gate, entered


def test_background_pinning_refuses_rows_not_pinned_yet_then_allows_them(
    fake_cuda, no_numa, fake_gpu, monkeypatch
):
    monkeypatch.setattr(memory, "host_mapping_status", lambda device: (True, "mapped"))
    gate, entered = _gated_registration(fake_cuda)
    h = hp.pin_pool((32, 4096), np.uint8, chunk_bytes=8 * 4096, background=True)
    try:
        assert entered.acquire(timeout=30)  # chunk 0 is being registered
        assert h.usable_rows == 0 and not h.done and h.wait(timeout=0) is False
        with pytest.raises(
            ValueError,
            match=r"src: expected pinned host memory, got blocks 0\.\.31 \(pool rows 0\.\.31\) in chunks 0\.\.3 .*"
            r"not pinned yet \(0 of 32 rows pinned\); wait for the pin handle",
        ):
            resolve_layout(_layout(fake_gpu, h.array), device=0)
        gate.release()
        assert entered.acquire(timeout=30)  # chunk 1 is being registered: chunk 0 is usable
        assert h.usable_rows == 8 and h.progress.chunks_done == 1
        layout = resolve_layout(_layout(fake_gpu, h.usable), device=0)
        assert layout.kernel_ok and layout.src_addrs == [h.array.ctypes.data]
        with pytest.raises(
            ValueError, match=r"src: .* got blocks 0\.\.7 \(pool rows 8\.\.15\) in chunks 1\.\.1 "
        ):
            resolve_layout(_layout(fake_gpu, h.array[8:16]), device=0)
    finally:
        for _ in range(4):
            gate.release()
    assert h.wait(timeout=30) is True
    assert resolve_layout(_layout(fake_gpu, h.array), device=0).kernel_ok


def test_chunks_whose_aliases_are_not_contiguous_read_each_block_through_its_own(
    fake_cuda, no_numa, fake_gpu, monkeypatch
):
    """A stand-in alias function: chunk k's alias is its address + (k + 1) << 40."""
    monkeypatch.setattr(memory, "host_mapping_status", lambda device: (True, "mapped"))
    starts = []
    fake_cuda.hostRegister = lambda ptr, n, flags: (starts.append(ptr), fake_cuda.registered.append((ptr, n)))

    def attributes(ptr):
        for k, (p, n) in enumerate(fake_cuda.registered):
            if p <= ptr < p + n:
                return types.SimpleNamespace(
                    type=memory._MEMORY_TYPE_HOST, devicePointer=ptr + ((k + 1) << 40)
                )
        return types.SimpleNamespace(type=0, devicePointer=0)

    fake_cuda.pointerGetAttributes = attributes
    h = hp.pin_pool((24, 4096), np.uint8, chunk_bytes=8 * 4096)
    views = h.chunk_views()
    assert [len(v) for v in views] == [8, 8, 8]
    for k, v in enumerate(views):  # a chunk's rows resolve to that chunk's own alias
        layout = resolve_layout(_layout(fake_gpu, v), device=0)
        assert layout.kernel_ok and layout.src_addrs == [v.ctypes.data + ((k + 1) << 40)]
        assert layout.table[0] == v.ctypes.data + ((k + 1) << 40)
    whole = resolve_layout(
        _layout(fake_gpu, h.array), device=0
    )  # across chunks: copy engines, host addresses
    assert not whole.kernel_ok and whole.src_addrs == [None]
    assert "spans chunks of the host pool" in whole.unmapped_reason
    assert "not contiguous" in whole.unmapped_reason
    # The other direction, and a view inside chunk 1 only with a stride.
    out = layout_from_parts([_gpu_part(fake_gpu, 4, 4096)], as_parts(h.array[9:15:2], "dst"))
    out = resolve_layout(out, device=0)
    assert out.dst_addrs == [h.array[9:15:2].ctypes.data + (2 << 40)]


def test_a_failed_chunk_raises_one_clear_error_and_clears_the_pending_one(
    fake_cuda, no_numa, fake_gpu, monkeypatch
):
    monkeypatch.setattr(memory, "host_mapping_status", lambda device: (True, "mapped"))
    cleared = []
    monkeypatch.setattr(errors, "clear_pending", lambda: cleared.append(threading.get_ident()) or [2])

    def register(ptr, n, flags):
        if len(fake_cuda.registered) == 2:
            raise RuntimeError("cudaErrorMemoryAllocation: out of memory")
        fake_cuda.registered.append((ptr, n))

    fake_cuda.hostRegister = register
    with pytest.raises(hp.PinError) as info:
        hp.pin_pool((32, 4096), np.uint8, chunk_bytes=8 * 4096)
    text = str(info.value)
    assert "chunk 2 of 4 (32768 bytes, 0.00 GiB; pool 0.00 GiB)" in text
    assert "cudaErrorMemoryAllocation" in text and "ulimit -l" in text and "memory available" in text
    assert "No CUDA error is left pending" in text and info.value.pinned_rows == 16
    assert cleared == [threading.get_ident()]  # in the registering thread
    # In the background the same error is the handle's, once, and wait() raises it.
    h = hp.pin_pool((32, 4096), np.uint8, chunk_bytes=8 * 4096, background=True)
    with pytest.raises(hp.PinError, match="chunk 0 of 4"):
        h.wait(timeout=30)
    assert isinstance(h.error, hp.PinError) and h.done and h.usable_rows == 0
    with pytest.raises(
        ValueError, match=r"not pinned \(registration failed\).*the pin handle's \.error says why"
    ):
        resolve_layout(_layout(fake_gpu, h.array), device=0)


def test_cancel_stops_after_the_chunk_in_flight(fake_cuda, no_numa):
    box, ready = [], threading.Event()

    def register(ptr, n, flags):
        assert ready.wait(timeout=30)
        fake_cuda.registered.append((ptr, n))
        box[0].cancel()  # while chunk 0 registers

    fake_cuda.hostRegister = register
    h = hp.pin_pool((32, 4096), np.uint8, chunk_bytes=8 * 4096, background=True)
    box.append(h)
    ready.set()
    assert h.wait(timeout=30) is False  # ended, not everything pinned
    assert h.done and h.error is None and h.usable_rows == 8 and len(fake_cuda.registered) == 1


def test_a_progress_callback_that_raises_stops_the_registration(fake_cuda, no_numa):
    def broken(p):
        raise KeyError("oops")

    with pytest.raises(RuntimeError, match="progress: the callback raised KeyError"):
        hp.pin_pool((32, 4096), np.uint8, chunk_bytes=8 * 4096, progress=broken)


def test_bad_arguments_are_refused_before_anything_is_pinned(fake_cuda, no_numa):
    cases = [
        (
            lambda: hp.pin_pool((4, 16), np.uint8, device=-1),
            ValueError,
            "device: expected None or a GPU index",
        ),
        (
            lambda: hp.pin_pool((4, 16), np.uint8, chunk_bytes=0),
            ValueError,
            "chunk_bytes: expected a positive",
        ),
        (
            lambda: hp.pin_pool((4, 16), np.uint8, background="yes"),
            TypeError,
            "background: expected True or False",
        ),
        (
            lambda: hp.pin_pool((4, 16), np.uint8, progress=3),
            TypeError,
            "progress: expected None or a callable",
        ),
        (lambda: hp.pin_pool((0, 16), np.uint8), ValueError, "shape: expected at least one block"),
        (lambda: hp.pin_pool((4, 16), object), TypeError, "dtype: expected a plain data type"),
        (lambda: hp.pin_array([1, 2]), TypeError, "array: expected a numpy.ndarray, got list"),
        (
            lambda: hp.pin_shared("x", (4, 16), np.uint8, devices=[-1]),
            ValueError,
            "devices: expected None or GPU",
        ),
        (
            lambda: hp.pin_array(np.zeros((4, 16))[:, ::2]),
            ValueError,
            "array: expected a non-empty C-contiguous",
        ),
        (lambda: hp.pin_pool((4, 16), np.uint8, wait=True), TypeError, "wait"),
    ]
    for call, kind, text in cases:
        with pytest.raises(kind, match=text):
            call()
    assert fake_cuda.registered == []
    h = hp.pin_pool((4, 16), np.uint8)
    with pytest.raises(ValueError, match="timeout: expected seconds >= 0"):
        h.wait(None)
    del h
    gc.collect()  # released under this test's stand-in


def test_pin_array_pins_caller_memory_in_chunks_until_the_handle_is_dropped(fake_cuda, no_numa):
    import mmap

    a = np.frombuffer(mmap.mmap(-1, 64 * 4096), np.uint8).reshape(64, 4096)  # page-aligned
    h = hp.pin_array(a, chunk_bytes=16 * 4096)
    assert h.array is a and h.usable_rows == 64 and len(fake_cuda.registered) >= 4
    with pytest.raises(ValueError, match="array: expected memory not yet pinned"):
        hp.pin_array(a)
    assert "existing memory" in h.placement.reason
    starts = [p for p, _ in fake_cuda.registered]
    del h
    gc.collect()
    assert release.drain(timeout=10)
    assert (
        sorted(fake_cuda.unregistered) == sorted(starts)
        and memory._registry.holding(a.ctypes.data, a.ctypes.data + 1) is None
    )


def test_pin_shared_creates_and_opens_in_chunks(fake_cuda, no_numa):
    name = f"cupy_swap_test_hostpool_{threading.get_ident()}"
    try:
        h = hp.pin_shared(name, (16, 4096), np.uint8, create=True, devices=[0], chunk_bytes=4 * 4096)
        assert h.usable_rows == 16 and len(fake_cuda.registered) == 4
        h.array[3] = 7
        del h
        gc.collect()
        assert release.drain(timeout=10)
        h2 = hp.pin_shared(name, (16, 4096), np.uint8, chunk_bytes=8 * 4096)
        assert (h2.array[3] == 7).all() and h2.placement.reason == "opened: placed by its creator"
    finally:
        from cupy_swap import unlink_shared

        unlink_shared(name, missing_ok=True)


def test_registration_error_text_and_memory_reading(tmp_path, monkeypatch):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal: 100 kB\nMemAvailable:    2048 kB\n")
    assert errors.available_memory(str(meminfo)) == 2 << 20
    assert errors.available_memory(str(tmp_path / "none")) is None
    e = errors.registration_error(
        OSError("no"), "host pool (1.00 GiB, 2 chunks)", 1 << 29, 1 << 30, 1, 2, 100
    )
    assert isinstance(e, RuntimeError) and e.nbytes == 1 << 29 and e.chunk == 1 and e.pinned_rows == 100
    assert "host pool (1.00 GiB, 2 chunks): expected to page-lock chunk 1 of 2 (536870912 bytes" in str(e)
    assert isinstance(errors.clear_pending(), list)  # no runtime loaded here: nothing to read, no error


def test_progress_bar_writes_plain_text():
    out = io.StringIO()
    bar = hp.ProgressBar("pinning", stream=out, every=50)
    for done in (1, 2, 3, 4):
        bar(hp.Progress(done << 30, 4 << 30, done, 4, done, 4, float(done)))
    lines = out.getvalue().splitlines()
    assert len(lines) == 3  # 25 %, 75 % (50 after 25) and 100 %
    assert lines[-1].startswith("pinning [" + "#" * 30 + "]    4.00/4.00 GiB 100.0% chunk 4/4")
    assert "1.000 s/GiB" in lines[-1]


def test_pin_pool_touches_each_chunk_before_it_registers_it(fake_cuda, no_numa, monkeypatch):
    from cupy_swap.hostpool import api

    order = []
    monkeypatch.setattr(api, "first_touch", lambda start, n: order.append(("touch", start, n)))
    fake_cuda.hostRegister = lambda ptr, n, flags: (
        order.append(("register", ptr, n)),
        fake_cuda.registered.append((ptr, n)),
    )
    h = hp.pin_pool((32, 4096), np.uint8, chunk_bytes=8 * 4096)
    assert [k for k, _, _ in order] == ["touch", "register"] * 4
    assert [(s, n) for k, s, n in order if k == "touch"] == [(s, n) for k, s, n in order if k == "register"]
    assert len(h.touch_seconds) == len(h.chunk_seconds) == 4
    a = hp.pin_array(np.frombuffer(bytearray(8192), np.uint8).reshape(2, 4096))
    assert a.touch_seconds == []  # the caller's memory is never written


def test_first_touch_leaves_every_byte_as_it_was(monkeypatch):
    import mmap

    from cupy_swap.hostpool import api

    monkeypatch.setattr(api, "_TOUCH_SLICE", 4096)  # several slices, several threads
    monkeypatch.setattr(api, "_TOUCH_THREADS", 3)
    buf = np.frombuffer(mmap.mmap(-1, 6 * 4096), np.uint8)[: 5 * 4096 + 123]
    buf[:] = np.arange(buf.size) % 251
    api.first_touch(buf.ctypes.data, buf.nbytes)
    assert np.array_equal(buf, np.arange(buf.size) % 251)
    monkeypatch.setattr(api, "_populate", lambda start, n: False)  # a kernel without MADV_POPULATE_WRITE
    api.first_touch(buf.ctypes.data, buf.nbytes)
    assert np.array_equal(buf, np.arange(buf.size) % 251)


def test_background_pinning_keeps_what_the_caller_wrote_meanwhile(fake_cuda, no_numa):
    """Finding 2 of issue 49: the caller fills rows while the pool pins."""
    gate, entered = _gated_registration(fake_cuda)
    h = hp.pin_pool((32, 4096), np.uint8, chunk_bytes=8 * 4096, background=True)
    try:
        assert entered.acquire(timeout=30)  # chunk 0 registers; chunks 1..3 not touched yet
        h.array[:] = np.arange(32, dtype=np.uint8)[:, None] + 1  # loading the cache meanwhile
    finally:
        for _ in range(4):
            gate.release()
    assert h.wait(timeout=30) is True
    assert np.array_equal(h.array, np.broadcast_to(np.arange(32, dtype=np.uint8)[:, None] + 1, (32, 4096)))


def test_pinning_for_another_gpu_leaves_the_callers_gpu_current(fake_cuda, no_numa):
    current = [0]
    fake_cuda.getDevice = lambda: current[0]
    fake_cuda.setDevice = lambda d: current.__setitem__(0, d)
    seen = []
    fake_cuda.hostRegister = lambda ptr, n, flags: (
        seen.append(current[0]),
        fake_cuda.registered.append((ptr, n)),
    )
    h = hp.pin_pool((8, 4096), np.uint8, device=1, chunk_bytes=4 * 4096)
    assert seen == [1, 1] and current[0] == 0 and h.device == 1


def test_bench_pin_checks_its_arguments_before_looking_for_a_gpu():
    import subprocess
    import sys

    def run(*argv):
        return subprocess.run(
            [sys.executable, "-m", "cupy_swap", "bench", "--pin", *argv], capture_output=True, text=True
        )

    bad = run("--gib", "0")
    assert bad.returncode == 2 and "--gib: '0' is not a positive whole number" in bad.stderr
    helped = run("--help")
    assert helped.returncode == 0 and "--stall-chunk-gib" in helped.stdout
    from cupy_swap.tools.bench import gpu_status

    if not gpu_status()[0]:
        assert run("--gib", "1").returncode == 3  # no GPU: exit 3, as every command


def test_a_dropped_pin_array_handle_retires_the_pool_before_anything_can_launch_over_it(
    fake_cuda, no_numa, fake_gpu, monkeypatch
):
    """Finding 1 of issue 49: ``del handle`` used to unpin behind the ops'
    back (the next call launched over the old alias: a GPU fault).  Now the
    drop itself retires the pool and bumps the alias generation, before the
    releaser runs, so the next call resolves again and refuses."""
    import mmap

    monkeypatch.setattr(memory, "host_mapping_status", lambda device: (True, "mapped"))
    a = np.frombuffer(mmap.mmap(-1, 16 * 4096), np.uint8).reshape(16, 4096)
    h = hp.pin_array(a, chunk_bytes=8 * 4096)
    assert resolve_layout(_layout(fake_gpu, a), device=0).kernel_ok
    owners = pools.owners(_layout(fake_gpu, a))
    assert len(owners) == 1  # what a captured swap keeps for the process
    del owners
    gate = threading.Event()
    monkeypatch.setattr(memory.driver, "devices_in_use", lambda: gate.wait(30) and [])  # the releaser waits
    generation = memory.generation()
    del h
    gc.collect()
    try:
        assert memory.generation() != generation  # every op resolves again at its next call
        with pytest.raises(
            ValueError,
            match=r"src: expected pinned host memory, got memory of a host pool .* "
            r"whose pin handle was dropped .* keep the PinHandle",
        ):
            resolve_layout(_layout(fake_gpu, a), device=0)
        # What a captured swap, a graph swap or a swap captured by swap() keeps pinned: refused too
        # (review finding: a retired pool was skipped, so the capture went on over memory being unpinned).
        with pytest.raises(ValueError, match=r"src: .* whose pin handle was dropped .* captured or not"):
            pools.owners(_layout(fake_gpu, a))
        assert fake_cuda.unregistered == []  # refused before the releaser unpinned anything
    finally:
        gate.set()
    assert release.drain(timeout=10) and len(fake_cuda.unregistered) == 2
    h = hp.pin_array(a, chunk_bytes=8 * 4096)  # pinned again: resolves again
    assert h.usable_rows == 16 and resolve_layout(_layout(fake_gpu, a), device=0).src_addrs


def test_pinning_again_waits_for_the_dropped_handles_unpinning_at_most_its_limit(
    fake_cuda, no_numa, monkeypatch
):
    import mmap

    from cupy_swap.hostpool import api

    a = np.frombuffer(mmap.mmap(-1, 4 * 4096), np.uint8).reshape(4, 4096)
    h = hp.pin_array(a)
    gate = threading.Event()
    monkeypatch.setattr(memory.driver, "devices_in_use", lambda: gate.wait(30) and [])  # a busy GPU
    monkeypatch.setattr(api, "_REPIN_WAIT_S", 0.01)
    del h
    gc.collect()
    try:
        with pytest.raises(
            ValueError, match=r"array: .* whose earlier handle was dropped and whose unpinning"
        ):
            hp.pin_array(a)
    finally:
        gate.set()
    assert release.drain(timeout=10)
    assert hp.pin_array(a).usable_rows == 4  # unpinned by now: pinned again
