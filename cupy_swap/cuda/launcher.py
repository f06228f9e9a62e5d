"""Launch the swap kernel over a slot of the row ring.

Every kernel swap is a **slot** launch (:class:`BoundKernel`): the call's
rows (or where its GPU rows are) and its count, status and number go into a
slot of the :class:`~.slots.SlotRing`; the op launches the kernel with a
parameter made once for that slot (it points at the slot's device alias),
so a call writes no parameter.  A swap captured by a call on a capturing
stream gets words of its own, kept for the process, and a plain launch the
capture records.  Staged chunks launch through the same ring
(:mod:`cupy_swap.staged.stager`), graph swaps through a captured swap
(:mod:`cupy_swap.graphs`).  Where pinned memory cannot be mapped no kernel
reads host rows: those swaps take the copy engines (the layout's
``kernel_ok`` is False).
"""

from __future__ import annotations

import threading

import numpy as np

from . import abi, capture, kernels, memory, release

_SHARED_OPTIN = 97  # cudaDevAttrMaxSharedMemoryPerBlockOptin
_STATIC_SHARED = 16 << 10  # above the kernels' own (12.4 KiB: the 256-part kernel's part table)


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


class BoundKernel:
    """The kernel launches of one resolved layout, for any mapping: a ring
    slot's (:meth:`launch_slot`) or a captured launch (:meth:`launch_captured`).

    A slot launch is one ``cuLaunchKernel`` of a parameter made once per op
    and slot (pointing at that slot's words), so a call sets nothing: no
    graph is built on the hot path (a lazily built graph per slot once held
    a call for the whole of a busy stream's queue: NOTES item 61)."""

    __slots__ = ("__weakref__", "_launcher", "layout", "_args", "_slot_calls", "_lock")

    def __init__(self, launcher: Launcher, layout):
        self._launcher = launcher
        self.layout = layout
        self._args = None  # abi.ByRefArgs, built (and the module compiled) on the first launch
        self._slot_calls: list = [None] * launcher.slots.size  # per ring slot: its launch (_for_slot)
        self._lock = threading.Lock()

    def _byref(self) -> abi.ByRefArgs:
        args = self._args
        if args is None:  # raises where this CUDA has no kernel for as many parts, saying why
            args = self._args = self._launcher.byref_args(self.layout)
        return args

    def launch_slot(self, i: int, stream: int) -> None:
        """Launch over ring slot ``i`` (its control record and rows) on
        ``stream``."""
        if (call := self._slot_calls[i]) is None or call[0] != self._launcher.max_ctas:
            call = self._for_slot(i)
        self._launcher._launch(call[1], call[2], 1, 1, call[3], 1, 1, call[4], stream, call[5].ptr, 0)

    def _for_slot(self, i: int) -> tuple:
        """Slot ``i``'s launch for this CTA budget: ``(max_ctas, function,
        grid, threads, shared bytes, parameter)`` (a swap reads at most
        ``capacity`` rows; CTAs past a short swap's rows return at once)."""
        lau = self._launcher
        ring = lau.slots
        with self._lock:
            grid, threads = launch_shape(ring.capacity * self.layout.units_per_pair, lau.max_ctas)
            smem = abi.check_shared_bytes(min(ring.capacity, lau.check_rows_max))
            args = self._byref().copy()
            rows = ring.aliases[i] + 8 * abi.CONTROL_WORDS
            args.set(ring.capacity, 0, 0, rows, rows + 8, 2, ring.aliases[i], ring.arrivals[i])
            call = self._slot_calls[i] = (lau.max_ctas, args.fn, grid, threads, smem, args)
        return call

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


class Launcher:
    """Kernel functions, launch shapes and the slot ring (``ring_size``
    slots of ``max_blocks`` rows) of one swapper's GPU ``device``;
    ``max_ctas`` is one swap's CTA budget."""

    def __init__(self, device: int, max_blocks: int, ring_size: int, max_ctas: int):
        from cupy.cuda import driver

        from .slots import SlotRing

        self.device = device
        self.max_ctas = max_ctas
        self._launch = driver.launchKernel
        self._takes: dict = {}  # kernel_takes' answers, by parts tier
        self.slots = SlotRing(device, ring_size, max_blocks)
        # Slot launches need the ring mapped into the GPU's address space.
        self.slots_ok = self.slots.mapped
        self.check_rows_max = _check_rows_max(device)
        # Every kernel loaded now, not by a swap (a load may wait for the whole GPU).
        kernels.load_all(device, abi.check_shared_bytes(self.check_rows_max))

    def close(self) -> None:
        """Hand the ring to the releaser (freed after the swaps that read it)."""
        self.slots.close()

    # ---------------------------------------------------------- functions
    def function(self, name: str) -> int:
        """``CUfunction`` of kernel ``name`` on this GPU (loaded, and allowed
        the dynamic shared memory of a check of :attr:`check_rows_max` rows,
        when the launcher was made: :func:`.kernels.load_all`)."""
        return kernels.get_function(self.device, name)  # a dict lookup: no CUDA call on the hot path

    def kernel_takes(self, parts: int) -> bool:
        """True when this CUDA has a slot kernel for ``parts`` parts (the
        largest tier needs parameters over 4 KiB: CUDA 12.1 or later)."""
        tier = next((p for p in abi.BYREF_PARTS if p >= parts), None)
        found = self._takes.get(tier)
        if found is None:
            with capture.relaxed():  # may compile and load the module
                found = tier is not None and kernels.has_function(self.device, abi.byref_kernel(16, tier))
            self._takes[tier] = found
        return found

    def byref_args(self, layout) -> abi.ByRefArgs:
        """The parameter of ``layout``'s launches.

        Raises
        ------
        ValueError
            More parts than this CUDA's by-reference kernels take."""
        parts = len(layout.src)
        if not self.kernel_takes(parts):
            raise ValueError(
                f"src: the kernel takes at most {abi.BYREF_PARTS[-2]} parts with this CUDA (more need "
                f"kernel parameters over 4 KiB: CUDA 12.1 or later), got {parts}"
            )
        tier = next(p for p in abi.BYREF_PARTS if p >= parts)
        return abi.ByRefArgs(tier, layout, self.function(abi.byref_kernel(layout.width, tier)))

    def bind(self, layout) -> BoundKernel:
        """The kernel launches of a resolved layout."""
        return BoundKernel(self, layout)

    def launch_kernel(
        self, fn: int, grid: int, threads: int, stream: int, params: int, smem: int = 0
    ) -> None:
        self._launch(fn, grid, 1, 1, threads, 1, 1, smem, stream, params, 0)
