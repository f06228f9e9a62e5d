"""The shape of the common call, held by CI (issue 50, item 6): one warm
prepared call (one part, 16 host rows, the kernel path) traced with
``sys.settrace`` over the library's real code, every CUDA call a no-op
(the stand-ins of ``benchmarks/probes/host_path_cpu.py``).  It fails when
the call executes more distinct library lines or enters more library
functions than the bound below.

Issue 50's goal is 50 lines in 10 functions; the call was 132 lines in 15
functions at 8a13f9a, 82 in 11 with the one-screen call and the slot
ring's one ``take`` and ``write`` (NOTES 77; the generation looked at
again once a slot is taken: an unpin waits for taken slots), 78 in 10 once
that screen was ``PreparedSwap.__call__`` itself (NOTES 82), and is 51 in 7
since the ring's next slot is taken in place with its good verdict read
there, a slot's launch is one cached tuple, the event comes with its path
and bytes, and one ``try`` covers the write, launch and record (NOTES 84), and 50
in 7 (the goal) once a slot's cached launch is looked up in its test.
The bound holds what is reached; the rest is the work itself."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES, MAX_FUNCTIONS = 50, 7


def _warm_op(n: int = 16):
    sys.path.insert(0, str(ROOT / "benchmarks" / "probes"))
    try:
        import host_path_cpu as probe
    finally:
        sys.path.remove(str(ROOT / "benchmarks" / "probes"))
    from cupy_swap import prepared
    from cupy_swap.core.layout import layout_from_parts
    from cupy_swap.cuda.resolve import resolve_layout

    from .fakes import FakeGpu

    gpu = FakeGpu()
    blocks = 2 * n + 2

    def side(name):
        return [gpu.part(np.zeros((blocks, 8, 4096), np.uint8), f"{name}0")]  # 32 KiB blocks

    layout = resolve_layout(layout_from_parts(side("s"), side("d")), 0)
    op = prepared.PreparedSwap(probe._swapper(), layout, None)
    rng = np.random.default_rng(0)
    rows = np.column_stack([rng.choice(blocks, n, replace=False) for _ in range(2)]).astype(np.int64)
    for _ in range(64):  # warm: every ring slot used and its verdict read, events recycled
        op(rows, stream=7)
    return op, rows, gpu


def test_a_warm_prepared_call_stays_one_screen(monkeypatch):
    from cupy_swap import prepared

    monkeypatch.setattr(prepared, "stream_is_capturing", lambda handle: False)  # a CUDA call
    op, rows, _gpu = _warm_op()
    library = str(ROOT / "cupy_swap") + os.sep
    lines: set = set()
    functions: set = set()

    def trace(frame, event, arg):
        name = frame.f_code.co_filename
        if name.startswith(library):
            if event == "call":
                functions.add((name, frame.f_code.co_name))
            elif event == "line":
                lines.add((name, frame.f_lineno))
        return trace

    sys.settrace(trace)
    try:
        op(rows, stream=7)
    finally:
        sys.settrace(None)
    assert op._swapper.last_path == "kernel"
    where = sorted(f"{os.path.relpath(f, ROOT)}:{fn}" for f, fn in functions)
    assert len(lines) <= MAX_LINES and len(functions) <= MAX_FUNCTIONS, (
        f"a warm call ran {len(lines)} library lines in {len(functions)} functions "
        f"(bound {MAX_LINES} in {MAX_FUNCTIONS}): {where}"
    )


def _traced_functions(call) -> list:
    """The library functions ``call()`` enters, in order of first entry."""
    library = str(ROOT / "cupy_swap") + os.sep
    entered: list = []

    def trace(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(library):
            if frame.f_code.co_name not in entered:
                entered.append(frame.f_code.co_name)
        return None

    sys.settrace(trace)
    try:
        call()
    finally:
        sys.settrace(None)
    return entered


def test_a_calls_own_mode_or_check_takes_the_common_path_of_an_op_prepared_with_them(monkeypatch):
    """Issue 50, item 2: a call that passes ``mode=`` or ``check=`` is handed
    to this op as prepared with them (made at the first such call, kept), so
    from the second call on it runs the common call there, not the general
    path; a call with ``check="host"`` still takes the general path, which
    checks its rows on the host."""
    from cupy_swap import prepared

    monkeypatch.setattr(prepared, "stream_is_capturing", lambda handle: False)
    op, rows, _gpu = _warm_op()
    for _ in range(2):
        op(rows, stream=7, mode="kernel")
    entered = _traced_functions(lambda: op(rows, stream=7, mode="kernel", check="launch"))
    assert "_general" not in entered, entered
    entered = _traced_functions(lambda: op(rows, stream=7, mode="kernel"))
    assert "_general" not in entered and "_variant" in entered, entered
    variant = op._variants[("kernel", None)]
    assert variant._variants == {} and op._swapper.last_path == "kernel"
    assert op(rows, stream=7, mode="kernel", check="host").path == "kernel"
    assert ("kernel", "host") in op._variants
    with pytest.raises(ValueError, match="mode"):
        op(rows, stream=7, mode="fast")
    with pytest.raises(ValueError, match="check: expected None, 'launch' or 'host', got 'gpu'"):
        op(rows, stream=7, check="gpu")


def test_many_rows_that_are_not_one_run_take_the_common_path(monkeypatch):
    """From auto's run threshold on, the common call makes auto's O(1) look
    itself (core/route.py, run_route): scattered rows stay on it (the
    general path once made the look for them), a mapping that is one run on
    each side goes to the general path, which routes it."""
    from cupy_swap import prepared

    monkeypatch.setattr(prepared, "stream_is_capturing", lambda handle: False)
    op, rows, _gpu = _warm_op(n=1250)
    low, high, _ = op._decided.fast_rows
    op._decided.fast_rows = (low, high, 1000)  # the stand-in's layout (GPU -> GPU) has no threshold
    assert "_general" not in _traced_functions(lambda: op(rows, stream=7))
    assert op._swapper.last_path == "kernel"
    run = np.column_stack([np.arange(1250), np.arange(1250) + 3]).astype(np.int64)
    assert "_general" in _traced_functions(lambda: op(run, stream=7))


def test_a_run_past_an_end_raises_before_anything_is_launched(monkeypatch):
    """Auto's look finds rows that are one run on both sides (so the copy
    engines, one copy a part: NOTES 85), but the run passes the source's
    last block: its ends are in no range, so the full check raises,
    naming the row, before any copy or launch."""
    from cupy_swap import prepared

    monkeypatch.setattr(prepared, "stream_is_capturing", lambda handle: False)
    op, rows, _gpu = _warm_op(n=1250)
    low, high, _ = op._decided.fast_rows
    # The stand-in's layout (GPU -> GPU) has no run threshold: as a layout with one at 1,000 rows.
    op._decided.fast_rows, op._decided.kernel_rows, op._decided.run_rows = (
        (low, high, 1000),
        (low, 1000),
        1000,
    )
    path = op._swapper.last_path
    run = np.column_stack([np.arange(1300, 2550), np.arange(1250)]).astype(np.int64)  # 2,502 blocks
    with pytest.raises(IndexError, match="source block index 2502 in row 1202 is out of range"):
        op(run, stream=7)
    assert op._swapper.last_path == path  # nothing ran
    assert op(run[:1000], stream=7).path == "dma"  # in range: one copy a part
