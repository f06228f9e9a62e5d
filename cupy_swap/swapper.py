"""``BlockSwapper``: one kernel launch moves every block of every part.

Each swap writes a descriptor (header, part table, mapping; see
``descriptor.py``) into a slot of a ring of pinned staging buffers, copies it
to the slot's fixed device buffer with one ``cudaMemcpyAsync`` and launches
one kernel that reads it.  Buffers are allocated once, so their addresses
never move.  The host only rewrites a slot after the event recorded behind
the slot's last launch has completed; with ``ring_size`` slots that is only a
wait when more than ``ring_size`` swaps are still queued on the GPU.
"""

from __future__ import annotations

import ctypes

import numpy as np

from . import kernels, memory
from .descriptor import MAX_PARTS, descriptor_words, write_descriptor
from .interop import stream_handle
from .plan import GPU_TO_GPU, IN, OUT, check_swap, resolve_plan

__all__ = ["BlockSwapper", "DEFAULT_MAX_CTAS", "DEFAULT_UNROLL"]

DEFAULT_MAX_CTAS = 16
DEFAULT_UNROLL = 4
_H2D = 1  # cudaMemcpyHostToDevice


class _Slot:
    """One ring entry: pinned staging words, their device copy, the packed
    kernel argument, and the event behind the last launch that read them."""

    def __init__(self, host_words: np.ndarray, device_ptr: int):
        self.host_words = host_words
        self.host_ptr = host_words.ctypes.data
        self.device_ptr = device_ptr
        self.params_ptr, self._keep = _pack_pointer_arg(device_ptr)
        alias = memory.host_alias(self.host_ptr, host_words.nbytes)
        # Kernel argument that reads the descriptor straight from pinned memory.
        self.alias_params_ptr, self._keep_alias = _pack_pointer_arg(alias)
        self.event = None


def _pack_pointer_arg(ptr: int):
    """``void**`` kernel-parameter array holding one pointer argument, and the
    ctypes objects that must stay alive while it is used."""
    arg = ctypes.c_uint64(ptr)
    params = (ctypes.c_void_p * 1)(ctypes.addressof(arg))
    return ctypes.addressof(params), (arg, params)


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
        Default 16.
    max_parts : int, optional
        Most parts (arrays per side) one swap may carry. Default 256, the
        kernel's limit.
    ring_size : int, optional
        Descriptor slots; swaps beyond this many still queued make ``swap``
        wait for the oldest. Default 16.

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
    ):
        import cupy

        self.max_blocks = _positive_int(max_blocks, "max_blocks")
        self.max_ctas = DEFAULT_MAX_CTAS if max_ctas is None else _positive_int(max_ctas, "max_ctas")
        self.max_parts = _positive_int(max_parts, "max_parts")
        if self.max_parts > MAX_PARTS:
            raise ValueError(f"max_parts: expected at most {MAX_PARTS} (the kernel's limit), got {max_parts}")
        ring_size = _positive_int(ring_size, "ring_size")
        if device is None:
            device = cupy.cuda.runtime.getDevice()
        self.device = int(device)
        self.unroll = DEFAULT_UNROLL
        self.max_threads = kernels.max_threads(self.unroll)
        # Where the kernel reads the descriptor: a device copy made by one
        # small cudaMemcpyAsync (False) or pinned host memory via its alias.
        self.descriptor_from_host = False
        self.ring_waits = 0  # times swap() had to wait for a slot (ring full)

        self.slot_words = descriptor_words(self.max_parts, self.max_blocks)
        with cupy.cuda.Device(self.device):
            self._host = memory.empty_pinned((ring_size, self.slot_words), np.uint64)
            self._dev = cupy.empty((ring_size, self.slot_words), dtype=np.uint64)
        row_bytes = self.slot_words * 8
        self._slots = [_Slot(self._host[i], self._dev.data.ptr + i * row_bytes) for i in range(ring_size)]
        self._next = 0

    # ------------------------------------------------------------------ API
    def swap(self, src, dst, block_mapping, *, stream=None):
        """Copy block ``s`` of each ``src`` part to block ``d`` of the matching
        ``dst`` part for every row ``(s, d)`` of ``block_mapping``, in one
        kernel launch on ``stream``.

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

        Returns
        -------
        cupy.cuda.Event
            Recorded on ``stream`` after the copy.

        Raises
        ------
        TypeError, ValueError, IndexError
            For any bad input, before anything is launched.
        """
        return self._swap(src, dst, block_mapping, stream, None)

    def swap_in(self, host_src, gpu_dst, block_mapping, *, stream=None):
        """:meth:`swap` that only accepts host -> GPU."""
        return self._swap(host_src, gpu_dst, block_mapping, stream, IN)

    def swap_out(self, gpu_src, host_dst, block_mapping, *, stream=None):
        """:meth:`swap` that only accepts GPU -> host."""
        return self._swap(gpu_src, host_dst, block_mapping, stream, OUT)

    # ------------------------------------------------------------ internals
    def plan(self, src, dst, block_mapping):
        """Check a swap and return its resolved :class:`~cupy_swap.plan.SwapPlan`
        without launching anything."""
        plan = check_swap(src, dst, block_mapping, max_blocks=self.max_blocks)
        if len(plan.src) > self.max_parts:
            raise ValueError(f"src: expected at most max_parts={self.max_parts} parts, got {len(plan.src)}")
        return resolve_plan(plan, self.device)

    def _swap(self, src, dst, block_mapping, stream, want):
        import cupy
        from cupy.cuda import driver, runtime

        plan = self.plan(src, dst, block_mapping)
        if want is not None and plan.direction != want:
            method = "swap_in" if want == IN else "swap_out"
            expected = "host -> GPU" if want == IN else "GPU -> host"
            got = {IN: "host -> GPU", OUT: "GPU -> host", GPU_TO_GPU: "GPU -> GPU"}[plan.direction]
            raise ValueError(f"{method}: expected {expected} arrays, got {got}; use swap() for that")
        handle = stream_handle(stream)
        event = cupy.cuda.Event(disable_timing=True)
        prev = runtime.getDevice()
        if prev != self.device:
            runtime.setDevice(self.device)
        try:
            if plan.num_pairs:
                slot = self._acquire()
                words = write_descriptor(slot.host_words, plan, plan.width)
                if self.descriptor_from_host:
                    params = slot.alias_params_ptr
                else:
                    runtime.memcpyAsync(slot.device_ptr, slot.host_ptr, words * 8, _H2D, handle)
                    params = slot.params_ptr
                grid, threads = self._launch_shape(plan)
                fn = kernels.get_kernel(self.device, plan.width, self.unroll)
                driver.launchKernel(fn.kernel.ptr, grid, 1, 1, threads, 1, 1, 0, handle, params, 0)
                slot.event = event
            runtime.eventRecord(event.ptr, handle)
        finally:
            if prev != self.device:
                runtime.setDevice(prev)
        return event

    def _acquire(self) -> _Slot:
        slot = self._slots[self._next]
        self._next = (self._next + 1) % len(self._slots)
        if slot.event is not None and not slot.event.done:
            self.ring_waits += 1
            slot.event.synchronize()
        return slot

    def _launch_shape(self, plan) -> tuple[int, int]:
        """Grid and CTA size: at most ``max_ctas`` CTAs; small swaps spread
        their threads over as many CTAs as the budget allows (more SMs issue
        loads), large ones use full CTAs and grid-stride."""
        units = plan.num_pairs * (plan.bytes_per_pair // plan.width)
        cap = min(self.max_threads, kernels.max_threads(self.unroll))
        per_cta = -(-units // (self.unroll * self.max_ctas))
        threads = min(cap, max(32, -(-per_cta // 32) * 32))
        grid = min(self.max_ctas, -(-units // (threads * self.unroll)))
        return max(grid, 1), threads


def _positive_int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name}: expected a positive int, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name}: expected a positive int, got {value}")
    return int(value)
