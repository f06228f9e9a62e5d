"""Swaps inside CUDA graphs whose mapping changes on every replay.

A :class:`GraphSwap` fixes the parts (``src``/``dst`` arrays) and owns one
descriptor buffer in device memory at a fixed address.  :meth:`launch` is
the piece you capture: one kernel launch whose arguments point at that buffer
and which reads the pair count and the pairs from it when it runs (the grid
is sized for ``max_blocks``, so any N from 0 to ``max_blocks`` works).

Between replays the host calls :meth:`set_mapping`, which

1. checks the mapping (the same checks as ``swap``),
2. writes header, part table and pairs into a free slot of the swapper's
   pinned staging ring (a slot is reused only after the event behind its
   last use has completed, so no queued copy still reads it), and
3. enqueues one ``cudaMemcpyAsync`` from that slot into the fixed device
   buffer on ``stream``.

Because that copy is stream-ordered, it runs after every replay already
queued on ``stream`` and before the next one: the host never writes memory a
queued replay may still read.  Replay on the stream you pass to
``set_mapping`` (or order the two streams yourself).
"""

from __future__ import annotations

import numpy as np

from . import kernels
from .descriptor import descriptor_words, write_descriptor
from .driver import stream_is_capturing
from .interop import on_device, stream_on_device
from .plan import check_mapping_for

__all__ = ["GraphSwap"]


class GraphSwap:
    """A graph-capturable swap of fixed parts with a per-replay mapping.

    Parameters
    ----------
    swapper : BlockSwapper
        Supplies the device, the limits, the staging ring and the launch
        shape.
    src, dst : array or sequence of arrays
        The parts, as for :meth:`BlockSwapper.swap`.  Host parts must be
        mapped pinned memory (the kernel path).

    Examples
    --------
    >>> gs = sw.graph_swap(host_cache, gpu_cache)
    >>> stream = cupy.cuda.Stream(non_blocking=True)
    >>> gs.set_mapping([], stream=stream)          # N = 0 while capturing
    >>> stream.begin_capture()
    >>> gs.launch(stream=stream)
    >>> graph = stream.end_capture()
    >>> for mapping in step_mappings:
    ...     gs.set_mapping(mapping, stream=stream)
    ...     graph.launch(stream)
    """

    def __init__(self, swapper, src, dst):
        import cupy

        self.swapper = swapper
        with on_device(swapper.device):  # DLPack conversion and pointer queries act on it
            self.layout = swapper._layout(src, dst)
        if any(a is None for a in self.layout.src_addrs + self.layout.dst_addrs):
            raise ValueError(
                "src, dst: graph swaps run the kernel, which needs host memory mapped into the GPU's "
                "address space; this system cannot map it (see `python -m cupy_swap info`)"
            )
        self._held = (src, dst)
        parts = len(self.layout.src)
        with cupy.cuda.Device(swapper.device):
            self._desc = cupy.zeros(descriptor_words(parts, swapper.max_blocks), dtype=np.int64)
        from .swapper import _KernelArgs  # the swapper's argument packing

        self._args = _KernelArgs(self._desc.data.ptr)
        self._args.set(parts, self.layout.units_per_pair, -1)  # -1: count from the buffer
        self._grid, self._threads = swapper._launch_shape(swapper.max_blocks * self.layout.units_per_pair)
        self._fn = kernels.get_function(
            swapper.device, self.layout.width, swapper.unroll, swapper.kernel_defines
        )
        self.num_pairs = 0

    def set_mapping(self, block_mapping, *, stream=None):
        """Stage ``block_mapping`` for the next launch or replay on ``stream``.

        Parameters
        ----------
        block_mapping : array-like of shape (N, 2)
            ``(src_block, dst_block)`` rows, ``0 <= N <= max_blocks``.
        stream : cupy.cuda.Stream, torch.cuda.Stream or int, optional
            The stream the graph is replayed on; CuPy's current stream by
            default.  Must not be capturing.

        Returns
        -------
        cupy.cuda.Event
            Recorded after the staging copy.
        """
        sw = self.swapper
        mapping = check_mapping_for(self.layout, block_mapping, sw.max_blocks)
        with on_device(sw.device):
            handle = stream_on_device(stream, sw.device)
            if stream_is_capturing(handle):
                raise RuntimeError(
                    "set_mapping: expected a stream that is not capturing; stage the mapping before "
                    "replaying the graph, and capture only launch()"
                )
            event = sw._cupy_event(disable_timing=True)
            held: list = []
            recorded = False
            try:
                slot = sw._acquire(held)
                words = write_descriptor(slot.host_words, self.layout, mapping, True)
                slot.table_serial = -1  # the slot now holds this descriptor, not a cached one
                sw._upload(slot, self._desc.data.ptr, words, handle)
                sw._runtime.eventRecord(event.ptr, handle)
                recorded = True
            finally:
                sw._release(held, event if recorded else None, handle)
        self.num_pairs = int(mapping.shape[0])
        return event

    def launch(self, *, stream=None):
        """Enqueue the swap kernel on ``stream``: the call to capture.  Reads
        the pair count and pairs staged by the last :meth:`set_mapping` that
        precedes it on the stream."""
        with on_device(self.swapper.device):
            handle = stream_on_device(stream, self.swapper.device)
            self.swapper._driver.launchKernel(
                self._fn, self._grid, 1, 1, self._threads, 1, 1, 0, handle, self._args.ptr, 0
            )
