"""Launch the swap kernel in one of three forms; own the descriptor ring.

* **Inline** (:class:`BoundKernel`): up to 64 parts x 1792 pairs (256 x
  1024) travel whole in the kernel's parameter; an eager call sets them on
  a one-kernel graph per kernel and stream and launches it (cheaper than
  ``cuLaunchKernel`` on the H200's host: NOTES items 32, 34); on a
  capturing stream the launch is plain and its node keeps its pairs.
* **By reference** (:class:`~.abi.ByRefArgs`): rows on the GPU, and more
  than :data:`HOST_CHECK_ROWS` host rows checked in the launch, in a ring
  slot's pinned words read through their device alias.
* **Descriptor**: larger and staged swaps, graph replays: written into a
  ring slot and uploaded to its fixed device buffer by a small kernel on
  the swap's stream (a copy engine's in-order queue could hold it behind
  another stream's transfer).

**Queueing rule.**  A swap takes a free slot, looking from the ring's next;
only when every slot is busy does it wait, for the first to free.  A slot
is rewritten only after the event behind its last launch completed, and
the releaser frees the ring after every slot's last launch.  A captured
descriptor swap gets buffers of its own, kept for the process.
"""

from __future__ import annotations

import collections
import ctypes
import functools
import threading
import time
import warnings

import numpy as np

from . import abi, capture, kernels, memory, release
from .driver import KernelNodeParams, graph_calls

# Descriptor uploads use at most this many CTAs (a 64 KiB descriptor is one
# round of 16-byte loads per thread).
FETCH_MAX_CTAS = 16
# Kernel nodes one launcher builds (one per kernel and stream); launches on
# further streams use cuLaunchKernel.
MAX_KERNEL_NODES = 64
_H2D = 1
# A swap that finds every ring slot busy looks again after these many
# seconds, doubling up to the last.
_POLL_FIRST, _POLL_MAX = 20e-6, 100e-6
# Host mappings of at most this many rows are checked on the host and travel
# in the launch's parameter; longer ones go through a ring slot, checked in
# the launch (benchmarks/NOTES.md, item 43).
HOST_CHECK_ROWS = 16


_MAX_DYNAMIC_SHARED = 8  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
_SHARED_OPTIN = 97  # cudaDevAttrMaxSharedMemoryPerBlockOptin
_STATIC_SHARED = 16 << 10  # above the copy kernels' own (12.4 KiB: the descriptor's part table)


def _check_rows_max(device: int) -> int:
    """Most rows one launch can check: a power of two whose table and kept
    rows (:func:`~.abi.check_shared_bytes`) fit the opt-in shared memory
    beside the kernel's static part table (H200: 8192 rows in 192 KiB)."""
    from cupy.cuda import runtime

    room = runtime.deviceGetAttribute(_SHARED_OPTIN, device) - _STATIC_SHARED
    rows = 1 << 20
    while rows > 1 and abi.check_shared_bytes(rows) > room:
        rows >>= 1
    return rows


def launch_shape(units: int, max_ctas: int) -> tuple[int, int]:
    """Grid and CTA size for ``units`` vectors: at most ``max_ctas`` CTAs,
    threads spread over as many CTAs as the budget allows (one round of
    ``UNROLL`` loads each), then full CTAs stride.  (Spreading short swaps
    over every SM measured no faster: ``benchmarks/NOTES.md``, item 27.)"""
    per_cta = -(-units // (abi.UNROLL * max_ctas))
    threads = min(abi.MAX_THREADS, max(32, -(-per_cta // 32) * 32))
    grid = min(max_ctas, -(-units // (threads * abi.UNROLL)))
    return max(grid, 1), threads


class KernelNode:
    """An instantiated graph of one kernel launched on one stream:
    :meth:`launch_one` sets the node's grid and parameters (the driver
    copies the parameter values then) and launches the graph once.

    Launches of one graph run one after another, so each stream gets its own
    graph (swaps on two streams stay concurrent).  Callers serialize
    :meth:`launch_one` (the launcher's inline lock).  Built with kernel
    ``fn`` and a launch of it (``grid``, ``threads``, ``args_ptr``)."""

    __slots__ = ("graph", "exec", "params", "_args", "_set", "_launch")

    def __init__(self, fn: int, grid: int, threads: int, args_ptr: int):
        from cupy.cuda import runtime

        calls = graph_calls()
        self.params = KernelNodeParams(fn, grid, 1, 1, threads, 1, 1, 0, args_ptr, None)
        ptr = ctypes.c_void_p(ctypes.addressof(self.params))
        graph, node = ctypes.c_void_p(), ctypes.c_void_p()
        _check(calls.create(ctypes.byref(graph), 0), "cuGraphCreate")
        self.graph = graph.value
        try:
            _check(calls.add_kernel_node(ctypes.byref(node), graph, None, 0, ptr), "cuGraphAddKernelNode")
            self.exec = runtime.graphInstantiate(self.graph)
        except BaseException:
            runtime.graphDestroy(self.graph)
            raise
        self._set, self._launch = calls.set_params, runtime.graphLaunch
        # The arguments of cuGraphExecKernelNodeSetParams, as c_void_p.
        self._args = (ctypes.c_void_p(self.exec), node, ptr)

    def launch_one(self, grid: int, threads: int, args_ptr: int, stream: int, smem: int = 0) -> None:
        """Set the node's grid, parameters and ``smem`` (bytes of dynamic
        shared memory), then launch the graph on ``stream``."""
        params = self.params
        params.gridDimX, params.blockDimX, params.kernelParams = grid, threads, args_ptr
        params.sharedMemBytes = smem
        status = self._set(*self._args)
        if status:
            _check(status, "cuGraphExecKernelNodeSetParams")
        self._launch(self.exec, stream)

    def destroy(self) -> None:
        """Destroy the graph (a launch still in flight completes first: CUDA
        frees an executing graph when it finishes)."""
        from cupy.cuda import runtime

        runtime.graphExecDestroy(self.exec)
        runtime.graphDestroy(self.graph)


def _check(status: int, call: str) -> None:
    if status:
        raise RuntimeError(f"{call}: expected CUDA_SUCCESS, got CUresult {status}")


class _Slot:
    """One ring entry: pinned descriptor words, their device copy, the packed
    kernel arguments, and the event behind the last launch.

    ``lock`` is held by the swap that owns the slot, from the moment it is
    taken until that swap's event is recorded and stored in ``event``: a
    thread that comes round the ring meanwhile waits for the lock, then for
    the event, and never rewrites a descriptor that a queued launch reads."""

    def __init__(self, host_words: np.ndarray, device_ptr: int):
        self.lock = threading.Lock()
        self.host_words = host_words
        self.table_serial = None  # whose part table the slot holds (not -1: an uncached layout's serial)
        self.host_ptr = host_words.ctypes.data
        self.device_ptr = device_ptr
        self.device_args = abi.DescriptorArgs(device_ptr)
        # The upload kernel reads the words through the buffer's device alias
        # (0 where host memory is not mapped: then a copy uploads them).
        self.host_alias = memory.host_alias(self.host_ptr, host_words.nbytes)
        self.fetch_args = abi.FetchArgs(self.host_alias)
        self.event = None


def _free_launcher(ring_ptr: int, device: int, nodes: dict, inline_lock) -> None:
    """The releaser's half of :meth:`Launcher.close`: the device ring and the
    kernel nodes (under the inline lock, so no launch is using one; a swap
    that passed the closed check before close() launches plainly after)."""
    from .streams import on_device

    with on_device(device), inline_lock:
        for node in list(nodes.values()):
            node.destroy()
        nodes.clear()
    release.device_free(ring_ptr, device)


def _wait_for_slots(slots: list) -> None:
    for slot in slots:
        with slot.lock:  # a swap holding the slot stores its event first
            event = slot.event
        if event is not None:  # as a plain CUDA event: a swap's event raises its failed check
            from cupy.cuda import runtime

            runtime.eventSynchronize(event.ptr)


class BoundKernel:
    """The kernel launches of one resolved layout, ready for any mapping:
    host rows (:meth:`launch_host`) and rows on the GPU (:meth:`launch_rows`)."""

    __slots__ = ("_launcher", "layout", "_tiers", "_shapes", "max_pairs", "_byref", "slots_ok")

    def __init__(self, launcher: Launcher, layout):
        self._launcher = launcher
        self.layout = layout
        parts = len(layout.src)
        # Most pairs an inline tier of this layout can take (the tiers this
        # GPU's module really has are looked up, compiling it, on the first
        # launch: a layout that never runs the kernel never compiles it).
        self.max_pairs = max((t.pairs for t in abi.TIERS if t.parts >= parts), default=-1)
        self._tiers = None  # [[tier, InlineArgs or None], ...], in TIERS order
        self._shapes: dict[int, tuple] = {}  # n -> (grid, threads, smem, the budget they were made for)
        self._byref = None  # abi.ByRefArgs, on the first launch by reference
        self.slots_ok = launcher.slots_mapped  # False: ring not mapped, or no by-reference kernel here

    def shape(self, n: int, checked: bool) -> tuple:
        """``(grid, threads, smem)`` of a launch over ``n`` pairs (``smem``:
        the in-launch check's table, when ``checked``)."""
        lau = self._launcher
        shape = self._shapes.get(n)
        if shape is None or shape[3] != lau.max_ctas:
            grid, threads = launch_shape(n * self.layout.units_per_pair, lau.max_ctas)
            shape = self._shapes[n] = (grid, threads, abi.check_shared_bytes(n), lau.max_ctas)
        return shape[0], shape[1], shape[2] if checked else 0

    def launch(self, pairs, n: int, stream: int, capturing: bool, status: int = 0, seq: int = 0) -> bool:
        """Launch over ``n`` pairs (``(n, 2)`` int64 array or list of 2n ints)
        on ``stream`` with the smallest inline tier that holds them; False
        (nothing launched) when none does.  ``capturing``: launch plainly (a
        graph launch cannot be captured).  ``status``, ``seq``: the launch's
        status record and number (status 0: no check)."""
        if n > self.max_pairs or n > self._launcher.max_inline_pairs:
            return False
        tiers = self._tiers
        if tiers is None:
            parts = len(self.layout.src)
            tiers = [[t, None] for t in self._launcher.inline_tiers(self.layout.width) if t.parts >= parts]
            # Lower the bound before publishing the tiers: a thread that sees
            # them must never see a bound above their largest.
            self.max_pairs = max((t.pairs for t, _ in tiers), default=-1)
            self._tiers = tiers
        for entry in tiers:
            if n <= entry[0].pairs:
                break
        else:
            return False  # no tier this GPU has holds n pairs
        args = entry[1]
        if args is None:
            fn = self._launcher.function(abi.inline_kernel(self.layout.width, entry[0]))
            args = entry[1] = abi.InlineArgs(entry[0], self.layout, fn)
        grid, threads, smem = self.shape(n, status != 0)
        with self._launcher.inline_lock:  # one parameter buffer per tier and one node per stream
            words = args.words
            words[0], words[5], words[6] = n, status, seq
            if type(pairs) is list:
                args.pairs_c[: 2 * n] = pairs  # Python ints: ctypes stores them faster than NumPy converts
            else:
                args.pairs[: 2 * n] = pairs.reshape(-1)
            self._launcher.launch_inline(args.fn, grid, threads, stream, args.ptr, capturing, smem)
        return True

    def launch_host(
        self, pairs, n: int, stream: int, capturing: bool, held: list, status: int, seq: int
    ) -> None:
        """Launch over ``n`` host rows: through a ring slot when the launch
        checks more than :data:`HOST_CHECK_ROWS` of them (never while
        capturing: the caller checks captured rows on the host), else
        inline, else (too many for a parameter) through the descriptor ring.
        Ring slots taken are appended to ``held``."""
        if status and n > HOST_CHECK_ROWS and self.launch_slot(pairs, n, stream, held, status, seq):
            return
        if not self.launch(pairs, n, stream, capturing, status, seq):
            lau = self._launcher
            args = lau.write_slot(self.layout, pairs, stream, capturing, held, status, seq)
            lau.launch_range(self.layout, args, 0, n, stream, abi.check_shared_bytes(n) if status else 0)

    def launch_slot(self, pairs, n: int, stream: int, held: list, status: int, seq: int) -> bool:
        """Launch over ``n`` host rows, checked in the launch, through a ring
        slot (appended to ``held``): the by-reference kernel reads the rows
        in the slot's pinned words through its device alias, once per CTA
        (``benchmarks/NOTES.md``, item 43).  False, with nothing taken or
        launched, where this layout has no by-reference kernel or the ring
        is not mapped."""
        if not self.slots_ok:
            return False
        lau = self._launcher
        args = self._byref
        if args is None:
            try:
                args = self._byref = lau.byref_args(self.layout)
            except ValueError:  # more parts than this CUDA's by-reference kernels take
                self.slots_ok = False
                return False
        slot = lau.acquire(held)
        slot.table_serial = None  # the rows overwrite a cached descriptor
        slot.host_words[: 2 * n] = pairs if type(pairs) is list else pairs.reshape(-1)
        grid, threads, smem = self.shape(n, True)
        rows = slot.host_alias
        with lau.inline_lock:
            ptr = args.set(n, status, seq, rows, rows + 8, 2)
            lau.launch_inline(args.fn, grid, threads, stream, ptr, False, smem)
        return True

    def launch_rows(self, rows, stream: int, capturing: bool, status: int, seq: int) -> None:
        """Launch over a mapping on the GPU (:class:`~.gpu_mapping.DeviceRows`),
        checked in the launch."""
        args = self._byref
        if args is None:  # raises where there is no kernel, saying why
            args = self._byref = self._launcher.byref_args(self.layout)
        grid, threads, smem = self.shape(rows.n, True)
        with self._launcher.inline_lock:
            ptr = args.set(rows.n, status, seq, rows.src, rows.dst, rows.step)
            self._launcher.launch_inline(args.fn, grid, threads, stream, ptr, capturing, smem)


class Launcher:
    """Kernel functions, launch shapes, kernel nodes and the descriptor ring
    (``ring_size`` slots of ``max_parts`` x ``max_blocks``) of one swapper's
    GPU ``device``; ``max_ctas`` is one swap's CTA budget."""

    def __init__(self, device: int, max_parts: int, max_blocks: int, ring_size: int, max_ctas: int):
        from cupy.cuda import driver, runtime

        self.device = device
        self.max_ctas = max_ctas
        # Swaps of more pairs take the descriptor ring (0: always; benchmarks
        # and tests compare the two forms with it).
        self.max_inline_pairs = max(t.pairs for t in abi.TIERS)
        self._launch = driver.launchKernel
        self._memcpy = runtime.memcpyAsync
        self._record = runtime.eventRecord
        self._lock = threading.Lock()
        self.inline_lock = threading.Lock()
        self.ring_waits = 0  # times a swap had to wait for a slot (ring full)
        self.slot_words = abi.descriptor_words(max_parts, max_blocks)
        row_bytes = self.slot_words * 8
        host = memory.zeros_pinned_for_gpu((ring_size, self.slot_words), np.int64, device)
        # Device copies of the descriptors: cudaMalloc'd, not from CuPy's
        # stream-ordered pool, and written only by uploads on the stream of
        # the swap that reads them (nothing to zero first).
        dev = release.device_malloc(ring_size * row_bytes, device)
        self._nodes: dict[tuple, KernelNode] = {}  # (kernel, stream) -> graph
        self._graphs_ok = graph_calls() is not None
        free = functools.partial(_free_launcher, dev, device, self._nodes, self.inline_lock)
        try:
            self._slots = [_Slot(host[i], dev + i * row_bytes) for i in range(ring_size)]
        except BaseException:
            release.defer(free, None, "descriptor ring")
            raise
        self._next = 0
        # Host rows go through slots only where the kernel can read them there.
        self.slots_mapped = all(slot.host_alias for slot in self._slots)
        self._tiers: dict[int, list] = {}
        self._loaded: dict[str, int] = {}
        self.check_rows_max = _check_rows_max(device)
        self._kept: collections.deque = collections.deque()  # (event, arrays) of GPU-mapping swaps
        self._kept_lock = threading.Lock()
        # Dropped or closed: the releaser frees the ring once the last swap
        # that read each slot has completed (the host words go with the slots).
        wait = functools.partial(_wait_for_slots, self._slots)
        self._finalizer = release.when_dropped(self, free, wait, f"descriptor ring of GPU {device}")

    def keep_until_done(self, event, keep) -> None:
        """Hold ``keep`` (the caller's GPU mapping, which the swap's kernel
        reads) until ``event`` (recorded after that kernel) has completed:
        a temporary index tensor freed at once could otherwise be reused,
        by an allocator of another stream, before the kernel reads it.
        Held first; completed ones are dropped with queries in relaxed mode,
        and a query that fails keeps them (this never raises)."""
        with self._kept_lock:
            kept = self._kept
            kept.append((event, keep))
            try:
                with capture.relaxed():
                    while len(kept) > 1 and capture.query_in_block(kept[0][0]):
                        kept.popleft()
            except Exception:
                pass

    def close(self) -> None:
        """Hand the ring to the releaser (freed after the swaps that read it)."""
        self._finalizer()

    # ---------------------------------------------------------- functions
    def function(self, name: str) -> int:
        """``CUfunction`` of kernel ``name`` on this GPU, allowed the dynamic
        shared memory of a check of :attr:`check_rows_max` rows."""
        fn = self._loaded.get(name)
        if fn is None:
            from cupy.cuda import driver

            with capture.relaxed():  # a first swap may load kernels while a stream captures
                fn = kernels.get_function(self.device, name)
                if name != abi.FETCH_KERNEL:
                    smem = abi.check_shared_bytes(self.check_rows_max)
                    driver.funcSetAttribute(fn, _MAX_DYNAMIC_SHARED, smem)
            self._loaded[name] = fn
        return fn

    def byref_args(self, layout) -> abi.ByRefArgs:
        """The parameter of ``layout``'s launches over a mapping on the GPU.

        Raises
        ------
        ValueError
            More parts than this CUDA's by-reference kernels take."""
        parts = len(layout.src)
        tier = next(p for p in abi.BYREF_PARTS if p >= parts)
        name = abi.byref_kernel(layout.width, tier)
        with capture.relaxed():  # may compile and load the module
            found = kernels.has_function(self.device, name)
        if not found:
            raise ValueError(
                f"block_mapping: a mapping on the GPU with {parts} parts needs CUDA 12.1 or later (kernel "
                f"parameters over 4 KiB); pass the rows on the host or use at most {abi.BYREF_PARTS[-2]} parts"
            )
        return abi.ByRefArgs(tier, layout, self.function(name))

    def inline_tiers(self, width: int) -> list:
        """The inline tiers this GPU's module has for ``width``."""
        tiers = self._tiers.get(width)
        if tiers is None:
            with capture.relaxed():  # may compile and load the module
                tiers = [
                    t for t in abi.TIERS if kernels.has_function(self.device, abi.inline_kernel(width, t))
                ]
            self._tiers[width] = tiers
        return tiers

    def bind(self, layout) -> BoundKernel:
        """The inline launch of a resolved layout."""
        return BoundKernel(self, layout)

    def launch_kernel(
        self, fn: int, grid: int, threads: int, stream: int, params: int, smem: int = 0
    ) -> None:
        self._launch(fn, grid, 1, 1, threads, 1, 1, smem, stream, params, 0)

    def launch_inline(
        self, fn: int, grid: int, threads: int, stream: int, params: int, capturing: bool, smem: int = 0
    ) -> None:
        """Launch ``fn`` through this stream's kernel node (built on first
        use), or plainly while ``stream`` captures or when no node can be
        built (:meth:`_new_node`).  The caller holds :attr:`inline_lock`."""
        node = None if capturing else self._nodes.get((fn, stream))
        if node is None and not capturing:
            node = self._new_node(fn, grid, threads, params, stream)
        if node is not None:
            node.launch_one(grid, threads, params, stream, smem)
        else:
            self._launch(fn, grid, 1, 1, threads, 1, 1, smem, stream, params, 0)

    def _new_node(self, fn: int, grid: int, threads: int, params: int, stream: int) -> KernelNode | None:
        """A new graph for ``fn`` on ``stream`` (the caller holds
        :attr:`inline_lock`, which the release of the graphs takes too), or
        None: the launcher is closed, has its :data:`MAX_KERNEL_NODES`, or
        graphs cannot be built here (the failure is remembered; launches go
        out plainly)."""
        if len(self._nodes) >= MAX_KERNEL_NODES or not self._finalizer.alive or not self._graphs_ok:
            return None
        try:
            with capture.relaxed():  # legal while another thread captures
                node = KernelNode(fn, grid, threads, params)
        except Exception as e:
            self._graphs_ok = False
            warnings.warn(
                f"cupy_swap: kernel graphs unavailable ({e}); launching kernels directly",
                RuntimeWarning,
                stacklevel=2,
            )
            return None
        self._nodes[fn, stream] = node
        return node

    # --------------------------------------------------------- descriptors
    def write_slot(
        self, layout, mapping, stream: int, capturing: bool, held: list, status: int = 0, seq: int = 0
    ) -> abi.DescriptorArgs:
        """Write a descriptor into a free slot (eager swaps: a ring slot,
        locked and appended to ``held``; captured swaps: :meth:`_own_slot`)
        and upload it on ``stream``; returns the arguments that point the
        kernel at its device copy."""
        slot = self._own_slot(layout, mapping) if capturing else self.acquire(held)
        fresh_table = slot.table_serial != layout.serial
        slot.table_serial = None  # until the write completes: an interrupted one marks no table current
        end = abi.write_descriptor(slot.host_words, layout, mapping, fresh_table, status, seq)
        slot.table_serial = layout.serial
        self.upload(slot, slot.device_ptr, end, stream)
        return slot.device_args

    def _own_slot(self, layout, mapping) -> _Slot:
        """A slot for a swap being captured into a graph: every replay
        uploads and reads its descriptor, so it gets its own pinned and
        device buffers, sized for it and kept for the life of the process (a
        graph may be replayed at any time, and CUDA tells no one when it is
        destroyed).  Allocated in relaxed capture mode, which a capture in
        progress allows; the upload is captured with the launch."""
        n = len(mapping) // 2 if type(mapping) is list else mapping.shape[0]
        words = abi.HEADER_WORDS + layout.table.size + 2 * n  # even: uploads move 16-byte words
        with capture.relaxed():
            host = memory.zeros_pinned_for_gpu(words, np.int64, self.device)
            slot = _Slot(host, release.device_malloc(8 * words, self.device))
        release.keep_for_process(slot)
        return slot

    def stage_descriptor(self, layout, mapping, dst_ptr: int, stream: int):
        """Write a descriptor through a ring slot into device memory at
        ``dst_ptr``, in order on ``stream`` (graph replays); returns the
        event recorded after the upload."""
        event = capture.new_event()
        held: list = []
        recorded = False
        try:
            slot = self.acquire(held)
            slot.table_serial = None  # the slot holds this descriptor, not a cached one
            words = abi.write_descriptor(slot.host_words, layout, mapping, True)
            self.upload(slot, dst_ptr, words, stream)
            self._record(event.ptr, stream)
            recorded = True
        finally:
            self.release(held, event if recorded else None, stream)
        return event

    def upload(self, slot: _Slot, dst_ptr: int, words: int, stream: int) -> None:
        """Copy the first ``words`` words of ``slot``'s descriptor to device
        memory at ``dst_ptr``, in order on ``stream``: with a small kernel
        reading the slot's device alias, not a copy engine, whose in-order
        queue may hold a long transfer of another stream."""
        if not slot.host_alias:  # host memory not mapped: only a copy can reach it
            self._memcpy(dst_ptr, slot.host_ptr, words * 8, _H2D, stream)
            return
        n16 = -(-words // 2)  # descriptors are an even number of words
        grid = min(FETCH_MAX_CTAS, -(-n16 // abi.FETCH_THREADS))
        params = slot.fetch_args.set(dst_ptr, n16)
        self.launch_kernel(self.function(abi.FETCH_KERNEL), grid, abi.FETCH_THREADS, stream, params)

    def launch_range(
        self, layout, args: abi.DescriptorArgs, first: int, count: int, stream: int, smem: int = 0
    ) -> None:
        """Launch over pairs ``first .. first + count - 1`` of the
        descriptor ``args`` points at (``smem``: its check's table)."""
        params = args.set(len(layout.src), layout.units_per_pair, count, first)
        grid, threads = launch_shape(count * layout.units_per_pair, self.max_ctas)
        fn = self.function(abi.descriptor_kernel(layout.width))
        self.launch_kernel(fn, grid, threads, stream, params, smem)

    def replay_args(self, layout, desc_ptr: int, max_pairs: int):
        """``(function, grid, threads, args)`` of a launch that reads its
        pair count from the descriptor at ``desc_ptr`` when it runs (graph
        replays; sized for ``max_pairs``)."""
        args = abi.DescriptorArgs(desc_ptr)
        args.set(len(layout.src), layout.units_per_pair, -1)
        grid, threads = launch_shape(max(max_pairs, 1) * layout.units_per_pair, self.max_ctas)
        return self.function(abi.descriptor_kernel(layout.width)), grid, threads, args

    def acquire(self, held: list) -> _Slot:
        """A free ring slot, locked and appended to ``held``: the first,
        from the ring's next, that no swap is enqueueing (its lock) and whose
        last launch has finished (its event).  With every slot busy it polls
        them until one frees (the wait counts in :attr:`ring_waits`).  The
        caller unlocks it with :meth:`release`."""
        pause = _POLL_FIRST
        while True:
            if not self._finalizer.alive:  # closed, maybe while this swap waited
                raise RuntimeError("swap: the BlockSwapper that made this object is closed")
            slot = self._free_slot()
            if slot is not None:
                held.append(slot)  # from here on this swap may write it, so its release gates it
                return slot
            if pause == _POLL_FIRST:
                with self._lock:
                    self.ring_waits += 1
            time.sleep(pause)
            pause = min(2 * pause, _POLL_MAX)

    def _free_slot(self) -> _Slot | None:
        """One look round the ring: a free slot, locked, or None (event
        queries in relaxed mode: legal while another thread captures)."""
        slots = self._slots
        n = len(slots)
        with self._lock, capture.relaxed():
            first = self._next
            for k in range(n):
                i = (first + k) % n
                slot = slots[i]
                if not slot.lock.acquire(blocking=False):
                    continue  # a swap is enqueueing on it
                try:
                    if not self._finalizer.alive:  # closed: the releaser may free the ring now
                        raise RuntimeError("swap: the BlockSwapper that made this object is closed")
                    busy = slot.event is not None and not capture.query_in_block(slot.event)
                except BaseException:
                    slot.lock.release()
                    raise
                if busy:
                    slot.lock.release()
                    continue
                slot.event = None  # done: no query next time
                self._next = (i + 1) % n
                return slot
        return None

    def release(self, held: list, event, stream: int) -> None:
        """Gate each slot in ``held`` behind ``event`` (recorded after the
        swap's launches) and unlock it.  ``event`` None: the swap failed
        after taking its slot, and a launch that reads it may be queued, so
        the slot is gated behind a fence recorded on ``stream`` (or, if even
        that fails, the stream is drained first: never the device, which
        would break graph captures on other threads)."""
        try:
            if event is None:
                try:
                    with capture.relaxed():  # legal while another thread captures
                        event = capture.new_event()
                        self._record(event.ptr, stream)
                except Exception:
                    event = None
                    from cupy.cuda import runtime

                    try:
                        with capture.relaxed():
                            runtime.streamSynchronize(stream)  # nothing queued reads the slot any more
                    except Exception:
                        pass
        finally:
            for slot in held:  # unlocked whatever happens, or the ring would stall for good
                if event is not None:
                    slot.event = event
                slot.lock.release()
