"""The hot path: one swap of a layout prepared once, the one path every call
takes (``swap()`` looks the op up and lands here too).

Everything the layout decides was decided when the op was made
(:class:`_Decided`).  A call reads the mapping's form, takes the stream,
enqueues the waits, asks whether the stream captures, launches once and
records one event.  Which rows the copy launch checks and which the host
checks: ``swap()``'s ``check`` (NOTES items 42, 43); how a launch's verdict
reaches its caller: :mod:`.cuda.outcomes`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .api_types import Mapping, Stream, WaitFor
from .core.layout import DIRECTION_TEXT, IN, Layout
from .core.mapping import check_rows_for, host_rows
from .core.route import check_mode, prepared_route, run_route, run_rows, staged_plan, staged_refusal
from .cuda import abi, capture, memory, release
from .cuda.gpu_mapping import device_rows
from .cuda.launcher import HOST_CHECK_ROWS
from .cuda.outcomes import Channel
from .cuda.streams import stream_is_capturing, stream_on_device, torch_stream_getter, wait_handle
from .op_cache import listed

if TYPE_CHECKING:
    from .cuda.streams import SwapEvent


class _Decided:
    """What an op decided from its layout, never changed afterwards (a new
    one replaces it when pinned memory was registered or unregistered)."""

    __slots__ = (
        "layout",
        "kernel",
        "mode",
        "route",
        "launch_checks",
        "generation",
        "default_stream",
        "run_rows",
        "staged_ok",
        "merge_runs",
    )

    def __init__(self, swapper, layout: Layout, torch_parts: bool):
        self.layout = layout
        self.kernel = swapper._launcher.bind(layout)
        self.mode = swapper.mode
        policy = swapper.policy
        self.route = prepared_route(layout, swapper.mode, policy)
        # auto's look for one run (core/route.py, run_route), and whether
        # copies merge runs: only blocks below a full-speed copy gain by it.
        self.run_rows = run_rows(layout, policy)
        self.staged_ok = not staged_refusal(layout, policy)
        self.merge_runs = layout.min_block_bytes < policy.dma_min_copy_bytes
        # The launch can check: status records mapped, no parts that may
        # share bytes (only the host checks those), blocks its table holds.
        self.launch_checks = bool(
            swapper._status.base
            and layout.kernel_ok
            and not layout.meeting
            and max(layout.src_limit, layout.dst_limit) < abi.CHECK_KEY_LIMIT
        )
        self.generation = memory.generation()
        # Torch callers are ordered on torch's current stream by default.
        self.default_stream = torch_stream_getter(swapper.device) if torch_parts else None


class PreparedSwap:
    """A swap between fixed ``src`` and ``dst``, checked and decided once;
    call it with a mapping and get a ``SwapEvent``, as
    :meth:`BlockSwapper.swap` does.  Made by :meth:`BlockSwapper.prepare`.

    Parameters of a call
    --------------------
    block_mapping : array-like of shape (N, 2), or a pair of 1-D arrays
        ``(src_block, dst_block)`` rows, ``N <= max_blocks``.
    stream, mode, wait_for, timing, check
        As for :meth:`BlockSwapper.swap`.

    Attributes
    ----------
    direction : str
        ``"in"``, ``"out"`` or ``"gpu->gpu"``.
    bytes_per_pair : int
        Bytes one mapping row moves, all parts together.
    route : str
        The path its swaps take: ``"kernel"``, ``"dma"`` or ``"staged"``.
    """

    __slots__ = (
        "__weakref__",
        "_swapper",
        "_decided",
        "_outcomes",
        "_held",
        "_torch",
        "direction",
        "bytes_per_pair",
    )

    def __init__(
        self,
        swapper,
        layout: Layout,
        held: tuple | None,
        torch_parts: bool = False,
        outcomes: Channel | None = None,
    ):
        self._swapper = swapper
        self._torch = torch_parts
        self._decided = _Decided(swapper, layout, torch_parts)
        # Where failed checks of its swaps wait for its next call (swap()'s
        # ops get the channel of their arrays, which outlives the op cache).
        self._outcomes = Channel() if outcomes is None else outcomes
        # The caller's arrays, kept alive as long as the op (None for the
        # ops swap() caches: the cache holds its arrays weakly and re-checks).
        self._held = held
        self.direction = layout.direction
        self.bytes_per_pair = layout.bytes_per_pair

    route = property(lambda self: self._decided.route)

    def __call__(
        self,
        block_mapping: Mapping,
        *,
        stream: Stream = None,
        mode: str | None = None,
        wait_for: WaitFor = (),
        timing: bool | None = None,
        check: str | None = None,
    ) -> SwapEvent:
        sw = self._swapper
        caller = sw._get_device()
        if caller != sw.device:
            return sw._on_own_device(
                self._run, caller, block_mapping, stream, None, mode, wait_for, timing, check
            )
        return self._run(caller, block_mapping, stream, None, mode, wait_for, timing, check)

    def _rebind(self) -> _Decided:
        """Resolve the host aliases again after a registration changed
        (raises if this op's host memory is no longer pinned).  Threads
        inside a call keep the state they read: nothing is torn down."""
        sw = self._swapper
        with capture.relaxed():  # may resolve and load kernels while another thread captures
            decided = _Decided(sw, sw._layout(*self._held), self._torch)
        self._decided = decided
        return decided

    def _run(self, caller: int, block_mapping, stream, want, mode, wait_for, timing, check):
        """The swap, with the swapper's GPU current (``caller`` was current
        when the caller called: default-stream ``wait_for`` entries are
        its); ``want``: the direction ``swap_in``/``swap_out`` ask for."""
        sw = self._swapper
        if sw._closed:
            raise RuntimeError("swap: this BlockSwapper is closed; make a new one")
        op = self._decided
        if op.generation != memory.generation() and self._held is not None:
            op = self._rebind()
        layout = op.layout
        outcomes = self._outcomes
        if outcomes.open or outcomes.failed:
            outcomes.raise_pending(sw._status)  # an earlier swap's launch found a bad row: say so now
        if want is not None and layout.direction != want:
            method = "swap_in" if want == IN else "swap_out"
            raise ValueError(
                f"{method}: expected {DIRECTION_TEXT[want]} arrays, got "
                f"{DIRECTION_TEXT[layout.direction]}; use swap() for that"
            )
        if check is not None and check != "launch" and check != "host":
            raise ValueError(f"check: expected None, 'launch' or 'host', got {check!r}")
        on_gpu = (
            None
            if type(block_mapping) is np.ndarray  # on the host whatever it holds: no look for GPU arrays
            else device_rows(block_mapping, sw.device, sw.max_blocks)
        )
        if on_gpu is None:
            pairs = host_rows(block_mapping, sw.max_blocks)
            n = len(pairs) >> 1 if type(pairs) is list else pairs.shape[0]
        else:
            pairs, n = None, on_gpu.n
        if stream is not None:
            handle = stream_on_device(stream, sw.device)
        elif op.default_stream is not None:
            handle = op.default_stream()
        else:
            handle = sw._current_stream().ptr
        route = op.route if mode is None else prepared_route(layout, check_mode(mode), sw.policy)
        # Decided before any wait is enqueued, so a refusal enqueues nothing;
        # only what depends on a capture waits for the capture query.
        path, checked, ticket, looked = "none", on_gpu is not None, None, False
        if n and on_gpu is not None:
            path = "kernel" if layout.bytes_per_pair else "none"  # the kernel reads rows on the GPU
            self._refuse_on_gpu(op, mode, check, n)
        elif n:
            path = route if layout.bytes_per_pair else "none"
            if (
                path == "kernel"
                and (mode or op.mode) == "auto"
                and n * len(layout.src) <= sw.policy.dma_max_copies
            ):
                path = "dma"  # one copy: the copy engines start sooner
            elif (
                path == "kernel"
                and op.run_rows is not None
                and n >= op.run_rows
                and (mode or op.mode) == "auto"
            ):  # one run of enough bytes goes to the copy engines (NOTES 58)
                path = run_route(pairs, n, layout.direction, op.staged_ok) or path
                looked = path != "kernel"
            # More than a few host rows go through a ring slot to device
            # memory, where the launch checks them for free; a few are checked
            # on the host, cheaper than the launch's check over its parameter
            # (benchmarks/NOTES.md, items 42 and 43).
            checked = (
                check != "host"
                and path == "kernel"
                and op.launch_checks
                and (check == "launch" or (n > HOST_CHECK_ROWS and op.kernel.slots_ok))
                and n <= sw._launcher.check_rows_max
            )
            if not checked:  # raises before any launch
                pairs = check_rows_for(layout, pairs, sw.max_blocks)
            if path == "staged":
                try:
                    plan = self._staged_ready(layout, _rows_array(pairs))
                except ValueError:
                    if not looked:
                        raise
                    path = "kernel"  # auto's choice, not the caller's: no arena, the kernel copies
        no_waits = wait_for is None or (type(wait_for) is tuple and not wait_for)  # 0 is a stream
        if not no_waits:
            for w in [wait_handle(w, sw.device, caller) for w in listed(wait_for)]:
                if w.event_ptr:  # 0: an unrecorded torch event, nothing to wait for (streams.NO_WAIT)
                    sw._wait_event(handle, w.event_ptr, 0)
        if path != "none":
            # Asked after the waits: waiting on a capturing stream joins its capture.
            capturing = stream_is_capturing(handle)
            if capturing and on_gpu is not None:
                raise RuntimeError(
                    "swap: a mapping on the GPU cannot be captured into a CUDA graph (its check reports "
                    "through the returned event); pass the rows on the host, or use graph_swap()"
                )
            if capturing and checked:  # a captured launch keeps its rows: checked once, here
                pairs, checked = check_rows_for(layout, pairs, sw.max_blocks), False
            if capturing and path == "staged" and looked:
                path = "kernel"  # auto's choice; the rows were checked on the host above
            elif capturing and path == "staged":
                raise ValueError(
                    "mode: 'staged' cannot be captured into a CUDA graph; use mode='kernel' or graph_swap()"
                )
        timed = sw.timing if timing is None else timing
        event = sw._events.take(timed)
        event.path, event.nbytes = path, n * layout.bytes_per_pair
        held: list = []  # descriptor slots this swap took (locked until gated)
        launched = recorded = False
        try:
            if timed:
                event.start = capture.new_event(timing=True)
                sw._record(event.start.ptr, handle)
            if checked and path == "kernel":
                ticket = sw._status.take(outcomes, layout)
                status, seq = ticket.address, ticket.seq
            else:
                status = seq = 0
            if path == "kernel":  # the copy launch is the last call of each form: it raised, or it is queued
                if on_gpu is not None:
                    op.kernel.launch_rows(on_gpu, handle, capturing, status, seq)
                else:
                    op.kernel.launch_host(pairs, n, handle, capturing, held, status, seq)
                launched = True
            elif path == "dma":
                sw._dma.copy(layout, pairs, handle, capturing, op.merge_runs)
            elif path == "staged":
                sw._stagers[layout.direction].enqueue(
                    layout, plan, handle, held, sw._launcher, sw._dma, sw._serial
                )
            sw._record(event.ptr, handle)
            recorded = True
        finally:
            if held:
                sw._launcher.release(held, event if recorded else None, handle)
            if ticket is not None and not recorded:
                ticket.abandon(launched)
            if launched and on_gpu is not None:  # the kernel reads the caller's rows: hold them
                if recorded:
                    sw._launcher.keep_until_done(event, on_gpu.keep)
                else:
                    release.keep_for_process(on_gpu.keep)  # no event to wait for
        if ticket is not None:
            event.check, event.seq = ticket, ticket.seq
        sw.last_path = path
        return event

    def _refuse_on_gpu(self, op: _Decided, mode, check, n: int) -> None:
        """Refuse what a mapping on the GPU cannot do, before anything is
        enqueued: the kernel reads it and checks it in the launch."""
        layout = op.layout
        if mode not in (None, "auto", "kernel"):
            raise ValueError(
                f"mode: a mapping on the GPU is swapped by the kernel ('auto' or 'kernel'), got {mode!r}"
            )
        if check == "host":
            raise ValueError(
                "check: 'host' needs the rows on the host; a mapping on the GPU is checked by the copy launch"
            )
        if not layout.kernel_ok:
            raise ValueError(
                f"block_mapping: a mapping on the GPU needs the kernel, which needs host memory mapped into the "
                f"GPU's address space, but {layout.unmapped_reason}; pass the rows on the host"
            )
        if not op.launch_checks:
            raise ValueError(
                "block_mapping: a mapping on the GPU is checked by the copy launch, which cannot check this swap "
                "(parts that may share bytes, 2**32 - 1 or more source or destination blocks, or status records that "
                "cannot be mapped); pass the rows on the host"
            )
        limit = self._swapper._launcher.check_rows_max
        if n > limit:
            raise ValueError(
                f"block_mapping: a mapping on the GPU holds at most {limit} rows (the launch's check table); "
                f"got {n}; split the swap or pass the rows on the host"
            )

    def _staged_ready(self, layout: Layout, pairs: np.ndarray):
        """The staged swap's chunk plan, its arena allocated (first staged
        swap of the direction), before anything is enqueued."""
        from cupy.cuda.memory import OutOfMemoryError

        sw = self._swapper
        stager = sw._stagers[layout.direction]
        try:
            with stager.lock:
                stager.ensure()
        except OutOfMemoryError as e:
            raise ValueError(
                f"mode: 'staged' could not allocate its staging arena of {stager.staging_bytes} "
                f"bytes ({e}); lower staging_bytes or use mode='kernel'"
            ) from None
        return staged_plan(layout, pairs, sw.policy)

    def __repr__(self) -> str:
        parts = len(self._decided.layout.src)
        return (
            f"PreparedSwap({DIRECTION_TEXT[self.direction]}, {parts} part{'s' * (parts != 1)}, "
            f"{self.bytes_per_pair} bytes per pair, {self.route}, GPU {self._swapper.device})"
        )


def _rows_array(pairs) -> np.ndarray:
    """Rows as an ``(N, 2)`` array (short ones come flattened)."""
    return np.array(pairs, dtype=np.int64).reshape(-1, 2) if type(pairs) is list else pairs
