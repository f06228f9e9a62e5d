"""The contenders of ``bench --peers``, on the CPU: the seed's kernel
compiles, the cases are every direction x block size x count, every
contender has a column and a label, and ``ref+map`` makes the calls the
pull request's design makes, in its order."""

import pytest

from cupy_swap.tools.peers import (
    CONTENDER_COLUMNS,
    CONTENDER_LABELS,
    CONTENDERS,
    PEER_CASES,
    SEED_KERNEL_SOURCE,
    peer_cases,
)

nvrtc = pytest.importorskip("cupy_backends.cuda.libs.nvrtc", reason="CuPy with NVRTC bindings is needed")


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_seed_kernel_compiles(arch):
    prog = nvrtc.createProgram(SEED_KERNEL_SOURCE, "seed.cu", [], [])
    try:
        nvrtc.compileProgram(prog, [f"--gpu-architecture={arch}"])
        assert b"seed_swap_blocks" in nvrtc.getCUBIN(prog)
    finally:
        nvrtc.destroyProgram(prog)


def test_peer_cases_are_every_direction_size_and_count_once():
    cases = peer_cases(("in", "out"), (16, 4096), (1, 3, 7))
    # Direction outermost, then block size, then count; one part each.
    assert [(c.direction, c.block_bytes, c.num_blocks, c.parts) for c in cases] == [
        (d, b, n, 1) for d in ("in", "out") for b in (16, 4096) for n in (1, 3, 7)
    ]
    assert len({(c.direction, c.block_bytes, c.num_blocks) for c in PEER_CASES}) == len(PEER_CASES)


def test_every_contender_has_a_column_and_a_label():
    assert len(set(CONTENDERS)) == len(CONTENDERS)
    assert set(CONTENDER_COLUMNS) == set(CONTENDER_LABELS) == set(CONTENDERS)
    assert len(set(CONTENDER_COLUMNS.values())) == len(CONTENDERS)  # no two columns share a header


def test_timings_start_after_earlier_drops_are_released(monkeypatch):
    """A release that lands inside a timing loop holds up the event records
    of the calls being timed (NOTES items 39-40): every timing first waits
    for what earlier cases dropped."""
    from cupy_swap.cuda import memory
    from cupy_swap.tools import bench

    order = []
    monkeypatch.setattr(memory, "release_dropped", lambda timeout=None: order.append("released") or True)

    class Stream:
        def synchronize(self):
            order.append("sync")

    bench.host_time(lambda: order.append("call"), Stream(), reps=2)
    assert order == ["released", "call", "sync", "call", "sync"]


def test_host_times_take_turns_and_keep_each_calls_fastest_round(monkeypatch):
    """The device's host has slow spells lasting whole rows: calls compared
    in one table are timed in turns, and each keeps its fastest round."""
    import time

    from cupy_swap.cuda import memory
    from cupy_swap.tools import bench

    monkeypatch.setattr(memory, "release_dropped", lambda timeout=None: True)
    order = []

    def call(name, slow_calls):
        def fn():
            order.append(name)
            if len(order) <= slow_calls:
                time.sleep(0.002)  # a slow spell at the start

        return fn

    class Stream:
        def synchronize(self):
            pass

    times = bench.host_times({"a": call("a", 10), "b": call("b", 10)}, Stream(), reps=10, rounds=2)
    assert order == ["a"] * 5 + ["b"] * 5 + ["a"] * 5 + ["b"] * 5
    assert times["a"] < 0.001 and times["b"] < 0.001  # the slow first round does not count


def test_settle_warns_instead_of_hanging_when_releases_do_not_finish(monkeypatch):
    from cupy_swap.cuda import memory
    from cupy_swap.tools import bench

    waited = []
    monkeypatch.setattr(memory, "release_dropped", lambda timeout=None: waited.append(timeout) or False)
    with pytest.warns(RuntimeWarning, match="not released within 60 s"):
        bench.settle()
    assert waited == [60]


def test_ref_map_allocates_once_and_rewrites_its_pinned_buffer_only_after_the_copy(monkeypatch):
    """``ref+map`` runs the pull request's design: buffers allocated once; a
    call waits for the last copy out of the pinned buffer, writes the mapping
    there, copies it to the device buffer on the stream, records the gate and
    launches one CTA of 1024 threads per row over the device buffer."""
    import types

    import cupy
    import cupyx
    import numpy as np
    from cupy.cuda import runtime

    from cupy_swap.tools.peers import upload_contender

    log, pinned, device = [], [], []

    def empty_pinned(shape, dtype):
        pinned.append(np.zeros(shape, dtype))
        return pinned[-1]

    def empty(shape, dtype):
        device.append(types.SimpleNamespace(data=types.SimpleNamespace(ptr=0xD000)))
        return device[-1]

    class Event:
        ptr = 0xE000
        made = 0

        def __init__(self, disable_timing=False):
            Event.made += 1

    class Stream:
        ptr = 0x5000

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    def memcpy(dst, src, nbytes, kind, stream):
        (buffer,) = pinned
        log.append(("copy", dst, src == buffer.ctypes.data, nbytes, kind, stream, buffer.tolist()))

    def kernel(grid, block, args):
        log.append(("kernel", grid, block, args[2] is device[0]))

    monkeypatch.setattr(cupyx, "empty_pinned", empty_pinned)
    monkeypatch.setattr(cupy, "empty", empty)
    monkeypatch.setattr(cupy.cuda, "Event", Event)
    monkeypatch.setattr(runtime, "eventSynchronize", lambda ev: log.append(("wait", ev)))
    monkeypatch.setattr(runtime, "eventRecord", lambda ev, s: log.append(("record", ev, s)))
    monkeypatch.setattr(runtime, "memcpyAsync", memcpy)

    mapping = np.array([[3, 1], [0, 2], [5, 4]], dtype=np.int64)
    call = upload_contender(kernel, (np.uint64(1), np.uint64(2)), np.int64(512), mapping, Stream())
    call()
    call()
    assert (len(pinned), len(device), Event.made) == (1, 1, 1)  # nothing allocated per call
    one_call = [
        ("wait", 0xE000),  # the previous copy has read the pinned buffer
        ("copy", 0xD000, True, 48, runtime.memcpyHostToDevice, 0x5000, mapping.tolist()),
        ("record", 0xE000, 0x5000),
        ("kernel", (3,), (1024,), True),
    ]
    assert log == one_call * 2
