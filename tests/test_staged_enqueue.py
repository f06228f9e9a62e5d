"""The staged path's enqueue on the CPU (issue 50, item 5): a ``Stager``
over stand-ins (every CUDA call recorded, a slot ring over NumPy words,
the copier recording its copies), so the order of a staged swap's work
is held without a GPU: what each stream waits for before it copies or
launches, and what each event is recorded after.  The GPU tests
(``test_staged_gpu.py``) check the bytes; these hold the ordering that
makes them right, so the enqueue can be made cheaper without a GPU at
hand (its host time is the gap of NOTES 85)."""

from __future__ import annotations

import numpy as np
import pytest

from .fakes import STAGED_HANDLE as HANDLE
from .fakes import staged_stand_in


@pytest.fixture
def staged(monkeypatch, fake_gpu):
    """``(run, calls)`` of :func:`fakes.staged_stand_in`."""
    run, calls, stager = staged_stand_in(monkeypatch, fake_gpu)
    yield run, calls
    stager.close()


def _mapping(direction, n, rng):
    run = np.arange(5, 5 + n)
    gpu = rng.choice(2500, n, replace=False)
    return np.column_stack((run, gpu) if direction == "in" else (gpu, run)).astype(np.int64)


def _waits_between(calls, stream, event, lo: int, hi: int) -> bool:
    """Whether ``stream`` waits for ``event`` between steps ``lo`` and ``hi``
    (pooled events come back: a wait is matched to its record by place)."""
    return ("wait", stream, event) in calls[lo + 1 : hi]


def test_a_staged_swap_in_scatters_each_chunk_after_its_copy_landed(staged):
    run, calls = staged
    plan = run("in", _mapping("in", 1250, np.random.default_rng(0)))
    assert plan.sizes == [1024, 170, 56]  # 32 KiB rows: half the 64 MiB arena, then the rest 3:1
    copier = next(c[1] for c in calls if c[0] == "copy")
    assert copier != HANDLE
    # The copies start after the caller's work queued before the swap (its waits included).
    start = calls[0]
    assert start[0] == "record" and start[2] == HANDLE and calls[1] == ("wait", copier, start[1])
    copies = [i for i, c in enumerate(calls) if c[0] == "copy"]
    launches = [i for i, c in enumerate(calls) if c[0] == "launch"]
    assert len(copies) == len(launches) == 3 and all(calls[i][1] == HANDLE for i in launches)
    for c, (at, launch) in enumerate(zip(copies, launches)):
        landed = calls[at + 1]  # the copy's event, recorded on the copy stream right after it
        assert landed[0] == "record" and landed[2] == copier
        assert _waits_between(calls, HANDLE, landed[1], at + 1, launch), (
            f"chunk {c} scattered before it landed"
        )
        freed = calls[launch + 1]  # its rows are free once the scatter that reads them ran
        assert freed[0] == "record" and freed[2] == HANDLE
    # No copy waits for a scatter of this swap: the rows of a fresh arena are free.
    assert copies == sorted(copies)[:3] and copies[-1] < launches[0]


def test_a_staged_swap_out_copies_each_chunk_after_its_gather(staged):
    run, calls = staged
    plan = run("out", _mapping("out", 1250, np.random.default_rng(1)))
    assert plan.sizes == [56, 170, 1024]  # a short first gather: the copy engine starts early
    copies = [i for i, c in enumerate(calls) if c[0] == "copy"]
    launches = [i for i, c in enumerate(calls) if c[0] == "launch"]
    copier = calls[copies[0]][1]
    assert copier != HANDLE and all(calls[i][1] == HANDLE for i in launches)
    for c, (launch, at) in enumerate(zip(launches, copies)):
        gathered = calls[launch + 1]
        assert gathered[0] == "record" and gathered[2] == HANDLE
        assert _waits_between(calls, copier, gathered[1], launch + 1, at), (
            f"chunk {c} copied before its gather"
        )
        freed = calls[at + 1]
        assert freed[0] == "record" and freed[2] == copier
    # The swap's end on the caller's stream is its last copy's landing.
    last_freed = calls[copies[-1] + 1][1]
    assert calls[-1] == ("wait", HANDLE, last_freed)


def test_a_second_staged_swap_waits_for_the_rows_the_first_still_reads(staged):
    """Rows of the arena are reused only after the work that last read them:
    the second swap-in's first copy waits for the first swap's scatter of
    those rows."""
    run, calls = staged
    rng = np.random.default_rng(2)
    run("in", _mapping("in", 1250, rng))
    first = list(calls)
    freed = [first[i + 1][1] for i, c in enumerate(first) if c[0] == "launch"]  # each chunk's release
    del calls[:]
    run("in", _mapping("in", 1250, rng))
    copier = next(c[1] for c in calls if c[0] == "copy")
    first_copy = next(i for i, c in enumerate(calls) if c[0] == "copy")
    waited = {c[2] for c in calls[:first_copy] if c[0] == "wait" and c[1] == copier}
    assert waited & set(freed), "a reused arena row was overwritten before the scatter that read it"


@pytest.mark.parametrize("direction", ["in", "out"])
def test_a_staged_swaps_kernel_half_stays_within_max_ctas(staged, direction):
    """``max_ctas`` bounds the SMs one swap takes, a staged swap's scatter or
    gather included: four times the CTAs ran it 1.85x faster on an H200 for
    2x the CTA time, and were taken back (NOTES 86)."""
    run, calls = staged
    run(direction, _mapping(direction, 1250, np.random.default_rng(1)))
    grids = {c[2] for c in calls if c[0] == "launch"}
    assert grids == {8}  # the stand-in launcher's max_ctas
