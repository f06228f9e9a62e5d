"""``BlockSwapper``: the public API.  It checks a ``(src, dst)`` pair once
(cached by the identity of the arrays), turns it into a
:class:`~cupy_swap.prepared.PreparedSwap`, and runs that op's hot path.

Where things live: ``core/`` checks and decides with NumPy only (parts,
layouts, mappings, routing, staged planning); ``cuda/`` talks to CUDA
(kernel ABI and launches, copy engines, the stager, memory, streams and
events); ``tools/`` (bench, CLI, calibration) sits above both.
"""

from __future__ import annotations

import itertools
import operator
import threading
import warnings
import weakref

import numpy as np

from .core.layout import IN, OUT, Layout, SwapPlan, check_layout
from .core.mapping import check_mapping_for
from .core.route import MODES, Policy
from .cuda import abi, memory
from .cuda.arrays import convert_array
from .cuda.availability import translate_unavailable
from .cuda.copy_engine import DmaCopier
from .cuda.launcher import Launcher
from .cuda.resolve import resolve_layout
from .cuda.settings import load_calibration
from .cuda.stager import Stager
from .cuda.streams import EventPool, on_device
from .prepared import PreparedSwap

__all__ = ["BlockSwapper", "PreparedSwap", "DEFAULT_MAX_CTAS"]

DEFAULT_MAX_CTAS = 8
DEFAULT_STAGING_BYTES = 64 << 20
_LAYOUT_CACHE_SIZE = 64


def _items(src, dst) -> tuple:
    """The caller's array objects of a ``(src, dst)`` argument pair (a
    list's items, not the mutable list)."""
    items = [*(src if isinstance(src, (list, tuple)) else (src,))]
    items += [*(dst if isinstance(dst, (list, tuple)) else (dst,))]
    return tuple(items)


def _is_torch(obj) -> bool:
    return hasattr(obj, "data_ptr") and not isinstance(obj, np.ndarray)


def _torch_state(t) -> tuple:
    """What ``set_``, ``as_strided_`` and ``.data =`` change in place."""
    return (t.data_ptr(), t.shape, t.stride())


class _CachedLayout:
    """A cache entry: the prepared op, weak references to the caller's objects,
    and what of them can change in place, compared on every hit.

    The references are weak, so a cached layout never keeps a dropped cache
    or pool alive; when one of the objects dies its callback marks the entry
    dead, so a recycled ``id`` never finds it and a hit costs no per-object
    identity check.  Re-checked on a hit (cheap attribute reads): the shape
    of NumPy and CuPy arrays (in-place reshape), the writeability of NumPy
    destinations (``a.flags.writeable = False``), and a torch tensor's
    address, shape and strides.  Not re-checked: assigning a NumPy array's
    ``strides``, ``dtype`` or ``data`` in place (deprecated or removed in
    NumPy 2).  A prepared op (:meth:`BlockSwapper.prepare`) re-checks none
    of this.
    """

    __slots__ = ("__weakref__", "refs", "dead", "generation", "op", "checks")

    def __init__(self, items: tuple, n_src: int, op):
        self.dead = False
        entry = weakref.ref(self)

        def died(_ref, entry=entry):
            alive = entry()
            if alive is not None:
                alive.dead = True

        self.refs = tuple(_weak(obj, died) for obj in items)
        self.generation = memory.generation()
        self.op = op
        # (select, read, expected): ``read`` maps over ``select(items)`` in C
        # (attrgetter): a hit costs about 0.1-0.2 us per array.
        tensors = [i for i, obj in enumerate(items) if _is_torch(obj)]
        shaped = [i for i, obj in enumerate(items) if i not in tensors and hasattr(obj, "shape")]
        dst_numpy = [i for i in range(n_src, len(items)) if isinstance(items[i], np.ndarray)]
        pickers = (
            (_picker(shaped), _SHAPE),
            (_picker(dst_numpy), _WRITEABLE),
            (_picker(tensors), _torch_state),
        )
        self.checks = [
            (pick, read, list(map(read, pick(items)))) for pick, read in pickers if pick is not None
        ]

    def valid_for(self, items: tuple) -> bool:
        return (
            not self.dead
            and self.generation == memory.generation()
            and all(list(map(read, pick(items))) == expected for pick, read, expected in self.checks)
        )


_SHAPE = operator.attrgetter("shape")
_WRITEABLE = operator.attrgetter("flags.writeable")


def _picker(indices: list):
    """A function returning the tuple of ``items[i]`` for ``i`` in
    ``indices`` (a slice when they are consecutive, as they usually are);
    None when there are none."""
    if not indices:
        return None
    if indices == list(range(indices[0], indices[-1] + 1)):
        return operator.itemgetter(slice(indices[0], indices[-1] + 1))
    return operator.itemgetter(*indices)  # two or more, not consecutive: a tuple


def _weak(obj, callback):
    """A weak reference to ``obj`` calling ``callback`` when it dies, or a
    strong one for the rare object that cannot be referenced weakly (held
    until the entry is evicted)."""
    try:
        return weakref.ref(obj, callback)
    except TypeError:
        return lambda: obj


def _identity(obj) -> tuple:
    """Cache key of a ``src``/``dst`` argument: the identity of the objects
    (an entry checks through weak references that they are still the
    objects it was made for)."""
    if isinstance(obj, (list, tuple)):
        return tuple(map(id, obj))
    return (id(obj),)


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
        Descriptor slots of kernel swaps; kernel swaps beyond this many still
        queued make ``swap`` wait for the oldest. Default 16.
    capture_slots : int, optional
        Deprecated and ignored: captured swaps no longer take slots from a
        reserve (see :meth:`swap`).
    mode : {"auto", "kernel", "dma", "staged"}, optional
        Default path (see :meth:`swap`).
    staging_bytes : int, optional
        GPU memory per direction for staged swaps (allocated on a
        direction's first one; 0 turns staging off). Default 64 MiB.
    timing : bool, optional
        Record a start event with every swap so the returned event's
        ``device_time()`` works (costs about a microsecond). Default False.
    max_inline_pairs : int, optional
        Kernel swaps of at most this many pairs (and 64 parts) travel whole
        in the kernel's parameters; larger ones go through the descriptor
        ring (see ``cuda/launcher.py``).  Default and most: 1792 (on CUDA
        older than 12.1: 192).  0 sends every kernel swap through the ring.

    Notes
    -----
    The checked layout of a ``(src, dst)`` argument pair is cached by the
    identity of the arrays, so calls that pass the same arrays again only
    check the mapping.  The cache holds the arrays weakly (dropping a cache
    or pool frees it) and re-checks on every hit what can change in place:
    shapes, a NumPy destination's writeability, a torch tensor's address,
    shape and strides.  :meth:`prepare` skips even those checks.

    Memory the swapper allocates (the descriptor ring, staging arenas) is
    given back by :meth:`close`, at the end of a ``with`` block, or when the
    swapper is garbage-collected, and in each case only after the swaps
    queued on it have completed (a background thread waits for them: no
    call blocks).  Ops from :meth:`prepare` keep the swapper alive; a
    :meth:`graph_swap` keeps its descriptor ring alive.

    One swapper may be shared by many threads: each swap takes its own
    descriptor slot, and a slot is rewritten only after the swap that last
    used it has been enqueued and its launch has finished.  ``last_path``
    then tells the path of whichever swap ended last; the returned event's
    ``path`` is per call.

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
        capture_slots: int | None = None,
        mode: str = "auto",
        timing: bool = False,
        staging_bytes: int = DEFAULT_STAGING_BYTES,
        max_inline_pairs: int | None = None,
    ):
        import cupy
        from cupy.cuda import runtime

        self.mode = _check_mode(mode)
        self.timing = bool(timing)
        self._closed = False
        self._lock = threading.Lock()
        self.max_blocks = _positive_int(max_blocks, "max_blocks")
        max_ctas = DEFAULT_MAX_CTAS if max_ctas is None else _positive_int(max_ctas, "max_ctas")
        self.max_parts = _positive_int(max_parts, "max_parts")
        if self.max_parts > abi.MAX_PARTS:
            raise ValueError(
                f"max_parts: expected at most {abi.MAX_PARTS} (the kernel's limit), got {max_parts}"
            )
        ring_size = _positive_int(ring_size, "ring_size")
        if capture_slots is not None:
            warnings.warn(
                "capture_slots: no longer used (a swap captured into a graph gets a descriptor "
                "buffer of its own, with no limit); the argument will be removed",
                DeprecationWarning,
                stacklevel=3,  # the caller, past the availability wrapper
            )
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
        self._serial = itertools.count()
        with cupy.cuda.Device(self.device):
            self._launcher = Launcher(self.device, self.max_parts, self.max_blocks, ring_size, max_ctas)
            self._events = EventPool()
        if max_inline_pairs is not None:
            self._launcher.max_inline_pairs = _positive_int(max_inline_pairs, "max_inline_pairs", minimum=0)
        self._layouts: dict[tuple, _CachedLayout] = {}
        # Bound once: the hot path calls these on every swap.
        self._get_device, self._set_device = runtime.getDevice, runtime.setDevice
        self._current_stream = cupy.cuda.get_current_stream
        self._record, self._wait_event = runtime.eventRecord, runtime.streamWaitEvent
        self._new_event = cupy.cuda.Event

    def close(self) -> None:
        """Give back the swapper's memory once the swaps queued on it have
        completed, without waiting for them.  Later calls of this swapper,
        of its prepared ops and of its graph swaps' ``set_mapping`` raise
        ``RuntimeError`` (a ``GraphSwap``'s own buffer stays until it is
        closed or dropped).  Idempotent; safe while other threads swap
        (each finishes enqueuing first, or raises)."""
        self._closed = True
        with self._lock:
            self._layouts.clear()
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
        doc="CTA budget of swaps longer than a short burst (see ``cuda/launcher.py``).",
    )
    ring_waits = property(
        lambda self: self._launcher.ring_waits, doc="Times a swap waited for a descriptor slot."
    )

    @property
    def descriptor_from_host_max_pairs(self) -> int:
        """Descriptor-ring swaps up to this many pairs are read from pinned memory."""
        return self._launcher.descriptor_from_host_max_pairs

    @descriptor_from_host_max_pairs.setter
    def descriptor_from_host_max_pairs(self, value: int) -> None:
        self._launcher.descriptor_from_host_max_pairs = value

    def _policy_field(name: str, doc: str):
        def get(self):
            return getattr(self.policy, name)

        def set_(self, value):
            import dataclasses

            self.policy = dataclasses.replace(self.policy, **{name: _positive_int(value, name, minimum=0)})

        return property(get, set_, doc=doc)

    dma_min_copy_bytes = _policy_field(
        "dma_min_copy_bytes", "auto: copies this large go to the copy engines."
    )
    dma_max_copies = _policy_field(
        "dma_max_copies", "auto: swaps of at most this many copies go to the copy engines."
    )
    staged_min_bytes = _policy_field("staged_min_bytes", "auto: host-run swaps this large are staged.")
    del _policy_field

    # ------------------------------------------------------------------ API
    def swap(self, src, dst, block_mapping, *, stream=None, mode=None, wait_for=(), timing=None):
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
        block_mapping : array-like of shape (N, 2)
            Integer rows ``(src_block, dst_block)``; ``N <= max_blocks``.
        stream : cupy.cuda.Stream, torch.cuda.Stream or int, optional
            Stream to launch on; CuPy's current stream by default.
        mode : {"auto", "kernel", "dma", "staged"}, optional
            ``"kernel"``: one kernel launch; ``"dma"``: copy engines, one copy
            per run of consecutive blocks; ``"staged"`` (host <-> GPU): copy
            engines move runs of consecutive host blocks between the host
            and a GPU staging arena, and a kernel scatters (swap-in) or
            gathers (swap-out) the GPU blocks; ``"auto"`` (the swapper's
            default) picks per call.  ``last_path`` tells which one served.
        wait_for : event, stream, or sequence of them, optional
            CuPy or torch events and streams (or raw stream handles) whose
            work must finish before the copy starts, e.g. the compute stream
            that wrote the blocks being swapped out.  Enqueued as stream
            waits: the host does not block.
        timing : bool, optional
            Record a start event too, so ``device_time()`` works; defaults to
            the swapper's ``timing``.

        Returns
        -------
        SwapEvent
            A ``cupy.cuda.Event`` recorded on ``stream`` after the copy, with
            ``device_time()``, ``path`` and ``nbytes``.

        Notes
        -----
        ``swap`` never synchronizes with the device, except when more than
        ``ring_size`` kernel swaps are still queued (it then waits for the
        oldest).  It may be called while ``stream`` captures a CUDA graph: the
        captured swap keeps the mapping given at capture (in the kernel's
        parameters, or for more than 1792 pairs or 64 parts in a descriptor
        buffer of its own, kept for the life of the process).  For a
        captured swap whose mapping changes on every replay, see
        :meth:`graph_swap`.

        Raises
        ------
        TypeError, ValueError, IndexError
            For any bad input, before anything is launched.
        """
        return self._swap(src, dst, block_mapping, stream, None, mode, wait_for, timing)

    def swap_in(self, host_src, gpu_dst, block_mapping, *, stream=None, mode=None, wait_for=(), timing=None):
        """:meth:`swap` that only accepts host -> GPU."""
        return self._swap(host_src, gpu_dst, block_mapping, stream, IN, mode, wait_for, timing)

    def swap_out(self, gpu_src, host_dst, block_mapping, *, stream=None, mode=None, wait_for=(), timing=None):
        """:meth:`swap` that only accepts GPU -> host."""
        return self._swap(gpu_src, host_dst, block_mapping, stream, OUT, mode, wait_for, timing)

    def prepare(self, src, dst) -> PreparedSwap:
        """Check ``src`` and ``dst`` once and return a :class:`PreparedSwap`
        that swaps between them for any mapping: ``op(block_mapping,
        stream=..., wait_for=...)``.

        Everything that does not depend on the mapping (parts, device
        aliases, overlap analysis, the part table) is done here, so a call
        of the op costs only the mapping checks and the launch.  The op
        holds ``src`` and ``dst`` and uses the geometry checked here: do
        not reshape, restride or re-point them in place afterwards
        (``swap()`` re-checks that on every call; a prepared op does not).
        """
        with on_device(self.device):
            layout = self._layout(src, dst)
        return PreparedSwap(self, layout, (src, dst))

    def graph_swap(self, src, dst):
        """A swap of fixed parts whose mapping changes between CUDA-graph
        replays: see :class:`cupy_swap.graph.GraphSwap`."""
        from .graph import GraphSwap

        with on_device(self.device):
            layout = self._layout(src, dst)
        return GraphSwap(self._launcher, layout, (src, dst), self.max_blocks)

    def plan(self, src, dst, block_mapping) -> SwapPlan:
        """Check a swap and return its :class:`~cupy_swap.core.layout.SwapPlan`
        without launching anything."""
        with on_device(self.device):
            layout = self._layout(src, dst)
        return SwapPlan(layout, check_mapping_for(layout, block_mapping, self.max_blocks))

    # ------------------------------------------------------------ internals
    def _swap(self, src, dst, block_mapping, stream, want, mode, wait_for, timing):
        """``swap()``: the cached op of ``(src, dst)``, then its hot path."""
        caller = self._get_device()
        if caller != self.device:
            return self._on_own_device(
                self._swap_here, caller, src, dst, block_mapping, stream, want, mode, wait_for, timing
            )
        return self._swap_here(caller, src, dst, block_mapping, stream, want, mode, wait_for, timing)

    def _swap_here(self, caller, src, dst, block_mapping, stream, want, mode, wait_for, timing):
        return self._op(src, dst)._call(caller, block_mapping, stream, want, mode, wait_for, timing)

    def _on_own_device(self, fn, caller: int, *args):
        """``fn(caller, *args)`` with this swapper's GPU current: DLPack
        conversion, pointer queries, events, the default stream and the
        launches act on it.  The caller's device is restored."""
        self._set_device(self.device)
        try:
            return fn(caller, *args)
        finally:
            self._set_device(caller)

    def _op(self, src, dst) -> PreparedSwap:
        """The cached op of ``(src, dst)``: a hit is used only while those
        objects are alive, unchanged in place (see :class:`_CachedLayout`)
        and no registered range went away."""
        key = (_identity(src), _identity(dst))
        items = _items(src, dst)
        entry = self._layouts.get(key)
        if entry is not None and entry.valid_for(items):
            return entry.op
        # The cache holds the op and the op only a proxy of the swapper: no
        # swapper -> cache -> op -> swapper cycle, so dropping the swapper
        # frees it (and hands its memory to the releaser) at once.
        op = PreparedSwap(weakref.proxy(self), self._layout(src, dst), None)
        with self._lock:
            self._layouts.pop(key, None)
            if len(self._layouts) >= _LAYOUT_CACHE_SIZE:
                self._layouts.pop(next(iter(self._layouts)))
            self._layouts[key] = _CachedLayout(items, len(op._layout.src), op)
        return op

    def _layout(self, src, dst) -> Layout:
        """Check and resolve ``(src, dst)`` (this swapper's GPU current)."""
        if self._closed:
            raise RuntimeError("swap: this BlockSwapper is closed; make a new one")
        layout = check_layout(src, dst, convert_array)
        if len(layout.src) > self.max_parts:
            raise ValueError(f"src: expected at most max_parts={self.max_parts} parts, got {len(layout.src)}")
        resolve_layout(layout, self.device)
        if not layout.kernel_ok:
            _warn_unmapped(layout.unmapped_reason)
        layout.serial = next(self._serial)
        return layout

    def choose_path(self, layout: Layout, mapping, mode: str, capturing: bool = False) -> str:
        """``"kernel"``, ``"dma"`` or ``"staged"`` for a checked ``(N, 2)``
        mapping under ``mode`` (see :func:`cupy_swap.core.route.route`)."""
        from .core.route import route

        if isinstance(mapping, list):  # a short list of (s, d) pairs
            mapping = np.asarray(mapping, dtype=np.int64).reshape(-1, 2)
        return route(layout, mapping, _check_mode(mode), self.policy, lambda: capturing)[0]


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


def _check_mode(mode) -> str:
    if mode not in MODES:
        raise ValueError(f"mode: expected one of {', '.join(map(repr, MODES))}, got {mode!r}")
    return mode


def _positive_int(value, name: str, minimum: int = 1) -> int:
    what = "a positive int" if minimum == 1 else f"an int >= {minimum}"
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name}: expected {what}, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name}: expected {what}, got {value}")
    return int(value)
