"""The hot path: one swap of a checked layout, the one path every call
takes (``BlockSwapper.swap()`` looks the op up and lands here too).

A call does, in order: check the mapping (vectorized; short ones without
NumPy), take the stream, route, enqueue the waits, launch (inline
parameters through a kernel node, the descriptor ring for large swaps, or
the copy engines), record the returned event.  Python work is O(1) in the
number of pairs and parts: no loop over either.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import numpy as np

from .api_types import Mapping, Stream, WaitFor
from .core.layout import DIRECTION_TEXT, IN, Layout
from .core.mapping import checked_pairs
from .core.route import MODES, route
from .cuda import abi, memory
from .cuda.gpu_mapping import GpuChecks, device_mapping
from .cuda.streams import stream_is_capturing, stream_on_device, wait_handle

if TYPE_CHECKING:
    from .cuda.streams import SwapEvent

__all__ = ["PreparedSwap"]

_CHECKS_LOCK = threading.Lock()
# Mappings that are on the host whatever they hold (the common case, told
# apart without a call; anything else may be a GPU array: device_mapping).
_HOST_KINDS = (list, tuple, np.ndarray)


class PreparedSwap:
    """A swap between fixed ``src`` and ``dst``, checked once; call it with
    a mapping.  Made by :meth:`BlockSwapper.prepare`.

    Parameters of a call
    --------------------
    block_mapping : array-like of shape (N, 2)
        ``(src_block, dst_block)`` rows, ``N <= max_blocks``.
    stream, mode, wait_for, timing
        As for :meth:`BlockSwapper.swap`.

    Returns a ``SwapEvent``, as :meth:`BlockSwapper.swap` does.

    Attributes
    ----------
    direction : str
        ``"in"``, ``"out"`` or ``"gpu->gpu"``.
    bytes_per_pair : int
        Bytes one mapping row moves, all parts together.
    """

    __slots__ = (
        "__weakref__",
        "_swapper",
        "_layout",
        "_kernel",
        "_generation",
        "_gpu_checks",
        "_held",
        "direction",
        "bytes_per_pair",
    )

    def __init__(self, swapper, layout: Layout, held: tuple | None):
        self._swapper = swapper
        self._bind(layout)
        # The caller's arrays, kept alive as long as the op (None for the
        # ops swap() caches: the cache holds its arrays weakly and re-checks).
        self._held = held

    def _bind(self, layout: Layout) -> None:
        self._layout = layout
        self._kernel = self._swapper._launcher.bind(layout)
        self._gpu_checks = None  # built by the first swap with a mapping on the GPU
        self._generation = memory.generation()
        self.direction = layout.direction
        self.bytes_per_pair = layout.bytes_per_pair

    def __call__(
        self,
        block_mapping: Mapping,
        *,
        stream: Stream = None,
        mode: str | None = None,
        wait_for: WaitFor = (),
        timing: bool | None = None,
    ) -> SwapEvent:
        sw = self._swapper
        caller = sw._get_device()
        if caller != sw.device:
            return sw._on_own_device(self._run, caller, block_mapping, stream, None, mode, wait_for, timing)
        return self._run(caller, block_mapping, stream, None, mode, wait_for, timing)

    def _run(self, caller: int, block_mapping, stream, want, mode, wait_for, timing):
        """The swap, with the swapper's GPU current (``caller`` was current
        when the caller called: default-stream ``wait_for`` entries are
        its); ``want``: the direction ``swap_in``/``swap_out`` ask for."""
        sw = self._swapper
        if sw._closed:
            raise RuntimeError("swap: this BlockSwapper is closed; make a new one")
        if self._generation != memory.generation() and self._held is not None:
            # A registered range went away: resolve the host aliases again
            # (raises if this op's host memory is no longer pinned).
            self._bind(sw._layout(*self._held))
        layout = self._layout
        if self._gpu_checks is not None:  # a mapping on the GPU failed its check: say so now
            self._gpu_checks.raise_earlier_failure()
        if want is not None and layout.direction != want:
            method = "swap_in" if want == IN else "swap_out"
            raise ValueError(
                f"{method}: expected {DIRECTION_TEXT[want]} arrays, got "
                f"{DIRECTION_TEXT[layout.direction]}; use swap() for that"
            )
        on_gpu = (
            None
            if type(block_mapping) in _HOST_KINDS
            else device_mapping(block_mapping, sw.device, sw.max_blocks)
        )
        if on_gpu is None:
            pairs = checked_pairs(layout, block_mapping, sw.max_blocks)  # raises before any launch
            n = len(pairs) >> 1 if type(pairs) is list else pairs.shape[0]
        else:
            pairs, n = on_gpu, on_gpu.n
        handle = sw._current_stream().ptr if stream is None else stream_on_device(stream, sw.device)
        if mode is None:
            mode = sw.mode
        elif mode not in MODES:
            raise ValueError(f"mode: expected one of {', '.join(map(repr, MODES))}, got {mode!r}")
        no_waits = wait_for is None or (type(wait_for) is tuple and not wait_for)  # 0 is a stream
        waits = () if no_waits else [wait_handle(w, sw.device, caller) for w in _as_sequence(wait_for)]
        path = "none"
        if n and layout.bytes_per_pair:
            # Waiting on a capturing stream makes this one capture too.
            capturing = stream_is_capturing(handle) or (bool(waits) and any(w.capturing for w in waits))
            if on_gpu is not None:
                path, plan = self._gpu_checks_ready(mode, capturing), None
            else:
                path, plan = route(layout, pairs, mode, sw.policy, capturing)
            if path == "staged":
                path, plan = self._staging_ready(path, plan, mode)
        for w in waits:  # after routing: a refusal enqueues nothing
            if w.event_ptr:  # 0: an unrecorded torch event, nothing to wait for (streams.NO_WAIT)
                sw._wait_event(handle, w.event_ptr, 0)
        timed = sw.timing if timing is None else timing
        event = sw._events.take(timed)
        event.path, event.nbytes = path, n * layout.bytes_per_pair
        held: list = []  # descriptor slots this swap took (locked until gated)
        recorded = False
        try:
            if timed:
                event.start = sw._new_event()
                sw._record(event.start.ptr, handle)
            if path == "kernel" and on_gpu is not None:
                event.check = self._gpu_checks.launch(on_gpu, handle, event, sw._record)  # records the event
                recorded = True
            elif path == "kernel":
                if not self._kernel.launch(pairs, n, handle, capturing):  # too large to pass inline
                    sw._launcher.launch_descriptor(layout, pairs, handle, capturing, held)
            elif path == "dma":
                sw._dma.copy(layout, pairs, handle, capturing)
            elif path == "staged":
                sw._stagers[layout.direction].enqueue(
                    layout, plan, handle, held, sw._launcher, sw._dma, sw._serial
                )
            if not recorded:
                sw._record(event.ptr, handle)
                recorded = True
        finally:
            if held:
                sw._launcher.release(held, event if recorded else None, handle)
        sw.last_path = path
        return event

    def _gpu_checks_ready(self, mode: str, capturing: bool) -> str:
        """Refuse what a mapping on the GPU cannot do, before anything is
        enqueued, and build the op's check state on first use."""
        layout = self._layout
        if mode not in ("auto", "kernel"):
            raise ValueError(
                f"mode: a mapping on the GPU is swapped by the kernel ('auto' or 'kernel'), got {mode!r}"
            )
        if not layout.kernel_ok:
            raise ValueError(
                f"block_mapping: a mapping on the GPU needs the kernel, which needs host memory mapped into the "
                f"GPU's address space, but {layout.unmapped_reason}; pass the rows on the host"
            )
        if layout.meeting:
            raise ValueError(
                "block_mapping: these parts may share bytes, which only a mapping on the host can be checked "
                "against; pass the rows on the host"
            )
        if capturing:
            raise RuntimeError(
                "swap: a mapping on the GPU cannot be captured into a CUDA graph (its check reports through the "
                "returned event); pass the rows on the host, or use graph_swap()"
            )
        if self._gpu_checks is None:
            with _CHECKS_LOCK:  # two threads' first GPU mappings build one
                if self._gpu_checks is None:
                    sw = self._swapper
                    self._gpu_checks = GpuChecks(sw._launcher, layout, min(sw.max_blocks, abi.CHECK_MAX_ROWS))
        return "kernel"

    def _staging_ready(self, path: str, plan, mode: str):
        """Allocate the direction's staging arena (first staged swap), before
        anything is enqueued.  If GPU memory is short, ``auto`` falls back to
        the kernel (or the copy engines where host memory is not mapped) and
        ``mode="staged"`` raises."""
        from cupy.cuda.memory import OutOfMemoryError

        layout = self._layout
        stager = self._swapper._stagers[layout.direction]
        try:
            with stager.lock:
                stager.ensure()
        except OutOfMemoryError as e:
            if mode == "staged":
                raise ValueError(
                    f"mode: 'staged' could not allocate its staging arena of {stager.staging_bytes} "
                    f"bytes ({e}); lower staging_bytes or use mode='kernel'"
                ) from None
            return ("kernel" if layout.kernel_ok else "dma"), None
        return path, plan

    def __repr__(self) -> str:
        parts = len(self._layout.src)
        return (
            f"PreparedSwap({DIRECTION_TEXT[self.direction]}, {parts} part{'s' * (parts != 1)}, "
            f"{self.bytes_per_pair} bytes per pair, GPU {self._swapper.device})"
        )


def _as_sequence(items) -> tuple:
    if items is None:
        return ()
    if isinstance(items, (list, tuple)):
        return tuple(items)
    return (items,)
