"""The hot path: one swap of a checked layout.

A call does, in order: check the mapping (vectorized; short ones without
NumPy), take the stream, route, enqueue the waits, launch (inline
parameters, or the descriptor ring for large swaps), record the returned
event.  Python work is O(1) in the number of pairs and parts: no loop over
either.  ``BlockSwapper.swap()`` is a cache lookup that lands here too.

Two versions of it: :func:`_fast_path` builds, per op, a closure over
everything the common call reads (default mode and timing, no ``wait_for``,
a kernel launch or one copy), so that call costs few attribute lookups;
:meth:`PreparedSwap._run` serves every call, and the fast path hands it
whatever it does not take, with the mapping already checked.
"""

from __future__ import annotations

import weakref

from .core.layout import DIRECTION_TEXT, IN, OUT, Layout
from .core.mapping import check_mapping_for, checked_pairs, small_pairs
from .core.route import MODES, route
from .cuda import memory
from .cuda.streams import stream_is_capturing, stream_on_device, wait_handle

__all__ = ["PreparedSwap"]


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
        "__weakref__",  # the fast-path closure refers to its op weakly
        "_swapper",
        "_layout",
        "_kernel",
        "_fast",
        "_generation",
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
        self._fast = _fast_path(self)
        self._generation = memory.generation()
        self.direction = layout.direction
        self.bytes_per_pair = layout.bytes_per_pair

    def __call__(self, block_mapping, *, stream=None, mode=None, wait_for=(), timing=None):
        sw = self._swapper
        caller = sw._get_device()
        if caller != sw.device:
            return sw._on_own_device(self._call, caller, block_mapping, stream, None, mode, wait_for, timing)
        return self._call(caller, block_mapping, stream, None, mode, wait_for, timing)

    def _call(self, caller: int, block_mapping, stream, want, mode, wait_for, timing):
        """The swap, with the swapper's GPU current (``caller`` was current
        when the caller called: default-stream ``wait_for`` entries are its)."""
        if self._swapper._closed:
            raise RuntimeError("swap: this BlockSwapper is closed; make a new one")
        if self._generation != memory.generation() and self._held is not None:
            # A registered range went away: resolve the host aliases again
            # (raises if this op's host memory is no longer pinned).
            self._bind(self._swapper._layout(*self._held))
        fast = self._fast
        if (
            fast is not None
            and mode is None
            and timing is None
            and (wait_for is None or (type(wait_for) is tuple and not wait_for))  # 0 is a stream
            and (want is None or want == self.direction)
        ):
            return fast(caller, block_mapping, stream)
        return self._run(caller, block_mapping, stream, want, mode, wait_for, timing)

    def _run(self, caller: int, block_mapping, stream, want, mode, wait_for, timing, pairs=None):
        """The general path (see :meth:`_call`); ``pairs``: the mapping,
        already checked by the fast path."""
        sw = self._swapper
        layout = self._layout
        if want is not None and layout.direction != want:
            method = "swap_in" if want == IN else "swap_out"
            raise ValueError(
                f"{method}: expected {DIRECTION_TEXT[want]} arrays, got "
                f"{DIRECTION_TEXT[layout.direction]}; use swap() for that"
            )
        if pairs is None:
            pairs = checked_pairs(layout, block_mapping, sw.max_blocks)  # raises before any launch
        n = len(pairs) >> 1 if type(pairs) is list else pairs.shape[0]
        handle = sw._current_stream().ptr if stream is None else stream_on_device(stream, sw.device)
        if mode is None:
            mode = sw.mode
        elif mode not in MODES:
            raise ValueError(f"mode: expected one of {', '.join(map(repr, MODES))}, got {mode!r}")
        waits = [wait_handle(w, sw.device, caller) for w in _as_sequence(wait_for)]

        def capturing() -> bool:
            # Waiting on a capturing stream makes this one capture too.
            return stream_is_capturing(handle) or any(w.capturing for w in waits)

        path, plan = (
            route(layout, pairs, mode, sw.policy, capturing)
            if n and layout.bytes_per_pair
            else ("none", None)
        )
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
            if path == "kernel":
                if not self._kernel.launch(pairs, n, handle):  # too large to pass inline
                    sw._launcher.launch_descriptor(layout, pairs, handle, capturing(), held)
            elif path == "dma":
                sw._dma.copy(layout, pairs, handle, capturing)
            elif path == "staged":
                sw._stagers[layout.direction].enqueue(
                    layout, plan, handle, held, sw._launcher, sw._dma, sw._serial
                )
            sw._record(event.ptr, handle)
            recorded = True
        finally:
            if held:
                sw._launcher.release(held, event if recorded else None, handle)
        sw.last_path = path
        return event

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


_KINDS = {IN: 1, OUT: 2}  # cudaMemcpyKind of a one-block copy


def _fast_path(op: PreparedSwap):
    """The common call of ``op`` as a closure ``fast(caller, mapping,
    stream)``, or None when the layout never takes it (parts whose bytes may
    meet, unmapped host memory, zero-byte blocks).

    It serves calls with the swapper's default mode (``"auto"`` or
    ``"kernel"``) and timing, no ``wait_for``, that route to the inline
    kernel or, for one block of one part, to one copy; everything else goes
    to :meth:`PreparedSwap._run` with the checked pairs.  The routing is
    :func:`cupy_swap.core.route.route`'s, short-cut where its answer is
    known without the mapping's runs.
    """
    sw, layout, kernel = op._swapper, op._layout, op._kernel
    if layout.meeting or not layout.kernel_ok or not layout.bytes_per_pair:
        return None
    op_ref = weakref.ref(op)  # the op holds this closure: no reference cycle

    def run(*args):  # the general path, for the calls the closure does not take
        return op_ref()._run(*args)

    src_limit, dst_limit, max_blocks = layout.src_limit, layout.dst_limit, sw.max_blocks
    parts, bpp = len(layout.src), layout.bytes_per_pair
    smallest, largest = layout.min_block_bytes, layout.max_block_bytes
    device, launch = sw.device, kernel.launch
    current_stream, record, take = sw._current_stream, sw._record, sw._events.take
    from cupy.cuda.runtime import memcpyAsync

    one_copy = None
    if parts == 1 and layout.direction in _KINDS:  # host parts by their host address, as DmaCopier does
        s, d = layout.src[0], layout.dst[0]
        one_copy = (s.ptr, s.block_stride, d.ptr, d.block_stride, s.block_bytes, _KINDS[layout.direction])

    def fast(caller: int, block_mapping, stream):
        pairs = small_pairs(block_mapping, src_limit, dst_limit, max_blocks)
        if pairs is None:
            pairs = check_mapping_for(layout, block_mapping, max_blocks)  # raises before any launch
            n = pairs.shape[0]
        else:
            n = len(pairs) >> 1
        mode = sw.mode
        if not n or sw.timing or (mode != "auto" and mode != "kernel"):
            return run(caller, block_mapping, stream, None, None, (), None, pairs)
        handle = current_stream().ptr if stream is None else stream_on_device(stream, device)
        path = "kernel"
        if mode == "auto":
            policy = sw.policy
            if smallest >= policy.dma_min_copy_bytes or n * parts <= policy.dma_max_copies:
                if n != 1 or one_copy is None or type(pairs) is not list:
                    return run(caller, block_mapping, stream, None, None, (), None, pairs)
                s_ptr, s_stride, d_ptr, d_stride, size, kind = one_copy
                memcpyAsync(d_ptr + pairs[1] * d_stride, s_ptr + pairs[0] * s_stride, size, kind, handle)
                path = "dma"
            elif (
                largest * n >= policy.dma_min_copy_bytes
                and route(layout, pairs, mode, policy, lambda: stream_is_capturing(handle))[0] != "kernel"
            ):
                return run(caller, block_mapping, stream, None, None, (), None, pairs)
        if path == "kernel" and not launch(pairs, n, handle):
            return run(caller, block_mapping, stream, None, None, (), None, pairs)  # descriptor ring
        event = take(False)
        event.path, event.nbytes = path, n * bpp
        record(event.ptr, handle)
        sw.last_path = path
        return event

    return fast


def _as_sequence(items) -> tuple:
    if items is None:
        return ()
    if isinstance(items, (list, tuple)):
        return tuple(items)
    return (items,)
