"""Swaps inside CUDA graphs whose mapping changes on every replay.

A :class:`GraphSwap` fixes the parts (``src``/``dst`` arrays) and owns one
descriptor buffer in device memory at a fixed address.  :meth:`launch` is
the piece you capture: one kernel launch whose arguments point at that buffer
and which reads the pair count and the pairs from it when it runs (the grid
is sized for ``max_blocks``, so any N from 0 to ``max_blocks`` works).

Between replays the host calls :meth:`set_mapping`, which

1. checks the mapping (the same checks as ``swap``),
2. writes header, part table and pairs into a free slot of the swapper's
   pinned descriptor ring (a slot is reused only after the event behind its
   last use has completed, so no queued upload still reads it), and
3. enqueues the upload of that slot into the fixed device buffer on
   ``stream`` (:meth:`cupy_swap.cuda.launcher.Launcher.stage_descriptor`).

Because that upload is stream-ordered, it runs after every replay already
queued on ``stream`` and before the next one: the host never writes memory a
queued replay may still read.  Replay on the stream you pass to
``set_mapping`` (or order the two streams yourself).
"""

from __future__ import annotations

import numpy as np

from .core.mapping import check_mapping_for
from .cuda.abi import descriptor_words
from .cuda.streams import on_device, stream_is_capturing, stream_on_device

__all__ = ["GraphSwap"]


class GraphSwap:
    """A graph-capturable swap of fixed parts with a per-replay mapping.

    Made by :meth:`BlockSwapper.graph_swap`.

    Parameters
    ----------
    launcher : cupy_swap.cuda.launcher.Launcher
        The swapper's launcher: kernel functions, launch shape, descriptor ring.
    layout : Layout
        The checked, resolved parts.  Host parts must be mapped pinned
        memory (the kernel path).
    held : tuple
        The caller's ``(src, dst)``, kept alive.
    max_blocks : int
        Most pairs one replay may carry.

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

    def __init__(self, launcher, layout, held: tuple, max_blocks: int):
        import cupy

        if not layout.kernel_ok:
            raise ValueError(
                "src, dst: graph swaps run the kernel, which needs host memory mapped into the GPU's "
                "address space; this system cannot map it (see `python -m cupy_swap info`)"
            )
        self._launcher = launcher
        self.device = launcher.device
        self.layout = layout
        self.max_blocks = max_blocks
        self._held = held  # the caller's arrays live as long as the graph swap
        with cupy.cuda.Device(self.device):
            self._desc = cupy.zeros(descriptor_words(len(layout.src), max_blocks), dtype=np.int64)
            self._fn, self._grid, self._threads, self._args = launcher.replay_args(
                layout, self._desc.data.ptr, max_blocks
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
        mapping = check_mapping_for(self.layout, block_mapping, self.max_blocks)
        with on_device(self.device):
            handle = stream_on_device(stream, self.device)
            if stream_is_capturing(handle):
                raise RuntimeError(
                    "set_mapping: expected a stream that is not capturing; stage the mapping before "
                    "replaying the graph, and capture only launch()"
                )
            layout = self.layout
            event = self._launcher.stage_descriptor(
                layout.table, layout.units_per_pair, mapping, self._desc.data.ptr, handle
            )
        self.num_pairs = int(mapping.shape[0])
        return event

    def launch(self, *, stream=None):
        """Enqueue the swap kernel on ``stream``: the call to capture.  Reads
        the pair count and pairs staged by the last :meth:`set_mapping` that
        precedes it on the stream."""
        with on_device(self.device):
            handle = stream_on_device(stream, self.device)
            self._launcher.launch_kernel(self._fn, self._grid, self._threads, handle, self._args.ptr)
