"""Launch the swap kernel; own the descriptor ring.

* **Slot** (every kernel swap, :class:`BoundKernel`): the call's rows (or
  where its GPU rows are) and its count, status and number go into a slot of
  the :class:`~.slots.SlotRing`; the op launches the kernel with a
  parameter made once for that slot (it points at the slot's device alias),
  so a call writes no parameter.  A captured swap gets a slot of its own,
  kept for the process, and a plain launch the capture records.
* **Descriptor**: staged swaps and graph_swap replays, and host rows where
  pinned memory cannot be mapped: header, table and pairs written into a
  descriptor ring slot and uploaded to its fixed device buffer by a small
  kernel on the swap's stream (a copy engine's in-order queue could hold it
  behind another stream's transfer).

**Queueing rule** (descriptor ring; the slot ring keeps its own:
:mod:`.slots`).  A swap takes a free slot, looking from the ring's next;
only when every slot is busy does it wait, for the first to free.  A slot
is rewritten only after the event behind its last launch completed, and
the releaser frees the ring after every slot's last launch.
"""

from __future__ import annotations

import functools
import threading
import time

import numpy as np

from . import abi, capture, kernels, memory, release

# Descriptor uploads use at most this many CTAs (a 64 KiB descriptor is one
# round of 16-byte loads per thread).
FETCH_MAX_CTAS = 16
_H2D = 1
# A swap that finds every ring slot busy looks again after these many
# seconds, doubling up to the last.
_POLL_FIRST, _POLL_MAX = 20e-6, 100e-6


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


class _Open:
    """The finalizer of a launcher whose descriptor ring is not allocated:
    calling it closes the launcher."""

    __slots__ = ("alive",)

    def __init__(self):
        self.alive = True

    def __call__(self) -> None:
        self.alive = False


def _free_launcher(ring_ptr: int, device: int) -> None:
    """The releaser's half of :meth:`Launcher.close`: the device ring."""
    release.device_free(ring_ptr, device)


def _wait_for_slots(slots: list) -> None:
    for slot in slots:
        with slot.lock:  # a swap holding the slot stores its event first
            event = slot.event
        if event is not None:  # as a plain CUDA event: a swap's event raises its failed check
            from cupy.cuda import runtime

            runtime.eventSynchronize(event.ptr)


class BoundKernel:
    """The kernel launches of one resolved layout, for any mapping: a ring
    slot's (:meth:`launch_slot`), a captured launch (:meth:`launch_captured`),
    or the descriptor ring (:meth:`launch_descriptor`).

    A slot launch is one ``cuLaunchKernel`` of a parameter made once per op
    and slot (pointing at that slot's words), so a call sets nothing: no
    graph is built on the hot path (a lazily built graph per slot once held
    a call for the whole of a busy stream's queue: NOTES item 61)."""

    __slots__ = ("__weakref__", "_launcher", "layout", "_args", "_slot_args", "_shape", "_lock")

    def __init__(self, launcher: Launcher, layout):
        self._launcher = launcher
        self.layout = layout
        self._args = None  # abi.ByRefArgs, built (and the module compiled) on the first launch
        self._slot_args: list = []  # per ring slot: its ByRefArgs, None until the slot is first used
        self._shape = None  # (ctas budget, grid, threads, smem) of slot launches
        self._lock = threading.Lock()

    def _byref(self) -> abi.ByRefArgs:
        args = self._args
        if args is None:  # raises where this CUDA has no kernel for as many parts, saying why
            args = self._args = self._launcher.byref_args(self.layout)
        return args

    def launch_slot(self, i: int, stream: int) -> None:
        """Launch over ring slot ``i`` (its control record and rows) on
        ``stream``."""
        lau = self._launcher
        shape = self._shape
        if shape is None or shape[0] != lau.max_ctas:
            shape = self._reshape(lau)
        args = self._slot_args[i]
        if args is None:
            args = self._for_slot(i)
        lau._launch(args.fn, shape[1], 1, 1, shape[2], 1, 1, shape[3], stream, args.ptr, 0)

    def _reshape(self, lau) -> tuple:
        """The launch shape for this CTA budget (a swap reads at most
        ``capacity`` rows; CTAs past a short swap's rows return at once)."""
        ring = lau.slots
        with self._lock:
            grid, threads = launch_shape(ring.capacity * self.layout.units_per_pair, lau.max_ctas)
            smem = abi.check_shared_bytes(min(ring.capacity, lau.check_rows_max))
            if not self._slot_args:
                self._slot_args = [None] * ring.size
            self._shape = (lau.max_ctas, grid, threads, smem)
        return self._shape

    def _for_slot(self, i: int) -> abi.ByRefArgs:
        ring = self._launcher.slots
        with self._lock:
            args = self._byref().copy()
            rows = ring.aliases[i] + 8 * abi.CONTROL_WORDS
            args.set(ring.capacity, 0, 0, rows, rows + 8, 2, ring.aliases[i], ring.arrivals[i])
            self._slot_args[i] = args
        return args

    def launch_captured(self, pairs, n: int, stream: int) -> None:
        """Launch over ``n`` host rows checked on the host, recorded by the
        capture of ``stream``: the rows go into a slot of the swap's own,
        kept for the life of the process (a replay may run at any time)."""
        lau = self._launcher
        with capture.relaxed():
            words = memory.zeros_pinned_for_gpu(abi.CONTROL_WORDS + 2 * n, np.int64, lau.device)
        release.keep_for_process(words)
        words[0] = n
        words[abi.CONTROL_WORDS :] = pairs if type(pairs) is list else pairs.reshape(-1)
        alias = memory.host_alias(words.ctypes.data, words.nbytes)
        grid, threads = launch_shape(max(n, 1) * self.layout.units_per_pair, lau.max_ctas)
        with self._lock:
            args = self._byref()
            rows = alias + 8 * abi.CONTROL_WORDS
            ptr = args.set(n, 0, 0, rows, rows + 8, 2, alias, 0)
            lau.launch_kernel(args.fn, grid, threads, stream, ptr)

    def launch_descriptor(self, pairs, n: int, stream: int, held: list) -> None:
        """Launch over ``n`` host rows checked on the host through the
        descriptor ring (where the slot ring cannot be mapped)."""
        lau = self._launcher
        args = lau.write_slot(self.layout, pairs, stream, held)
        lau.launch_range(self.layout, args, 0, n, stream)


class Launcher:
    """Kernel functions, launch shapes, the slot ring (``ring_size`` slots of
    ``max_blocks`` rows) and the descriptor ring (``ring_size`` slots of
    ``max_parts`` x ``max_blocks``) of one swapper's GPU ``device``;
    ``max_ctas`` is one swap's CTA budget."""

    def __init__(self, device: int, max_parts: int, max_blocks: int, ring_size: int, max_ctas: int):
        from cupy.cuda import driver, runtime

        from .slots import SlotRing

        self.device = device
        self.max_ctas = max_ctas
        self._launch = driver.launchKernel
        self._memcpy = runtime.memcpyAsync
        self._record = runtime.eventRecord
        self._lock = threading.Lock()
        self.ring_waits = 0  # times a swap had to wait for a descriptor slot (ring full)
        self.slots = SlotRing(device, ring_size, max_blocks)
        # Slot launches need the ring mapped into the GPU's address space.
        self.slots_ok = self.slots.mapped
        self.slot_words = abi.descriptor_words(max_parts, max_blocks)
        self._ring_size = ring_size
        # The descriptor ring (staged swaps, graph_swap, hosts that cannot be
        # mapped) is allocated on its first use: a swapper that never uses it
        # frees no device memory when dropped (a cudaFree waits for the whole
        # device, so a free while a stream waits on the host stalls: NOTES 61).
        self._slots: list | None = None
        self._finalizer = _Open()  # the ring's finalizer once allocated; .alive False once closed
        self._next = 0
        self.check_rows_max = _check_rows_max(device)
        # Every kernel loaded now, not by a swap (a load may wait for the whole GPU).
        kernels.load_all(device, abi.check_shared_bytes(self.check_rows_max))

    def _ring(self) -> list:
        """The descriptor ring's slots, allocated on first use (under the
        launcher's lock, in relaxed capture mode)."""
        slots = self._slots
        if slots is None:
            slots = self._allocate_ring()
        return slots

    def _allocate_ring(self) -> list:
        with self._lock, capture.relaxed():  # legal while another thread captures
            if self._slots is not None:
                return self._slots
            if not self._finalizer.alive:
                raise RuntimeError("swap: the BlockSwapper that made this object is closed")
            device, size = self.device, self._ring_size
            row_bytes = self.slot_words * 8
            host = memory.zeros_pinned_for_gpu((size, self.slot_words), np.int64, device)
            # Device copies of the descriptors: cudaMalloc'd, not from CuPy's
            # stream-ordered pool, and written only by uploads on the stream of
            # the swap that reads them (nothing to zero first).
            dev = release.device_malloc(size * row_bytes, device)
            free = functools.partial(_free_launcher, dev, device)
            try:
                slots = [_Slot(host[i], dev + i * row_bytes) for i in range(size)]
            except BaseException:
                release.defer(free, None, "descriptor ring")
                raise
            # Dropped or closed: the releaser frees the ring once the last swap
            # that read each slot has completed (the host words go with the slots).
            wait = functools.partial(_wait_for_slots, slots)
            self._finalizer = release.when_dropped(self, free, wait, f"descriptor ring of GPU {device}")
            self._slots = slots
        return slots

    def close(self) -> None:
        """Hand the rings to the releaser (freed after the swaps that read them)."""
        with self._lock:
            self._finalizer()
        self.slots.close()

    # ---------------------------------------------------------- functions
    def function(self, name: str) -> int:
        """``CUfunction`` of kernel ``name`` on this GPU (loaded, and allowed
        the dynamic shared memory of a check of :attr:`check_rows_max` rows,
        when the launcher was made: :func:`.kernels.load_all`)."""
        return kernels.get_function(self.device, name)  # a dict lookup: no CUDA call on the hot path

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

    def bind(self, layout) -> BoundKernel:
        """The kernel launches of a resolved layout."""
        return BoundKernel(self, layout)

    def launch_kernel(
        self, fn: int, grid: int, threads: int, stream: int, params: int, smem: int = 0
    ) -> None:
        self._launch(fn, grid, 1, 1, threads, 1, 1, smem, stream, params, 0)

    # --------------------------------------------------------- descriptors
    def write_slot(self, layout, mapping, stream: int, held: list) -> abi.DescriptorArgs:
        """Write an unchecked descriptor into a free ring slot (locked and
        appended to ``held``) and upload it on ``stream``; returns the
        arguments that point the kernel at its device copy."""
        slot = self.acquire(held)
        fresh_table = slot.table_serial != layout.serial
        slot.table_serial = None  # until the write completes: an interrupted one marks no table current
        end = abi.write_descriptor(slot.host_words, layout, mapping, fresh_table)
        slot.table_serial = layout.serial
        self.upload(slot, slot.device_ptr, end, stream)
        return slot.device_args

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
        slots = self._ring()
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
