"""``BlockSwapper``: the public API.  It checks a ``(src, dst)`` pair once
(cached by the memory the arrays describe), turns it into a
:class:`~cupy_swap.prepared.PreparedSwap`, and runs that op's hot path.
``core/`` checks and decides with NumPy only; ``cuda/`` talks to CUDA.
"""

from __future__ import annotations

import warnings
import weakref
from typing import TYPE_CHECKING

import numpy as np

from .api_types import Mapping, Parts, Stream, WaitFor
from .core.layout import IN, OUT, Layout, SwapPlan, check_layout
from .core.mapping import check_mapping_for
from .core.route import Policy, check_mode
from .cuda import abi, capture, memory
from .cuda.arrays import convert_array
from .cuda.availability import translate_unavailable
from .cuda.copy_engine import DmaCopier
from .cuda.launcher import Launcher
from .cuda.resolve import resolve_layout
from .cuda.settings import load_calibration
from .cuda.streams import EventPool, event_pool_size, on_device
from .op_cache import OpCache, arrays_of
from .prepared import PreparedSwap
from .staged.stager import Stager

if TYPE_CHECKING:
    from .cuda.streams import SwapEvent
    from .graphs.graph_swap import GraphSwap

DEFAULT_MAX_CTAS = 8
DEFAULT_STAGING_BYTES = 64 << 20
_OP_CACHE_SIZE = 256  # a per-layer loop: 64 layers x K/V x 2 directions


class BlockSwapper:
    """Swap paged KV-cache blocks between GPU arrays and pinned host arrays.

    Parameters
    ----------
    max_blocks : int
        Most ``(src, dst)`` pairs one swap may carry; sizes the fixed buffers.
    device : int, optional
        GPU ordinal; defaults to CuPy's current device.
    max_ctas : int, optional
        CTA budget: the most thread blocks (so the most SMs) one swap uses.
        Default 8: on an H200 8 CTAs of 1024 threads carry the link as well as
        132 do, and fewer SMs taken means less slowdown of compute running
        beside the swap (see the README).
    max_parts : int, optional
        Most parts (arrays per side) one swap may carry. Default 256, the
        kernel's limit.
    ring_size : int, optional
        Pinned slots where kernel swaps' rows (or where their GPU rows are)
        wait for their launch, one per queued kernel swap (a staged swap
        takes one per chunk).  A swap takes any
        free slot; only when all are still queued does ``swap`` wait on the
        host, for the first to free. Default 16.
    mode : {"auto", "kernel", "dma", "staged"}, optional
        Default path (see :meth:`swap`).
    staging_bytes : int, optional
        GPU memory per direction for staged swaps (allocated on a
        direction's first one; 0 turns staging off). Default 64 MiB.
    timing : bool, optional
        Record a start event with every swap so the returned event's
        ``device_time()`` works (costs about a microsecond). Default False.

    Notes
    -----
    ``swap()`` caches the prepared op of a ``(src, dst)`` pair by the memory
    the arrays describe (see :mod:`cupy_swap.op_cache`), so calls with the
    same arrays, or fresh views of the same memory, only check the mapping;
    the cache holds the memory owners weakly.  :meth:`prepare` skips even
    the key.

    The swapper's memory (row ring, staging arenas) is given back by
    :meth:`close`, at the end of a ``with`` block, or when it is
    garbage-collected, each time only after the swaps queued on it have
    completed, without blocking the caller.  Ops from :meth:`prepare` keep
    the swapper alive.

    One swapper may be shared by many threads; ``last_path`` then tells the
    path of whichever swap ended last (the returned event's ``path`` is per
    call).

    Examples
    --------
    >>> host = cupy_swap.empty_pinned((1000, 16, 8, 128), "float16")
    >>> gpu = cupy.empty((500, 16, 8, 128), "float16")
    >>> sw = cupy_swap.BlockSwapper(max_blocks=1024)
    >>> ev = sw.swap_in(host, gpu, [(3, 0), (7, 1)])   # host block 3 -> GPU block 0, ...
    >>> ev.synchronize()
    """

    @translate_unavailable("BlockSwapper()")
    def __init__(
        self,
        max_blocks: int = 4096,
        *,
        device: int | None = None,
        max_ctas: int | None = None,
        max_parts: int = abi.MAX_PARTS,
        ring_size: int = 16,
        mode: str = "auto",
        timing: bool = False,
        staging_bytes: int = DEFAULT_STAGING_BYTES,
    ):
        import cupy
        from cupy.cuda import runtime

        self.mode = check_mode(mode)
        self.timing = bool(timing)
        self._closed = False
        self.max_blocks = _positive_int(max_blocks, "max_blocks")
        max_ctas = DEFAULT_MAX_CTAS if max_ctas is None else _positive_int(max_ctas, "max_ctas")
        self.max_parts = _positive_int(max_parts, "max_parts")
        if self.max_parts > abi.MAX_PARTS:
            raise ValueError(
                f"max_parts: expected at most {abi.MAX_PARTS} (the kernel's limit), got {max_parts}"
            )
        ring_size = _positive_int(ring_size, "ring_size")
        staging_bytes = _positive_int(staging_bytes, "staging_bytes", minimum=0)
        self.device = runtime.getDevice() if device is None else int(device)
        calibrated = load_calibration(self.device) or {}
        self.calibrated = bool(calibrated)  # the thresholds come from `calibrate`
        self.policy = Policy(staging_bytes=staging_bytes, **calibrated)
        # One arena and copy stream per direction: a swap-in and a swap-out
        # in flight together never wait for each other's rows or queue.
        self._stagers = {d: Stager(self.device, staging_bytes) for d in (IN, OUT)} if staging_bytes else None
        self.last_path = None  # "kernel", "dma" or "staged": what served the last swap
        self._dma = DmaCopier()
        # Pinned and device allocations: legal while another thread captures.
        with cupy.cuda.Device(self.device), capture.relaxed():
            self._launcher = Launcher(self.device, self.max_blocks, ring_size, max_ctas)
            self._events = EventPool(event_pool_size(ring_size))
        self._ops = OpCache(_OP_CACHE_SIZE)
        # Bound once: the hot path calls these on every swap.
        self._get_device, self._set_device = runtime.getDevice, runtime.setDevice
        self._current_stream = cupy.cuda.get_current_stream
        self._record, self._wait_event = runtime.eventRecord, runtime.streamWaitEvent

    def close(self) -> None:
        """Give back the swapper's memory once the swaps queued on it have
        completed, without waiting for them.  Later calls of this swapper,
        its prepared ops and its graph swaps' ``set_mapping`` raise
        ``RuntimeError``.  Idempotent; safe while other threads swap."""
        self._closed = True
        self._ops.clear()
        self._launcher.close()
        for stager in (self._stagers or {}).values():
            stager.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # Settings kept on the parts that use them.
    max_ctas = property(
        lambda self: self._launcher.max_ctas,
        lambda self, v: setattr(self._launcher, "max_ctas", _positive_int(v, "max_ctas")),
        doc="CTA budget: the most thread blocks one kernel swap uses (see ``cuda/launcher.py``).",
    )
    ring_waits = property(
        lambda self: self._launcher.slots.waits,
        doc="Times a swap waited for a slot (every one was still read by a queued launch).",
    )

    def _policy_field(name: str, doc: str):
        def get(self):
            return getattr(self.policy, name)

        def set_(self, value):
            import dataclasses

            self.policy = dataclasses.replace(self.policy, **{name: _positive_int(value, name, minimum=0)})
            self._ops.clear()  # swap()'s ops decide again; prepared ops keep their route

        return property(get, set_, doc=doc)

    dma_min_copy_bytes = _policy_field(
        "dma_min_copy_bytes", "auto: layouts whose every block is this large go to the copy engines."
    )
    dma_max_copies = _policy_field(
        "dma_max_copies", "auto: swaps of at most this many copies (rows x parts) go to the copy engines."
    )
    del _policy_field

    # ------------------------------------------------------------------ API
    def swap(
        self,
        src: Parts,
        dst: Parts,
        block_mapping: Mapping,
        *,
        stream: Stream = None,
        mode: str | None = None,
        wait_for: WaitFor = (),
        timing: bool | None = None,
        check: str | None = None,
    ) -> SwapEvent:
        """Copy block ``s`` of each ``src`` part to block ``d`` of the matching
        ``dst`` part for every row ``(s, d)`` of ``block_mapping``, on
        ``stream``: one kernel launch, or copy-engine copies (see ``mode``).

        Parameters
        ----------
        src, dst : array or sequence of arrays
            Parts of shape ``(num_blocks, *block_shape)``; ``cupy.ndarray`` on
            this swapper's device, or NumPy arrays in pinned host memory (torch
            tensors are viewed without copies).  Part ``i`` of ``src`` goes to
            part ``i`` of ``dst``; block shape and dtype match per part.
        block_mapping : list or (N, 2) array of rows, or a tuple (src_indices, dst_indices)
            Told apart by type alone: a list (of pairs), or an ``(N, 2)``
            NumPy array, CPU or CUDA torch tensor or CuPy array, is integer
            rows ``(src_block, dst_block)``; a tuple is always the pair form
            ``(src_indices, dst_indices)``, two 1-D sequences of one length
            (as SGLang keeps them: ``((5, 9), (0, 1))`` copies 5 -> 0 and
            9 -> 1), and a tuple of any other length raises ``ValueError``.
            ``N <= max_blocks``; indices on the GPU must be int64.
        stream : cupy.cuda.Stream, torch.cuda.Stream or int, optional
            Stream to launch on.  Default: torch's current stream when the
            parts are torch tensors, else CuPy's current stream.
        mode : {"auto", "kernel", "dma", "staged"}, optional
            ``"kernel"``: one kernel launch; ``"dma"``: copy engines, one copy
            per run of consecutive blocks; ``"staged"`` (host <-> GPU): copy
            engines move runs of consecutive host blocks between the host
            and a GPU staging arena, and a kernel scatters (swap-in) or
            gathers (swap-out) the GPU blocks; ``"auto"`` (the swapper's
            default) takes the copy engines for layouts of blocks of at
            least ``dma_min_copy_bytes`` and for one copy, else the kernel
            (decided when the op is made), except for host rows that are one
            run of consecutive blocks, long enough that a part's run reaches
            ``dma_min_copy_bytes`` (told from the two ends of the rows):
            ``"dma"`` when the GPU rows are one run too, else ``"staged"``.
            ``last_path`` tells which one served.
        wait_for : event, stream, or sequence of them, optional
            CuPy or torch events and streams (or raw stream handles) whose
            work must finish before the copy starts, e.g. the compute stream
            that wrote the blocks being swapped out.  Enqueued as stream
            waits: the host does not block.
        timing : bool, optional
            Record a start event too, so ``device_time()`` works; defaults to
            the swapper's ``timing``.
        check : {None, "launch", "host"}, optional
            Where the mapping's indices are checked (in range, no
            destination block twice).  ``"launch"`` (the default for kernel
            swaps): by the copy kernel itself, before any CTA writes, so a
            bad mapping writes nothing; its error is raised by the returned
            event's ``synchronize()``, else once by the next call of the
            same op (for ``swap()``: of the same arrays) from the same
            thread, which then launches nothing; never by a plain
            ``stream.synchronize()``.  The error's ``swap_seq`` is the failed
            swap's number (its event's ``seq``).  ``"host"`` (for
            debugging): before anything is launched, raised by this call.
            Copy-engine and staged swaps, captured swaps, parts that may
            share bytes and more rows than a launch can check (8192 on an
            H200) are always checked on the host.

        Returns
        -------
        SwapEvent
            A ``cupy.cuda.Event`` recorded on ``stream`` after the copy, with
            ``device_time()``, ``path`` and ``nbytes``.

        Notes
        -----
        ``swap`` never synchronizes with the device, except when more than
        ``ring_size`` kernel swaps are still queued (it then waits for the
        first to finish).  It may be called while ``stream`` captures a CUDA graph: the
        captured swap keeps the mapping given at capture, checked on the
        host, in pinned memory of its own kept for the life of the
        process.  For a
        captured swap whose mapping changes on every replay, see
        :meth:`graph_swap`.

        Raises
        ------
        TypeError, ValueError, IndexError
            For bad arguments, before anything is launched; for bad mapping
            indices, see ``check``.
        """
        return self._swap(src, dst, block_mapping, stream, None, mode, wait_for, timing, check)

    def swap_in(
        self,
        host_src: Parts,
        gpu_dst: Parts,
        block_mapping: Mapping,
        *,
        stream: Stream = None,
        mode: str | None = None,
        wait_for: WaitFor = (),
        timing: bool | None = None,
        check: str | None = None,
    ) -> SwapEvent:
        """:meth:`swap` that only accepts host -> GPU."""
        return self._swap(host_src, gpu_dst, block_mapping, stream, IN, mode, wait_for, timing, check)

    def swap_out(
        self,
        gpu_src: Parts,
        host_dst: Parts,
        block_mapping: Mapping,
        *,
        stream: Stream = None,
        mode: str | None = None,
        wait_for: WaitFor = (),
        timing: bool | None = None,
        check: str | None = None,
    ) -> SwapEvent:
        """:meth:`swap` that only accepts GPU -> host."""
        return self._swap(gpu_src, host_dst, block_mapping, stream, OUT, mode, wait_for, timing, check)

    def prepare(
        self, src: Parts, dst: Parts, *, mode: str | None = None, check: str | None = None
    ) -> PreparedSwap:
        """Check ``src`` and ``dst`` once and return a :class:`PreparedSwap`
        that swaps between them for any mapping: ``op(block_mapping,
        stream=..., wait_for=...)`` costs only the mapping checks and the
        launch.  Do not reshape, restride or re-point the arrays in place
        afterwards (``swap()`` notices; a prepared op does not).

        Parameters
        ----------
        mode : {"auto", "kernel", "dma", "staged"}, optional
            The op's route, decided here (default: the swapper's ``mode``);
            a call's own ``mode=`` still overrides it for that call.  Like a
            call's own, ``"dma"`` or ``"staged"`` refuses rows on the GPU
            (the swapper's ``mode`` does not: the kernel reads them).
        check : {"launch", "host"}, optional
            Who checks the rows of every call (default: the copy launch,
            where it can); a call's own ``check=`` still overrides it.  An
            op prepared with either of those refusals also refuses
            :meth:`PreparedSwap.captured` (a captured swap is the kernel,
            checking on the GPU).
        """
        if mode is not None:
            check_mode(mode)
        if check not in (None, "launch", "host"):
            raise ValueError(f"check: expected None, 'launch' or 'host', got {check!r}")
        with on_device(self.device), capture.relaxed():
            layout = self._layout(src, dst)
            return PreparedSwap(self, layout, (src, dst), _any_torch(src, dst), mode=mode, check=check)

    def graph_swap(self, src: Parts, dst: Parts) -> GraphSwap:
        """A swap of fixed parts whose mapping changes between CUDA-graph
        replays: see :class:`cupy_swap.GraphSwap`."""
        from .graphs.graph_swap import GraphSwap

        with on_device(self.device), capture.relaxed():  # its buffers are allocated and zeroed
            return GraphSwap(self.prepare(src, dst), self.max_blocks)

    def plan(self, src: Parts, dst: Parts, block_mapping: Mapping) -> SwapPlan:
        """Check a swap and return its :class:`~cupy_swap.core.layout.SwapPlan`
        without launching anything."""
        with on_device(self.device), capture.relaxed():
            layout = self._layout(src, dst)
        return SwapPlan(layout, check_mapping_for(layout, block_mapping, self.max_blocks))

    # ------------------------------------------------------------ internals
    def _swap(self, src, dst, block_mapping, stream, want, mode, wait_for, timing, check):
        """``swap()``: the cached op of ``(src, dst)``, then its call (``want``:
        the direction ``swap_in``/``swap_out`` ask for)."""
        caller = self._get_device()
        if caller != self.device:
            return self._on_own_device(
                self._swap_here, caller, src, dst, block_mapping, stream, want, mode, wait_for, timing, check
            )
        op = self._op(src, dst)
        if want is not None and want != op.direction:  # refused there, after a pending failure is told
            return op._general(caller, block_mapping, stream, want, mode, wait_for, timing, check)
        return op(block_mapping, stream=stream, mode=mode, wait_for=wait_for, timing=timing, check=check)

    def _swap_here(self, caller, src, dst, block_mapping, stream, want, mode, wait_for, timing, check):
        return self._op(src, dst)._general(caller, block_mapping, stream, want, mode, wait_for, timing, check)

    def _on_own_device(self, fn, caller: int, *args):
        """``fn(caller, *args)`` with this swapper's GPU current (conversions,
        pointer queries, events and launches act on it), then the caller's."""
        self._set_device(self.device)
        try:
            return fn(caller, *args)
        finally:
            self._set_device(caller)

    def _op(self, src, dst) -> PreparedSwap:
        """The cached op of ``(src, dst)`` (see :mod:`cupy_swap.op_cache`)."""
        key = self._ops.key(src, dst)
        op = self._ops.get(key)
        if op is None:
            # A proxy: no swapper -> cache -> op -> swapper cycle, so dropping
            # the swapper frees it at once.  Relaxed capture mode: a first swap
            # inside a capture may load kernels and create events.
            with capture.relaxed():
                op = PreparedSwap(
                    weakref.proxy(self),
                    self._layout(src, dst),
                    None,
                    _any_torch(src, dst),
                    self._ops.channel(key, src, dst),
                )
            self._ops.put(key, op, src, dst)
        return op

    def _layout(self, src, dst) -> Layout:
        """Check and resolve ``(src, dst)`` (this swapper's GPU current)."""
        if self._closed:
            raise RuntimeError("swap: this BlockSwapper is closed; make a new one")
        layout = check_layout(src, dst, convert_array)
        if len(layout.src) > self.max_parts:
            raise ValueError(f"src: expected at most max_parts={self.max_parts} parts, got {len(layout.src)}")
        resolve_layout(layout, self.device)
        # No kernel can read this swap's rows (the row ring cannot be mapped) or take
        # its parts (this CUDA's kernel parameters): the copy engines move it.
        if layout.kernel_ok and not self._launcher.slots_ok:
            layout.kernel_ok = False
            why = memory.host_mapping_status(self.device)[1]
            layout.unmapped_reason = why or "the swapper's row ring could not be mapped"
        elif layout.kernel_ok and not self._launcher.kernel_takes(len(layout.src)):
            layout.kernel_ok = False
            layout.unmapped_reason = f"{len(layout.src)} parts need CUDA 12.1 or later's kernel parameters"
        if not layout.kernel_ok:
            _warn_unmapped(layout.unmapped_reason)
        return layout


def _any_torch(src, dst) -> bool:
    """True when a part is a torch tensor (its swaps default to torch's stream)."""
    return any(type(x).__module__.startswith("torch") for x in arrays_of(src, dst))


_warned: list = []


def _warn_unmapped(reason: str) -> None:
    if not _warned:
        _warned.append(reason)
        warnings.warn(
            f"cupy_swap: pinned host memory cannot be mapped into the GPU's address space ({reason}); "
            f"swaps that touch host memory use the copy engines instead of the kernel: one "
            f"cudaMemcpyAsync per run of consecutive blocks, which is slower for many small "
            f"scattered blocks (about 1 us of copy-engine time per copy)",
            RuntimeWarning,
            stacklevel=4,
        )


def _positive_int(value, name: str, minimum: int = 1) -> int:
    what = "a positive int" if minimum == 1 else f"an int >= {minimum}"
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name}: expected {what}, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name}: expected {what}, got {value}")
    return int(value)
