"""The hot path: one swap of a layout prepared once, the one path every call
takes (``swap()`` looks the op up and lands here too).

Everything the layout decides was decided when the op was made
(:class:`_Decided`): route, kernel, whether its launches can check.  A call
reads the mapping's form, takes the stream, picks the path (auto's look at
the rows' ends is O(1); a run it finds is verified, O(n), only where the
copy moves at least ``dma_min_copy_bytes``), enqueues the waits, asks
whether the stream captures, and for the kernel takes one free slot, writes
its rows there, launches the kernel over that slot and records one event
(:meth:`PreparedSwap._launch_kernel`).  Every
kernel swap's rows are checked by the launch itself, at every row count up
to the launch's table (8192 rows on an H200), unless ``check="host"``;
copy-engine, staged and captured swaps are checked on the host.  How a
launch's verdict reaches its caller: :mod:`.cuda.outcomes`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .api_types import Mapping, Stream, WaitFor
from .core.copies import run_copies
from .core.layout import DIRECTION_TEXT, IN, Layout
from .core.mapping import check_rows_for, host_rows, one_run, run_in_range
from .core.route import check_mode, prepared_route, run_route, run_rows, staged_refusal
from .cuda import abi, capture, memory, pools, release
from .cuda.gpu_mapping import device_rows
from .cuda.outcomes import Channel, here
from .cuda.streams import stream_is_capturing, stream_on_device, torch_stream_getter, wait_handle
from .op_cache import listed
from .staged.plan import staged_plan

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
        "kernel_rows",
        "fast_rows",
        "gpu_rows",
        "ring",
    )

    def __init__(self, swapper, layout: Layout, torch_parts: bool, mode: str | None, check: str | None):
        lau = swapper._launcher
        self.layout = layout
        self.kernel = lau.bind(layout)
        self.ring = lau.slots
        self.mode = swapper.mode if mode is None else mode  # the op's own, or its swapper's
        policy = swapper.policy
        self.route = prepared_route(layout, self.mode, policy)
        # auto's look for one run (core/route.py, run_route), and whether
        # copies merge runs: only blocks below a full-speed copy gain by it.
        self.run_rows = run_rows(layout, policy)
        self.staged_ok = not staged_refusal(layout, policy) and lau.slots_ok
        self.merge_runs = layout.min_block_bytes < policy.dma_min_copy_bytes
        # (low, high): a call with no mode and host rows, low < n < high,
        # goes to the kernel with no further look (what _path decides).
        kernel_auto = self.route == "kernel" and self.mode == "auto" and layout.bytes_per_pair
        self.kernel_rows = (
            (policy.dma_max_copies // len(layout.src), self.run_rows or (1 << 62)) if kernel_auto else (0, 0)
        )
        # The launch can check: the ring (and its status records) mapped, no parts that may
        # share bytes (only the host checks those), blocks its table holds
        # (then every row of every call is checked there, up to the
        # launcher's check_rows_max rows).
        self.launch_checks = bool(
            lau.slots.mapped
            and layout.kernel_ok
            and not layout.meeting
            and max(layout.src_limit, layout.dst_limit) < abi.CHECK_KEY_LIMIT
        )
        # The one-screen call (PreparedSwap.__call__) serves low < n < high rows; (0, 0): never.
        kernel_only = self.route == "kernel" and self.mode == "kernel" and layout.bytes_per_pair
        low, high = (0, 1 << 62) if kernel_only else self.kernel_rows
        checks = self.launch_checks and check != "host"

        # From look rows on (auto's threshold, core/route.py run_rows), it first makes auto's
        # O(1) look for one run; a mapping that is one goes to the copy engines or staging.
        look = high if kernel_auto else 1 << 62
        high = (1 << 62) if kernel_auto else high
        self.fast_rows = (low, min(high, lau.check_rows_max + 1), look) if checks else (0, 0, 0)
        # It serves rows on the GPU too, 0 < n < gpu_rows (0: never; they take no route).
        # (An op prepared for the copy engines or staging refuses them, as a call's own mode= does.)
        gpu_ok = checks and layout.bytes_per_pair and mode in (None, "auto", "kernel")
        self.gpu_rows = lau.check_rows_max + 1 if gpu_ok else 0
        # Read before the layout's addresses were (resolve_layout), else now (stand-in layouts).
        self.generation = memory.generation() if layout.generation is None else layout.generation
        # Torch callers are ordered on torch's current stream by default.
        self.default_stream = torch_stream_getter(swapper.device) if torch_parts else None


class PreparedSwap:
    """A swap between fixed ``src`` and ``dst``, checked and decided once;
    call it with a mapping and get a ``SwapEvent``, as
    :meth:`BlockSwapper.swap` does.  Made by :meth:`BlockSwapper.prepare`.

    Parameters of a call
    --------------------
    block_mapping : list or (N, 2) array of rows, or a tuple (src_indices, dst_indices)
        As for :meth:`BlockSwapper.swap`, told apart by type alone: a list
        or an ``(N, 2)`` array or tensor is ``(src_block, dst_block)`` rows;
        a tuple is always the pair form ``(src_indices, dst_indices)`` (a
        tuple of any other length raises ``ValueError``); ``N <= max_blocks``.
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
        "_mode",
        "_check",
        "direction",
        "bytes_per_pair",
        "_last_stream",
        "_variants",
    )

    def __init__(
        self,
        swapper,
        layout: Layout,
        held: tuple | None,
        torch_parts: bool = False,
        outcomes: Channel | None = None,
        mode: str | None = None,
        check: str | None = None,
    ):
        self._swapper = swapper
        self._torch = torch_parts
        # What prepare(mode=, check=) fixed (None: the swapper's mode, the launch checks).
        self._mode, self._check = mode, check
        self._decided = _Decided(swapper, layout, torch_parts, mode, check)
        # Where failed checks of its swaps wait for its next call (swap()'s
        # ops get the channel of their arrays, which outlives the op cache).
        self._outcomes = Channel() if outcomes is None else outcomes
        # The caller's arrays, kept alive as long as the op (None for the
        # ops swap() caches: the cache holds its arrays weakly and re-checks).
        self._held = held
        # The last stream= object and its handle (checked once per object).
        self._last_stream = (None, 0)
        self._variants: dict = {}  # (mode, check) -> this op as prepared with them (_variant)
        self.direction = layout.direction
        self.bytes_per_pair = layout.bytes_per_pair

    route = property(lambda self: self._decided.route)

    def captured(self, max_rows: int | None = None, *, ring: int = 64, rows=None, count=None):
        """A swap of these arrays to capture into your own CUDA graph, whose
        rows your kernels write in each replay: see
        :class:`cupy_swap.graphs.captured.CapturedSwap`.

        Parameters
        ----------
        max_rows : int, optional
            Most rows one replay copies (default: ``max_blocks``, at most the
            rows one launch can check).
        ring : int, optional
            Failed replays' verdicts kept until
            :meth:`~cupy_swap.graphs.captured.CapturedSwap.failures` reads them
            (default 64; good replays take no room).
        rows : GPU array, optional
            Your own row buffer, read in place by every replay: int64,
            C-contiguous, shape ``(N, 2)`` of ``(src_block, dst_block)`` or a
            tuple of two 1-D arrays ``(src_blocks, dst_blocks)``, ``N >=
            max_rows`` (CuPy or torch).  Default: the swap's own
            ``rows`` buffer.
        count : GPU array, optional
            Your own row count, one int64 element, copied into the swap's
            record on the stream right before each launch.  Default: the
            swap's own ``count``.
        """
        from .graphs.captured import CapturedSwap

        sw = self._swapper
        if sw._closed:
            raise RuntimeError("captured: this BlockSwapper is closed; make a new one")
        if self._check == "host" or self._mode not in (None, "auto", "kernel"):
            raise ValueError(
                f"captured: a captured swap is the kernel, checking in each replay the rows your kernels "
                f"wrote; this op was prepared with mode={self._mode!r}, check={self._check!r} (prepare it "
                f"with neither, or mode='auto' or 'kernel')"
            )
        if self._decided.generation != memory.generation() and self._held is not None:
            self._rebind()  # host memory registered or unregistered since: its aliases again
        if max_rows is None:
            max_rows = min(sw.max_blocks, sw._launcher.check_rows_max)
        return CapturedSwap(self, max_rows, ring, rows=rows, count=count)

    def _rebind(self) -> _Decided:
        """Resolve the host aliases again after a registration changed
        (raises if this op's host memory is no longer pinned).  Threads
        inside a call keep the state they read: nothing is torn down."""
        sw = self._swapper
        with capture.relaxed():  # may resolve and load kernels while another thread captures
            decided = _Decided(sw, sw._layout(*self._held), self._torch, self._mode, self._check)
        self._decided = decided
        return decided

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
        """The common call, one screen: host rows (or rows on the GPU) the
        kernel copies and checks in its launch, from the swapper's GPU, with
        no per-call ``mode``/``check``/timing, not capturing.  Anything else
        goes to :meth:`_general` before anything is enqueued."""
        sw, op, caller = self._swapper, self._decided, self._swapper._get_device()
        if (  # (ring is set when the look reaches it, and used only then)
            caller != sw.device or mode is not None or check is not None or timing or sw.timing or sw._closed
            or op.generation != memory._generation[0] or self._outcomes.failed or (ring := op.ring).alarmed()
        ):  # fmt: skip
            return self._other(caller, block_mapping, stream, None, mode, wait_for, timing, check)
        if (kind := type(block_mapping)) is np.ndarray or kind is list:
            rows, write, (low, high, look) = host_rows(block_mapping, sw.max_blocks), ring.write, op.fast_rows
            n = len(rows) >> 1 if type(rows) is list else rows.shape[0]
        else:  # rows on the GPU, read and checked by the launch (None: host index pairs)
            rows, write = device_rows(block_mapping, sw.device, sw.max_blocks), ring.write_gpu
            n, low, high, look = (0, 0, 0, 0) if rows is None else (rows.n, 0, op.gpu_rows, 1 << 62)
        if not low < n < high or n >= look and run_route(rows, n, op.layout.direction, op.staged_ok):
            return self._general(caller, block_mapping, stream, None, mode, wait_for, timing, check)
        handle = last[1] if stream is (last := self._last_stream)[0] is not None else self._handle(stream, op)
        if wait_for is not None and not (type(wait_for) is tuple and not wait_for):  # 0 is a stream
            self._enqueue_waits(handle, wait_for, caller)
        if stream_is_capturing(handle):  # asked after the waits: they may have joined a capture
            return self._general(caller, block_mapping, stream, None, mode, (), timing, check, capturing=True)
        event = sw._events.take("kernel", n * op.layout.bytes_per_pair)
        i, launched = ring.take(), False
        if op.generation != memory._generation[0]:  # a registration changed since the look above
            ring.give_back(i)  # (unpinning waits for taken slots: memory.before_unpin)
            return self._general(
                caller, block_mapping, stream, None, mode, (), timing, check, capturing=False
            )
        try:
            seq = write(i, rows, n, (self._outcomes, op.layout, here.ref), event)
            op.kernel.launch_slot(i, handle)
            ring.pending[i], launched = seq, True  # launched: free once its kernel writes seq
            sw._record(event.ptr, handle)
        except BaseException:  # nothing launched: the slot back; else nobody is told its verdict
            ring.abandon(i, event, launched)  # (launched, not the ring: the slot may be another's by now)
            raise
        sw.last_path = "kernel"
        return event

    def _other(self, caller: int, block_mapping, stream, want, mode, wait_for, timing, check):
        """:meth:`_general` with the swapper's GPU current (``caller`` was
        current when the caller called: default-stream ``wait_for`` entries
        are its); ``want``: the direction ``swap_in``/``swap_out`` ask for.
        A call's own ``mode`` or ``check`` goes to the op prepared with them
        (:meth:`_variant`), whose calls take the common path where it serves."""
        sw = self._swapper
        if (mode is not None or check is not None) and caller == sw.device and not (timing or sw._closed):
            return self._variant(mode, check)(block_mapping, stream=stream, wait_for=wait_for, timing=timing)
        if caller != sw.device:
            return sw._on_own_device(
                self._general, caller, block_mapping, stream, want, mode, wait_for, timing, check
            )
        return self._general(caller, block_mapping, stream, want, mode, wait_for, timing, check)

    def _variant(self, mode, check) -> PreparedSwap:
        """This op as ``prepare(src, dst, mode=, check=)`` would make it with
        a call's own ``mode``/``check`` (the op's own where None), made at
        the first such call; its failures go to this op's channel."""
        key = (self._mode if mode is None else mode, self._check if check is None else check)
        variant = self._variants.get(key)
        if variant is None:
            if mode is not None:
                check_mode(mode)
            if check is not None and check != "launch" and check != "host":
                raise ValueError(f"check: expected None, 'launch' or 'host', got {check!r}")
            with capture.relaxed():  # may load kernels while another thread captures
                variant = PreparedSwap(
                    self._swapper, self._decided.layout, self._held, self._torch, self._outcomes, *key
                )
            self._variants[key] = variant
        return variant

    def _handle(self, stream, op: _Decided) -> int:
        """The raw handle of ``stream`` (``None``: torch's or CuPy's current
        stream); a stream object's is kept for its next call."""
        if stream is None:
            return (
                op.default_stream() if op.default_stream is not None else self._swapper._current_stream().ptr
            )
        handle = stream_on_device(stream, self._swapper.device)
        self._last_stream = (stream, handle)
        return handle

    def _enqueue_waits(self, handle: int, wait_for, caller: int) -> None:
        """Order ``handle`` after every entry of ``wait_for``."""
        sw = self._swapper
        for item in listed(wait_for):  # each wait enqueued before the next record (one event a thread)
            w = wait_handle(item, sw.device, caller)
            if w.event_ptr:  # 0: an unrecorded torch event, nothing to wait for (streams.NO_WAIT)
                sw._wait_event(handle, w.event_ptr, 0)

    def _general(
        self, caller: int, block_mapping, stream, want, mode, wait_for, timing, check, capturing=None
    ):
        """Every call :meth:`__call__` does not serve: a caller on another
        GPU, per-call ``mode``, ``check`` or timing, rows as index pairs or
        more than one launch checks, the copy engines, staging, capture,
        refusals, an earlier swap's failure."""
        sw = self._swapper
        if sw._closed:
            raise RuntimeError("swap: this BlockSwapper is closed; make a new one")
        check = self._check if check is None else check  # a call's own, or what prepare() fixed
        op = self._decided
        if op.generation != memory.generation() and self._held is not None:
            op = self._rebind()
        outcomes = self._outcomes
        ring = sw._launcher.slots
        if outcomes.failed or ring.alarmed():
            outcomes.raise_pending(ring)  # an earlier swap's launch found a bad row: say so now
        if want is not None and op.layout.direction != want:
            self._refuse_direction(want)
        if check is not None and check != "launch" and check != "host":
            raise ValueError(f"check: expected None, 'launch' or 'host', got {check!r}")
        # 1. The rows: on the host (NumPy's (N, 2) int64 taken as it is), or on the GPU.
        on_gpu = (
            None
            if type(block_mapping) is np.ndarray
            else device_rows(block_mapping, sw.device, sw.max_blocks)
        )
        if on_gpu is None:
            rows = host_rows(block_mapping, sw.max_blocks)
            n = len(rows) >> 1 if type(rows) is list else rows.shape[0]
        else:
            rows, n = None, on_gpu.n
        last = self._last_stream
        handle = last[1] if stream is not None and last[0] is stream else self._handle(stream, op)
        # 2. The path, and every refusal, before any wait is enqueued.
        low, high = op.kernel_rows
        if low < n < high and mode is None and on_gpu is None:
            path, looked = "kernel", False
        else:
            path, looked = self._path(op, rows, on_gpu, n, mode, check)
        checked = (
            path == "kernel" and check != "host" and op.launch_checks and n <= sw._launcher.check_rows_max
        )
        run = None  # one run both sides on the copy engines: a copy per part, its ends all it checks
        if path == "dma" and on_gpu is None and not op.layout.meeting:
            ends = looked or one_run(rows, n)  # a run past an end: the full check raises, naming its row
            run = ends and run_in_range(ends, n, op.layout) and run_copies(op.layout, ends[0], ends[1], n)
        if path != "none" and not checked and not run:
            rows = check_rows_for(op.layout, rows, sw.max_blocks)  # raises before any launch
        plan = self._staged(op.layout, rows, looked) if path == "staged" else None
        if plan is False:
            path = "kernel"  # auto's choice, not the caller's: no arena, the kernel copies (rows checked)
        if wait_for is not None and not (type(wait_for) is tuple and not wait_for):  # 0 is a stream
            self._enqueue_waits(handle, wait_for, caller)
        # 3. Asked after the waits: waiting on a capturing stream joins its capture.
        if capturing is None or path == "none":  # else the fast path asked after its waits
            capturing = path != "none" and stream_is_capturing(handle)
        if capturing:
            path, rows, checked = self._captured(op, path, rows, on_gpu, checked, looked)
        # 4. One launch (or the copy engines' copies), one event.
        timed = sw.timing if timing is None else timing
        # A captured record's event is none of the pool's: a release waits for every pool event,
        # and waiting for one recorded in a capture would break that capture.  An empty swap's
        # neither: it moves nothing, and its stream is not asked whether it captures.
        event = (sw._events.untracked if capturing or path == "none" else sw._events.take)(
            path, n * op.layout.bytes_per_pair, timed
        )
        slot = -1  # the ring slot of a checked launch
        recorded = False
        try:
            if timed:
                event.start = capture.new_event(timing=True)
                sw._record(event.start.ptr, handle)
            if path == "kernel":
                slot = self._launch_kernel(op, rows, on_gpu, n, handle, capturing, checked, event)
            elif path == "dma":
                sw._dma.copy(op.layout, rows, handle, capturing, op.merge_runs or bool(looked), run)
            elif path == "staged":
                sw._stagers[op.layout.direction].enqueue(op.layout, plan, handle, sw._launcher, sw._dma)
            sw._record(event.ptr, handle)
            recorded = True
        finally:
            if slot >= 0 and not recorded:
                ring.forget(slot, event)  # the caller gets no event: nobody is told its verdict
        sw.last_path = path
        return event

    def _launch_kernel(
        self, op: _Decided, rows, on_gpu, n: int, handle: int, capturing: bool, checked, event
    ) -> int:
        """The one kernel launch of a swap; its ring slot when the launch
        checks the rows (its verdict comes back there: :mod:`.cuda.slots`),
        else -1.  Eager: the rows (or where the GPU rows are) into a free
        slot, the kernel launched over it."""
        sw = self._swapper
        lau = sw._launcher
        if capturing:
            op.kernel.launch_captured(rows, n, handle)  # rows checked on the host: fixed for every replay
            return -1
        ring = lau.slots
        i = ring.take()
        if op.generation != memory._generation[0]:  # a registration changed since this call resolved
            ring.give_back(i)
            raise RuntimeError(
                "swap: pinned memory was registered or unregistered during this call; nothing was "
                "launched: call again"
            )
        launched = False
        try:
            owner = (self._outcomes, op.layout, here.ref)
            if on_gpu is not None:  # checked (else refused); its arrays held by the slot until it ran
                seq = ring.write_gpu(i, on_gpu, n, owner, event)
            elif checked:  # who is told its verdict: known before the launch can write it
                seq = ring.write(i, rows, n, owner, event)
            else:  # rows the host checked: no verdict comes back
                seq = ring.write_unchecked(i, rows, n)
            op.kernel.launch_slot(i, handle)
            launched = True
        finally:
            if launched:
                ring.pending[i] = seq
            else:
                ring.give_back(i)
        return i if checked else -1

    def _path(self, op: _Decided, rows, on_gpu, n: int, mode, check) -> tuple[str, bool]:
        """``(path, looked)``: what serves a swap of ``n`` rows, and whether
        auto's look at the rows' ends chose it (O(1): core/route.py; for
        ``"dma"``, the rows' first row when they are one run: :func:`one_run`)."""
        layout = op.layout
        if not n or not layout.bytes_per_pair:
            return "none", False
        if on_gpu is not None:  # (the op's own mode is in its route, but for this refusal)
            self._refuse_on_gpu(op, self._mode if mode is None else mode, check, n)
            return "kernel", False  # the kernel reads rows on the GPU
        sw = self._swapper
        path = op.route if mode is None else prepared_route(layout, check_mode(mode), sw.policy)
        if path != "kernel" or (mode or op.mode) != "auto":
            return path, False
        if n * len(layout.src) <= sw.policy.dma_max_copies:
            return "dma", False  # one copy: the copy engines start sooner
        if op.run_rows is not None and n >= op.run_rows:  # one run of enough bytes (NOTES 58)
            run = run_route(rows, n, layout.direction, op.staged_ok)
            # Ends that span n blocks but no single run (0, 2, .., 1, 3, ..) would be
            # copied block by block: the kernel is faster (NOTES 61).  O(n) NumPy,
            # paid only where the copy that follows moves at least dma_min_copy_bytes.
            if run == "dma":  # looked: the run's first row, so the call need not find it again
                ends = one_run(rows, n)
                return ("dma", ends) if ends else ("kernel", False)
            if run is not None:
                return run, True
        return "kernel", False

    def _staged(self, layout: Layout, rows, looked: bool):
        """The staged plan, or False where auto chose staging and it cannot
        run now (no arena): the kernel copies instead."""
        try:
            return self._staged_ready(layout, _rows_array(rows))
        except ValueError:
            if not looked:
                raise
            return False

    def _captured(self, op: _Decided, path: str, rows, on_gpu, checked: bool, looked: bool):
        """``(path, rows, checked)`` of a swap on a capturing stream: a
        captured launch keeps its rows, checked once on the host, here."""
        if on_gpu is not None:
            raise RuntimeError(
                "swap: a mapping on the GPU cannot be captured into a CUDA graph (its check reports "
                "through the returned event); pass the rows on the host, or use graph_swap()"
            )
        release.keep_for_process(pools.owners(op.layout))  # a replay may come at any time: stay pinned
        if checked:
            rows = check_rows_for(op.layout, rows, self._swapper.max_blocks)
        if path == "staged" and looked:
            path = "kernel"  # auto's choice; the rows were checked on the host
        elif path == "staged":
            raise ValueError(
                "mode: 'staged' cannot be captured into a CUDA graph; use mode='kernel' or graph_swap()"
            )
        return path, rows, False

    def _refuse_direction(self, want: str) -> None:
        method = "swap_in" if want == IN else "swap_out"
        raise ValueError(
            f"{method}: expected {DIRECTION_TEXT[want]} arrays, got "
            f"{DIRECTION_TEXT[self._decided.layout.direction]}; use swap() for that"
        )

    def _refuse_on_gpu(self, op: _Decided, mode, check, n: int) -> None:
        """Refuse what a mapping on the GPU cannot do, before anything is
        enqueued: the kernel reads it and checks it in the launch."""
        layout = op.layout
        if mode not in (None, "auto", "kernel"):
            raise ValueError(
                f"mode: a mapping on the GPU is swapped by the kernel ('auto' or 'kernel'), got {mode!r} "
                f"(the call's mode=, or the op's from prepare(mode=))"
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
        lau = sw._launcher
        if not (lau.slots_ok and lau.kernel_takes(len(layout.src))):
            raise ValueError(
                "mode: 'staged' scatters or gathers with the kernel, which this swapper cannot launch "
                "(its row ring cannot be mapped, or this CUDA takes no kernel of this many parts); use mode='dma'"
            )
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
