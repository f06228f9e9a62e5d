"""``BlockSwapper``: one kernel launch moves every block of every part.

Each swap writes a descriptor (header, part table, mapping; see
``descriptor.py``) into a slot of a ring of pinned staging buffers.  Small
mappings are read by the kernel straight from there through the buffer's
device alias; large ones are first copied to the slot's fixed device buffer
(each pair is read by many threads, and device memory serves that better
than PCIe) by a small upload kernel rather than a ``cudaMemcpyAsync``: copy
engines work through their queue in order, so a descriptor copy could wait
behind a long transfer of another stream.  Buffers are allocated once, so their
addresses never move.  The host only rewrites a slot after the event
recorded behind the slot's last launch has completed; with ``ring_size``
slots that is only a wait when more than ``ring_size`` swaps are queued.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import operator
import threading
import warnings
import weakref

import numpy as np

from . import kernels, memory
from .descriptor import MAX_PARTS, descriptor_words, write_descriptor
from .dma import DmaCopier, copy_count
from .driver import stream_is_capturing
from .events import swap_event_class, wait_handle
from .interop import on_device, stream_on_device
from .mapping import may_have_runs
from .plan import (
    DIRECTION_TEXT,
    IN,
    OUT,
    Layout,
    SwapPlan,
    check_layout,
    check_mapping_for,
    fast_pairs,
    layout_from_parts,
    resolve_layout,
)
from .staging import (
    StagedPlan,
    Stager,
    chunk_copies,
    chunk_sizes,
    group_regions,
    groups_problem,
    kernel_pairs,
    plan_chunks,
    staging_parts,
)

__all__ = ["BlockSwapper", "PreparedSwap", "DEFAULT_MAX_CTAS", "DEFAULT_UNROLL"]

DEFAULT_MAX_CTAS = 8
DEFAULT_UNROLL = 4
MODES = ("auto", "kernel", "dma", "staged")
# auto: copies this large or larger go to the copy engines (see NOTES.md).
DMA_MIN_COPY_BYTES = 1 << 20
# auto: a swap of at most this many copies goes to the copy engines.
DMA_MAX_COPIES = 1
# auto: swaps of at least this many bytes whose host blocks lie in long runs
# are staged (copy engines between host runs and a GPU staging ring, a kernel
# between the ring and the GPU blocks).  Smaller ones lose more to the extra
# host work than they gain (benchmarks/NOTES.md).
STAGED_MIN_BYTES = 16 << 20
# ... when their copies average at least this many bytes.
STAGED_MIN_AVG_COPY_BYTES = 512 << 10
DEFAULT_STAGING_BYTES = 64 << 20
# Mappings up to this many rows are read from pinned memory by the kernel
# (saves a cudaMemcpyAsync call, ~3 us of host time); see benchmarks/NOTES.md.
DESCRIPTOR_FROM_HOST_MAX_PAIRS = 64
_LAYOUT_CACHE_SIZE = 64
_HOST_COLUMN = {IN: 0, OUT: 1}  # mapping column of host blocks
# Descriptor uploads use at most this many CTAs (a 64 KiB descriptor is one
# round of 16-byte loads per thread).
FETCH_MAX_CTAS = 16
_H2D, _D2H = 1, 2  # cudaMemcpyKind


class _Slot:
    """One ring entry: pinned staging words, their device copy, the packed
    kernel arguments for both, and the event behind the last launch.

    ``lock`` is held by the swap that owns the slot, from the moment it is
    taken until that swap's event is recorded and stored in ``event``: a
    thread that comes round the ring meanwhile waits for the lock, then for
    the event, and never rewrites a descriptor that a queued launch reads."""

    def __init__(self, host_words: np.ndarray, device_ptr: int):
        self.lock = threading.Lock()
        self.host_words = host_words.view(np.int64)
        self.table_serial = -1  # which layout's part table the slot holds
        self.host_ptr = host_words.ctypes.data
        self.device_ptr = device_ptr
        self.device_args = _KernelArgs(device_ptr)
        # Arguments that make the kernel read the descriptor straight from
        # pinned memory, through the staging buffer's device alias.
        self.host_alias = memory.host_alias(self.host_ptr, host_words.nbytes)
        self.alias_args = _KernelArgs(self.host_alias)
        self.fetch_args = _FetchArgs(self.host_alias)
        self.event = None


class _FetchArgs:
    """Arguments ``(src, dst, n16)`` of the descriptor upload kernel, as the
    ``void**`` array ``cuLaunchKernel`` takes."""

    def __init__(self, src_ptr: int):
        self.src = ctypes.c_uint64(src_ptr)
        self.dst = ctypes.c_uint64(0)
        self.n16 = ctypes.c_uint64(0)
        fields = (self.src, self.dst, self.n16)
        self._array = (ctypes.c_void_p * 3)(*(ctypes.addressof(f) for f in fields))

    def set(self, dst_ptr: int, n16: int) -> int:
        self.dst.value = dst_ptr
        self.n16.value = n16
        return ctypes.addressof(self._array)


class _KernelArgs:
    """The kernel's arguments ``(desc, n_parts, units_per_pair, n_pairs,
    first_pair)`` as the ``void**`` array ``cuLaunchKernel`` takes; ``ptr``
    is its address.  The driver copies the values at launch, so one object
    serves consecutive launches."""

    def __init__(self, desc_ptr: int):
        self.desc = ctypes.c_uint64(desc_ptr)
        self.n_parts = ctypes.c_int32(0)
        self.units_per_pair = ctypes.c_uint64(0)
        self.n_pairs = ctypes.c_int64(0)
        self.first_pair = ctypes.c_int64(0)
        fields = (self.desc, self.n_parts, self.units_per_pair, self.n_pairs, self.first_pair)
        self._array = (ctypes.c_void_p * 5)(*(ctypes.addressof(f) for f in fields))
        self.ptr = ctypes.addressof(self._array)

    def set(self, n_parts: int, units_per_pair: int, n_pairs: int, first_pair: int = 0) -> int:
        """Store this launch's values; returns the ``void**`` address."""
        self.n_parts.value = n_parts
        self.units_per_pair.value = units_per_pair
        self.n_pairs.value = n_pairs
        self.first_pair.value = first_pair
        return self.ptr


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
    """A cache entry: the layout, weak references to the caller's objects,
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

    __slots__ = ("__weakref__", "refs", "dead", "generation", "layout", "checks")

    def __init__(self, items: tuple, n_src: int, layout):
        self.dead = False
        entry = weakref.ref(self)

        def died(_ref, entry=entry):
            alive = entry()
            if alive is not None:
                alive.dead = True

        self.refs = tuple(_weak(obj, died) for obj in items)
        self.generation = memory.generation()
        self.layout = layout
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
        Descriptor slots reserved for plain ``swap()`` calls captured into CUDA
        graphs (each captured swap keeps one for good). Default 4.
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
    The checked layout of a ``(src, dst)`` argument pair is cached by the
    identity of the arrays, so calls that pass the same arrays again only
    check the mapping.  The cache holds the arrays weakly (dropping a cache
    or pool frees it) and re-checks on every hit what can change in place:
    shapes, a NumPy destination's writeability, a torch tensor's address,
    shape and strides.  :meth:`prepare` skips even those checks.

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

    def __init__(
        self,
        max_blocks: int = 4096,
        *,
        device: int | None = None,
        max_ctas: int | None = None,
        max_parts: int = MAX_PARTS,
        ring_size: int = 16,
        capture_slots: int = 4,
        mode: str = "auto",
        timing: bool = False,
        staging_bytes: int = DEFAULT_STAGING_BYTES,
    ):
        import cupy
        from cupy.cuda import driver, runtime

        self._cupy_event, self._runtime, self._driver = cupy.cuda.Event, runtime, driver
        self.mode = _check_mode(mode)
        self.timing = bool(timing)
        self._lock = threading.Lock()
        self.max_blocks = _positive_int(max_blocks, "max_blocks")
        self.max_ctas = DEFAULT_MAX_CTAS if max_ctas is None else _positive_int(max_ctas, "max_ctas")
        self.max_parts = _positive_int(max_parts, "max_parts")
        if self.max_parts > MAX_PARTS:
            raise ValueError(f"max_parts: expected at most {MAX_PARTS} (the kernel's limit), got {max_parts}")
        ring_size = _positive_int(ring_size, "ring_size")
        capture_slots = _positive_int(capture_slots, "capture_slots", minimum=0)
        if device is None:
            device = cupy.cuda.runtime.getDevice()
        self.device = int(device)
        memory.note_swap_device(self.device)  # unregister_host waits for its swaps
        self.ring_waits = 0  # times swap() had to wait for a slot (ring full)
        # Tuning knobs (benchmarks/tune.py); defaults are the measured best.
        self._unroll = DEFAULT_UNROLL
        self.max_threads = kernels.max_threads(self._unroll)
        mapped, _ = memory.host_mapping_status(self.device)
        # Without host mapping the kernel must find its descriptor in device memory.
        self.descriptor_from_host_max_pairs = DESCRIPTOR_FROM_HOST_MAX_PAIRS if mapped else 0
        self.kernel_defines: tuple[str, ...] = ()
        from .calibration import load_calibration

        calibrated = load_calibration(self.device) or {}
        self.calibrated = bool(calibrated)  # thresholds below come from `calibrate`
        self.dma_min_copy_bytes = calibrated.get("dma_min_copy_bytes", DMA_MIN_COPY_BYTES)
        self.dma_max_copies = calibrated.get("dma_max_copies", DMA_MAX_COPIES)
        self.staged_min_bytes = calibrated.get("staged_min_bytes", STAGED_MIN_BYTES)
        staging_bytes = _positive_int(staging_bytes, "staging_bytes", minimum=0)
        # One arena and copy stream per direction: a swap-in and a swap-out
        # in flight together never wait for each other's rows or queue.
        self._stagers = {d: Stager(self.device, staging_bytes) for d in (IN, OUT)} if staging_bytes else None
        self.last_path = None  # "kernel", "dma" or "staged": what served the last swap
        self._dma = DmaCopier()
        self._serial = itertools.count()

        self.slot_words = descriptor_words(self.max_parts, self.max_blocks)
        with cupy.cuda.Device(self.device):
            rows = ring_size + capture_slots
            self._host = memory.zeros_pinned((rows, self.slot_words), np.int64)
            self._dev = cupy.zeros((rows, self.slot_words), dtype=np.int64)
        row_bytes = self.slot_words * 8
        slots = [
            _Slot(self._host[i], self._dev.data.ptr + i * row_bytes) for i in range(ring_size + capture_slots)
        ]
        self._slots = slots[:ring_size]
        # Never used by eager swaps, so a swap captured into a graph can take
        # one without asking whether a queued launch still reads it.
        self._capture_pool = slots[ring_size:]
        self._next = 0
        self._layouts: dict[tuple, tuple] = {}
        self._event_class = swap_event_class()

    @property
    def unroll(self) -> int:
        """16-byte loads each kernel thread keeps in flight (2, 4 or 8)."""
        return self._unroll

    @unroll.setter
    def unroll(self, value: int) -> None:
        if value not in kernels.UNROLLS:
            raise ValueError(f"unroll: expected one of {kernels.UNROLLS}, got {value!r}")
        self._unroll = value

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
        captured swap keeps the mapping given at capture (its descriptor slot
        comes from the ``capture_slots`` reserve and is kept for good).  For a captured swap whose mapping
        changes on every replay, see :meth:`graph_swap`.

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

        return GraphSwap(self, src, dst)

    def plan(self, src, dst, block_mapping) -> SwapPlan:
        """Check a swap and return its :class:`~cupy_swap.plan.SwapPlan`
        without launching anything."""
        with on_device(self.device):
            layout = self._layout(src, dst)
        return SwapPlan(layout, check_mapping_for(layout, block_mapping, self.max_blocks))

    # ------------------------------------------------------------ internals
    def _layout(self, src, dst) -> Layout:
        """The checked, resolved layout of ``(src, dst)``, cached by the
        identity of the objects passed.  A hit is used only while those
        objects are alive, unchanged in place (see :class:`_CachedLayout`) and
        no registered range went away.  Call with this swapper's device
        current (DLPack conversion and pointer queries act on it)."""
        key = (_identity(src), _identity(dst))
        items = _items(src, dst)
        entry = self._layouts.get(key)
        if entry is not None and entry.valid_for(items):
            return entry.layout
        layout = check_layout(src, dst)
        if len(layout.src) > self.max_parts:
            raise ValueError(f"src: expected at most max_parts={self.max_parts} parts, got {len(layout.src)}")
        resolve_layout(layout, self.device)
        layout.serial = next(self._serial)
        with self._lock:
            self._layouts.pop(key, None)
            if len(self._layouts) >= _LAYOUT_CACHE_SIZE:
                self._layouts.pop(next(iter(self._layouts)))
            self._layouts[key] = _CachedLayout(items, len(layout.src), layout)
        return layout

    def choose_path(self, layout: Layout, mapping, mode: str, capturing: bool = False) -> str:
        """``"kernel"``, ``"dma"`` or ``"staged"`` for this swap under
        ``mode``; ``mapping`` is an ``(N, 2)`` array or a short list of pairs."""
        return self._route(layout, mapping, mode, capturing)[0]

    def _route(self, layout: Layout, mapping, mode: str, capturing: bool) -> tuple[str, StagedPlan | None]:
        """The path, and for ``"staged"`` the plan of its chunks."""
        if mode == "staged":
            why, chunks = self._staged_plan(layout, mapping, capturing)
            if why:
                raise ValueError(f"mode: 'staged' {why}")
            return "staged", chunks
        if not layout.kernel_ok:
            if mode == "kernel":
                raise ValueError(
                    f"mode: 'kernel' needs host memory mapped into the GPU's address space, but "
                    f"{layout.unmapped_reason}; use mode='dma' or 'auto'"
                )
            _warn_unmapped(layout.unmapped_reason)
            if mode == "auto":
                chunks = self._staged_if_better(layout, mapping, capturing)
                if chunks is not None:
                    return "staged", chunks
            return "dma", None
        if mode != "auto":
            return mode, None
        block = layout.max_block_bytes
        if block >= self.dma_min_copy_bytes:
            return "dma", None  # every copy is large: the copy engines win
        n = len(mapping)
        if n * len(layout.src) <= self.dma_max_copies:
            return "dma", None
        if block * n < self.dma_min_copy_bytes:
            return "kernel", None  # no run of these can be large enough
        if isinstance(mapping, list) or may_have_runs(mapping):
            copies, largest = copy_count(layout, mapping)
            if copies <= self.dma_max_copies or layout.bytes_per_pair * n >= copies * self.dma_min_copy_bytes:
                return "dma", None
        chunks = self._staged_if_better(layout, mapping, capturing)
        return ("staged", chunks) if chunks is not None else ("kernel", None)

    def _staged_if_better(self, layout: Layout, mapping, capturing: bool) -> StagedPlan | None:
        """auto: the plan of a staged swap when it beats the kernel (a large
        swap whose host blocks lie in long runs), else None."""
        if (
            layout.host_groups is None
            or isinstance(mapping, list)
            or len(mapping) * layout.bytes_per_pair < self.staged_min_bytes
            or not may_have_runs(mapping, column=_HOST_COLUMN[layout.direction])
        ):
            return None
        why, plan = self._staged_plan(layout, mapping, capturing)
        if why:
            return None
        copies = plan.num_copies_per_group * len(layout.host_groups)
        if len(mapping) * layout.bytes_per_pair < copies * STAGED_MIN_AVG_COPY_BYTES:
            return None
        return plan

    def _staged_plan(self, layout: Layout, mapping, capturing: bool) -> tuple[str, StagedPlan | None]:
        """``("", plan)`` for a staged swap, or ``(why not, None)``."""
        if layout.direction not in _HOST_COLUMN:
            return "moves between host and GPU memory, got GPU -> GPU", None
        if self._stagers is None:
            return "needs staging memory, but this swapper has staging_bytes=0", None
        if capturing:
            return "cannot be captured into a CUDA graph; use mode='kernel' or graph_swap()", None
        if layout.host_groups is None:
            return groups_problem(layout.src if layout.direction == IN else layout.dst), None
        stager = self._stagers[layout.direction]
        rows = stager.rows(layout.bytes_per_pair)
        if rows < 2:
            return (
                f"needs room for two blocks of all parts ({2 * layout.bytes_per_pair} bytes) in "
                f"staging_bytes={stager.staging_bytes}; raise staging_bytes"
            ), None
        from cupy.cuda.memory import OutOfMemoryError

        try:
            with stager.lock:
                stager.ensure()  # here, so a failure comes before any work is queued
        except OutOfMemoryError as e:
            return (
                f"could not allocate its staging arena of {stager.staging_bytes} bytes ({e}); "
                f"lower staging_bytes or use mode='kernel'"
            ), None
        m = np.asarray(mapping, dtype=np.int64).reshape(-1, 2)
        sizes = chunk_sizes(m.shape[0], layout.bytes_per_pair, rows // 2)
        if layout.direction == OUT:
            sizes.reverse()  # a short first gather lets the copy engine start early
        return "", plan_chunks(m, sizes, _HOST_COLUMN[layout.direction])

    def _swap(self, src, dst, block_mapping, stream, want, mode, wait_for, timing):
        runtime = self._runtime
        prev = runtime.getDevice()
        if prev != self.device:
            # Everything below acts on our device: DLPack conversion, pointer
            # queries, events, the default stream and the launches.
            runtime.setDevice(self.device)
        try:
            return self._swap_here(src, dst, block_mapping, stream, want, mode, wait_for, timing, prev)
        finally:
            if prev != self.device:
                runtime.setDevice(prev)

    def _swap_here(self, src, dst, block_mapping, stream, want, mode, wait_for, timing, caller_device):
        """:meth:`_swap` with this swapper's device current."""
        layout = self._layout(src, dst)
        return self._run(layout, block_mapping, stream, want, mode, wait_for, timing, caller_device)

    def _run(self, layout: Layout, block_mapping, stream, want, mode, wait_for, timing, caller_device):
        """The hot path, for a checked layout (this swapper's device current):
        check the mapping, route, enqueue, record the event.
        ``caller_device`` was current when the caller called: ``wait_for``
        streams that belong to no device in particular (the null and
        per-thread default streams, raw handles) are the caller's."""
        if want is not None and layout.direction != want:
            method = "swap_in" if want == IN else "swap_out"
            raise ValueError(
                f"{method}: expected {DIRECTION_TEXT[want]} arrays, got "
                f"{DIRECTION_TEXT[layout.direction]}; use swap() for that"
            )
        mapping = fast_pairs(layout, block_mapping, self.max_blocks)
        if mapping is None:
            mapping = check_mapping_for(layout, block_mapping, self.max_blocks)
        mode = self.mode if mode is None else _check_mode(mode)
        timed = self.timing if timing is None else bool(timing)
        runtime = self._runtime
        handle = stream_on_device(stream, self.device)
        waits = [wait_handle(w, self.device, caller_device) for w in _as_sequence(wait_for)]
        # Waiting on a capturing stream makes this one capture too: route as
        # if it already did, so a refusal comes before any wait is enqueued.
        capturing = stream_is_capturing(handle) or any(w.capturing for w in waits)
        moves = len(mapping) and layout.bytes_per_pair  # else: nothing to copy
        path, chunks = self._route(layout, mapping, mode, capturing) if moves else ("none", None)
        for w in waits:
            runtime.streamWaitEvent(handle, w.event_ptr, 0)
        event = self._event_class(disable_timing=not timed)
        event.path, event.nbytes, event.start = path, len(mapping) * layout.bytes_per_pair, None
        held: list[_Slot] = []  # descriptor slots this swap took (locked until gated)
        recorded = False
        try:
            if timed:
                event.start = self._cupy_event()
                runtime.eventRecord(event.start.ptr, handle)
            if path == "kernel":
                self._launch(layout, mapping, handle, capturing, held)
            elif path == "dma":
                self._dma.copy(layout, mapping, handle, capturing)
            elif path == "staged":
                self._staged(layout, chunks, handle, held)
            runtime.eventRecord(event.ptr, handle)
            recorded = True
        finally:
            if held:
                self._release(held, event if recorded else None, handle)
        self.last_path = path
        return event

    def _release(self, held: list, event, handle: int) -> None:
        """Gate each slot in ``held`` behind ``event`` (recorded after the
        swap's launches) and unlock it.  ``event`` None: the swap failed
        after taking its slot, and a launch that reads it may be queued, so
        the slot is gated behind a fence recorded on ``handle`` (or, if even
        that fails, the device is drained first)."""
        try:
            if event is None:
                try:
                    event = self._cupy_event(disable_timing=True)
                    self._runtime.eventRecord(event.ptr, handle)
                except Exception:
                    event = None
                    with contextlib.suppress(Exception):
                        self._runtime.deviceSynchronize()  # nothing queued reads the slot any more
        finally:
            for slot in held:  # unlocked whatever happens, or the ring would stall for good
                if event is not None:
                    slot.event = event
                slot.lock.release()

    def _launch(self, layout: Layout, mapping, handle: int, capturing: bool, held: list) -> None:
        """Write the descriptor into a ring slot (appended to ``held``; the
        caller gates its reuse) and launch the kernel."""
        args = self._write_slot(layout, mapping, handle, capturing, held)
        self._launch_range(layout, args, 0, len(mapping), handle)

    def _write_slot(self, layout: Layout, mapping, handle: int, capturing: bool, held: list) -> _KernelArgs:
        """Write a descriptor into a free slot (eager swaps: a ring slot,
        locked and appended to ``held``); returns the arguments that point
        the kernel at it (large mappings are first copied to the slot's
        device buffer on ``handle``)."""
        slot = self._retire_slot() if capturing else self._acquire(held)
        end = write_descriptor(slot.host_words, layout, mapping, slot.table_serial != layout.serial)
        slot.table_serial = layout.serial
        if len(mapping) <= self.descriptor_from_host_max_pairs:
            return slot.alias_args
        self._upload(slot, slot.device_ptr, end, handle)
        return slot.device_args

    def _upload(self, slot: _Slot, dst_ptr: int, words: int, handle: int) -> None:
        """Copy the first ``words`` 64-bit words of ``slot``'s descriptor to
        device memory at ``dst_ptr``, in order on ``handle``: with a small
        kernel reading the slot's device alias, not a copy engine, whose
        in-order queue may hold a long transfer of another stream."""
        if not slot.host_alias:  # host memory not mapped: only a copy can reach it
            self._runtime.memcpyAsync(dst_ptr, slot.host_ptr, words * 8, _H2D, handle)
            return
        n16 = -(-words // 2)  # descriptors are an even number of words
        grid = min(FETCH_MAX_CTAS, -(-n16 // kernels.FETCH_THREADS))
        fn = kernels.get_named_function(self.device, kernels.FETCH_KERNEL, self.kernel_defines)
        params = slot.fetch_args.set(dst_ptr, n16)
        self._driver.launchKernel(fn, grid, 1, 1, kernels.FETCH_THREADS, 1, 1, 0, handle, params, 0)

    def _launch_range(self, layout: Layout, args: _KernelArgs, first: int, count: int, handle: int) -> None:
        """Launch the kernel over pairs ``first .. first + count - 1`` of the
        descriptor ``args`` points at."""
        params = args.set(len(layout.src), layout.units_per_pair, count, first)
        grid, threads = self._launch_shape(count * layout.units_per_pair)
        fn = kernels.get_function(self.device, layout.width, self.unroll, self.kernel_defines)
        self._driver.launchKernel(fn, grid, 1, 1, threads, 1, 1, 0, handle, params, 0)

    def _staged(self, layout: Layout, plan: StagedPlan, handle: int, held: list) -> None:
        """Enqueue a staged swap; its descriptor slot is appended to ``held``.

        A swap-in runs, per chunk: on the stager's copy stream, waits for
        the scatters that last read the chunk's staging rows, the
        copy-engine copies of its host runs and an event; on ``handle``, a
        wait for that event, the scatter kernel over the chunk's pairs, and
        an event that frees the rows.  Copies that need no scatter of this
        swap go out first, so the link starts moving while the host writes
        the descriptor.  A swap-out mirrors it: gather on ``handle``, copies
        on the copy stream, and ``handle`` finally waits for the last copy.
        One descriptor holds every chunk's pairs; each launch takes its
        range.  All staged swaps of one direction share the copy stream, so
        one also starts after the work queued before any earlier one on its
        own stream."""
        st = self._stagers[layout.direction]
        with st.lock:
            st.ensure()
            try:
                self._enqueue_staged(layout, plan, handle, st, held)
            except BaseException:
                self._fence_after_failure(st, handle)
                raise

    def _enqueue_staged(self, layout: Layout, plan: StagedPlan, handle: int, st: Stager, held: list) -> None:
        """The body of :meth:`_staged` (``st.lock`` held)."""
        rt = self._runtime
        groups, bpp = layout.host_groups, layout.bytes_per_pair
        rows = st.rows(bpp)
        half = self._staging_layout(layout, st, rows)
        k, swap_in = plan.num_chunks, layout.direction == IN
        copier = st.stream.ptr
        writer = copier if swap_in else handle  # the stream that fills staging rows
        if swap_in:
            rt.eventRecord(st.start.ptr, handle)  # after the caller's waits
            rt.streamWaitEvent(copier, st.start.ptr, 0)
        st.layout_for(groups, bpp)
        places = [st.ring.place(size, c) for c, size in enumerate(plan.sizes)]
        chunk_rows = [p[0] for p in places]
        copies = chunk_copies(plan, groups, group_regions(groups, rows), st.base, chunk_rows)
        freed = [None] * k

        def free_rows(c: int) -> None:
            # The rows chunk c lands in: free once their last reader is done.
            _, events, chunks = places[c]
            self._wait_all(writer, events + [freed[d] for d in chunks], st)

        def settle(c: int, stream: int) -> None:
            freed[c] = st.event()
            rt.eventRecord(freed[c].ptr, stream)
            st.ring.settle(c, freed[c])

        if swap_in:
            copied = [None] * k

            def copy_in(c: int) -> None:
                free_rows(c)
                self._dma.issue(*copies[c], copier, _H2D)
                copied[c] = st.event()
                rt.eventRecord(copied[c].ptr, copier)

            ahead = next((c for c, p in enumerate(places) if p[2]), k)
            for c in range(ahead):
                copy_in(c)
            args = self._write_slot(half, kernel_pairs(plan, chunk_rows), handle, False, held)
            for c in range(k):
                if c >= ahead:
                    copy_in(c)
                self._wait_all(handle, [copied[c]], st)
                self._launch_range(half, args, plan.starts[c], plan.sizes[c], handle)
                settle(c, handle)
        else:
            args = self._write_slot(half, kernel_pairs(plan, chunk_rows, gpu_first=True), handle, False, held)
            for c in range(k):
                free_rows(c)
                self._launch_range(half, args, plan.starts[c], plan.sizes[c], handle)
                gathered = st.event()
                rt.eventRecord(gathered.ptr, handle)
                self._wait_all(copier, [gathered], st)
                dsts, srcs, sizes = copies[c]  # (staging, host) addresses
                self._dma.issue(srcs, dsts, sizes, copier, _D2H)
                settle(c, copier)
            rt.streamWaitEvent(handle, freed[-1].ptr, 0)  # the swap ends when its last copy has landed

    def _fence_after_failure(self, st: Stager, handle: int) -> None:
        """A staged swap failed halfway: mark every row it placed as read by
        work that ends after everything it may have queued on either stream,
        so the ring stays sound.  If no event can be recorded, wait on the
        host for every stream that may touch the arena and every event a
        busy row waits for, after which no row is busy and the ring starts
        afresh; if even that fails (a broken context), drop only this
        swap's unsettled rows and keep every other row's barrier."""
        rt = self._runtime
        if st.ring is None:
            return  # failed before placing anything
        try:
            on_caller, fence = st.event(), st.event()
            rt.eventRecord(on_caller.ptr, handle)
            rt.streamWaitEvent(st.stream.ptr, on_caller.ptr, 0)
            rt.eventRecord(fence.ptr, st.stream.ptr)
            st.ring.settle_all(fence)
            st.release([on_caller])
            return
        except Exception:
            pass
        try:
            rt.streamSynchronize(handle)
            rt.streamSynchronize(st.stream.ptr)
            for event in st.ring.events():
                event.synchronize()
            st.ring, st.geometry = None, None
        except Exception:
            st.ring.drop_unsettled()

    def _wait_all(self, stream: int, events: list, stager: Stager) -> None:
        """Make ``stream`` wait for ``events``, then give them back to the
        stager's pool (a wait keeps the record it saw)."""
        for ev in events:
            self._runtime.streamWaitEvent(stream, ev.ptr, 0)
        stager.release(events)

    def _staging_layout(self, layout: Layout, stager: Stager, arena_rows: int) -> Layout:
        """The resolved kernel half of a staged swap: staging arena -> GPU
        (swap-in) or GPU -> staging arena (swap-out); cached on the layout,
        as the arena's address and depth never change."""
        half = layout.staging_layout
        if half is None:
            host = layout.src if layout.direction == IN else layout.dst
            parts = staging_parts(host, layout.host_groups, stager.base, arena_rows, self.device)
            pair = (parts, layout.dst) if layout.direction == IN else (layout.src, parts)
            half = resolve_layout(layout_from_parts(*pair), self.device)
            half.serial = next(self._serial)
            layout.staging_layout = half
        return half

    def _acquire(self, held: list) -> _Slot:
        """The next ring slot, locked and appended to ``held``, once the swap
        that last used it has been enqueued (its lock) and its launch has
        finished (its event).  The caller unlocks it with :meth:`_release`."""
        with self._lock:
            slot = self._slots[self._next]
            self._next = (self._next + 1) % len(self._slots)
        slot.lock.acquire()
        try:
            event = slot.event
            if event is not None and not event.done:
                with self._lock:
                    self.ring_waits += 1
                event.synchronize()
        except BaseException:
            slot.lock.release()  # not written: its event still gates it
            raise
        held.append(slot)  # from here on this swap may write it, so its release gates it
        return slot

    def _retire_slot(self) -> _Slot:
        """A slot for a swap being captured into a graph: every replay reads
        it, so it is taken for good from a reserve that eager swaps never
        touch (no event query needed, which capture would not allow)."""
        with self._lock:
            if not self._capture_pool:
                raise RuntimeError(
                    "swap: expected a free capture slot, got none (each swap captured into a graph "
                    "keeps one); create the BlockSwapper with more capture_slots, or capture a "
                    "graph_swap() whose mapping changes between replays"
                )
            return self._capture_pool.pop()

    def _launch_shape(self, units: int) -> tuple[int, int]:
        """Grid and CTA size for ``units`` vectors: at most ``max_ctas`` CTAs;
        small swaps spread their threads over as many CTAs as the budget
        allows (more SMs issue loads), large ones use full CTAs and stride."""
        cap = min(self.max_threads, kernels.max_threads(self.unroll))
        per_cta = -(-units // (self.unroll * self.max_ctas))
        threads = min(cap, max(32, -(-per_cta // 32) * 32))
        grid = min(self.max_ctas, -(-units // (threads * self.unroll)))
        return max(grid, 1), threads


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

    __slots__ = ("_swapper", "_layout", "_generation", "_held", "direction", "bytes_per_pair")

    def __init__(self, swapper: BlockSwapper, layout: Layout, held: tuple):
        self._swapper = swapper
        self._layout = layout
        self._generation = memory.generation()
        self._held = held  # the caller's arrays stay alive as long as the op
        self.direction = layout.direction
        self.bytes_per_pair = layout.bytes_per_pair

    def __call__(self, block_mapping, *, stream=None, mode=None, wait_for=(), timing=None):
        sw = self._swapper
        runtime = sw._runtime
        prev = runtime.getDevice()
        if prev != sw.device:
            runtime.setDevice(sw.device)
        try:
            if self._generation != memory.generation():
                # A registered range went away since: resolve the host aliases again
                # (raises if this op's host memory is no longer pinned).
                self._generation = memory.generation()
                self._layout = sw._layout(*self._held)
            return sw._run(self._layout, block_mapping, stream, None, mode, wait_for, timing, prev)
        finally:
            if prev != sw.device:
                runtime.setDevice(prev)

    def __repr__(self) -> str:
        parts = len(self._layout.src)
        return (
            f"PreparedSwap({DIRECTION_TEXT[self.direction]}, {parts} part{'s' * (parts != 1)}, "
            f"{self.bytes_per_pair} bytes per pair, GPU {self._swapper.device})"
        )


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


def _as_sequence(items) -> tuple:
    if items is None:
        return ()
    if isinstance(items, (list, tuple)):
        return tuple(items)
    return (items,)


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
