"""The capture rule (``cupy_swap/cuda/capture.py``) over every call site.

Every driver call that can break another thread's global-mode capture
(event creation, query and synchronize; pinned and device allocations and
frees; stream creation and synchronize; graph builds) must sit inside a
``with capture.relaxed()`` block, in a function of :data:`OFF_CAPTURE`
(which says why it cannot run then, or runs relaxed), or in ``capture.py``.
A new call site anywhere else fails this test.  The helpers themselves are
checked with a stand-in driver below."""

from __future__ import annotations

import ast
import pathlib

import pytest

from cupy_swap.cuda import capture

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "cupy_swap"
# Calls that can break another thread's capture in global mode.
SENSITIVE_CALLS = {
    "eventQuery", "eventSynchronize", "streamSynchronize", "deviceSynchronize", "synchronize",
    "hostAlloc", "freeHost", "hostRegister", "hostUnregister", "malloc", "free",
    "zeros_pinned_for_gpu", "empty_pinned", "zeros_pinned", "PinnedArray",
    "graphInstantiate", "graphDestroy", "graphExecDestroy", "create",
    "streamCreateWithFlags", "streamDestroy", "Stream", "Event", "_new_event", "_event",
    "has_function", "get_function", "_layout", "query_in_block",
}  # fmt: skip
SENSITIVE_ATTRIBUTES = {"done"}  # cupy.cuda.Event.done: cudaEventQuery

# Functions that make such calls outside a relaxed block, and why that is
# safe.  (module, qualified name): reason.
OFF_CAPTURE = {
    ("cuda/release.py", "device_free"): "the releaser thread only, relaxed for good",
    ("cuda/release.py", "drain"): "threading.Event, not a CUDA event",
    (
        "cuda/launcher.py",
        "Launcher.function",
    ): "a lookup of a kernel load_all loaded when the launcher was made",
    ("cuda/kernels.py", "load_all"): "Launcher.__init__, inside BlockSwapper.__init__'s relaxed block",
    ("cuda/slots.py", "SlotRing.__init__"): "built inside BlockSwapper.__init__'s relaxed block",
    ("staged/stager.py", "_wait_for_users"): "releaser gate",
    ("cuda/streams.py", "swap_event_class.SwapEvent.device_time"): "SwapEvent.synchronize, relaxed inside",
    (
        "cuda/kernels.py",
        "get_function",
    ): "its callers hold relaxed mode (Launcher.function, byref_args)",
    ("cuda/kernels.py", "has_function"): "its callers hold relaxed mode (Launcher.byref_args)",
    ("cuda/memory.py", "wait_for_gpus_in_use"): "releaser only (release_owned)",
    ("cuda/memory.py", "release_owned"): "releaser release",
    ("hostpool/shared.py", "_unpin"): "releaser release (release_owned)",
}


def _sites():
    """``(module, function, line, what)`` of every sensitive call outside a
    relaxed block."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith(("tools/", "remote/")) or rel == "cuda/capture.py":
            continue
        tree = ast.parse(path.read_text())
        _walk(tree, rel, [], False, found)
    return found


def _walk(node, rel, names, relaxed, found):
    for child in ast.iter_child_nodes(node):
        inner_names, inner_relaxed = names, relaxed
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            inner_names = [*names, child.name]
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            inner_relaxed = False  # a function defined in a relaxed block may run outside it
        if isinstance(child, ast.With) and any("relaxed" in ast.unparse(i.context_expr) for i in child.items):
            inner_relaxed = True
        what = None
        if isinstance(child, ast.Call):
            f = child.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
            if name in SENSITIVE_CALLS:
                what = ast.unparse(f)
        elif isinstance(child, ast.Attribute) and child.attr in SENSITIVE_ATTRIBUTES:
            what = ast.unparse(child)
        if what and not relaxed:
            found.append((rel, ".".join(n for n in names), child.lineno, what))
        _walk(child, rel, inner_names, inner_relaxed, found)


def _allowed(rel: str, qualname: str) -> bool:
    parts = qualname.split(".")
    return any((rel, ".".join(parts[:i])) in OFF_CAPTURE for i in range(1, len(parts) + 1))


def test_every_driver_call_that_can_break_a_capture_runs_relaxed():
    offending = [s for s in _sites() if not _allowed(s[0], s[1])]
    assert offending == [], "outside capture.relaxed() and OFF_CAPTURE:\n" + "\n".join(map(str, offending))


def test_every_exemption_is_still_needed():
    used = {(rel, q) for rel, name, _, _ in _sites() for q in [name] if _allowed(rel, name)}
    stale = [
        k for k in OFF_CAPTURE if not any(rel == k[0] and (q + ".").startswith(k[1] + ".") for rel, q in used)
    ]
    assert stale == []


class _StandInDriver:
    """cuThreadExchangeStreamCaptureMode of one thread, recording modes."""

    def __init__(self):
        self.mode, self.calls = 0, []

    def cuThreadExchangeStreamCaptureMode(self, ptr):
        new = ptr._obj.value
        ptr._obj.value, self.mode = self.mode, new
        self.calls.append(new)
        return 0


@pytest.fixture
def driver(monkeypatch):
    from cupy_swap.cuda import driver as driver_module

    stand_in = _StandInDriver()
    monkeypatch.setattr(driver_module, "libcuda", lambda: stand_in)
    return stand_in


class _Event:
    def __init__(self, driver):
        self.driver, self.asked_in = driver, []

    @property
    def done(self):
        self.asked_in.append(self.driver.mode)
        return True


def test_event_done_asks_in_relaxed_mode_and_restores(driver):
    event = _Event(driver)
    assert capture.event_done(event) is True
    assert event.asked_in == [capture.RELAXED] and driver.mode == 0


def test_relaxed_restores_the_mode_after_an_error(driver):
    with pytest.raises(KeyError):
        with capture.relaxed():
            assert driver.mode == capture.RELAXED
            raise KeyError
    assert driver.mode == 0 and driver.calls == [capture.RELAXED, 0]
