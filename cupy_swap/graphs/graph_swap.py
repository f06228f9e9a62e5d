"""Swaps inside CUDA graphs whose mapping changes on every replay: a thin
adapter over :class:`~.captured.CapturedSwap`.

A :class:`GraphSwap` fixes the parts and owns, at fixed device addresses, a
row count and ``max_blocks`` rows that its captured swap reads when a replay
reaches it.  :meth:`launch`, the piece you capture, is the captured swap's
launch.  Between replays, :meth:`set_mapping` checks the mapping on the host,
writes count and rows into one half of a pinned double buffer and enqueues
their upload into the device rows on ``stream`` (a small kernel reading the
buffer's device alias: stream-ordered, after every replay already queued
there and before the next one).  Replay on the stream you pass to
``set_mapping``.

**Ownership.**  A half of the double buffer is rewritten only after the
event behind its last upload completed.  A replay may run whenever a graph
that captured :meth:`launch` is launched, so the device rows, the buffers
and the ``src`` and ``dst`` arrays are kept for the life of the process, as
a captured swap's are: make one GraphSwap per graph, not one per step.
"""

from __future__ import annotations

import threading

import numpy as np

from ..api_types import Mapping, Stream
from ..core.mapping import check_mapping_for
from ..cuda import abi, capture, memory, release
from ..cuda.streams import enqueue_and_wait, on_device, stream_is_capturing
from .captured import CapturedSwap, _device_view

_FETCH_MAX_CTAS = 16  # a 64 KiB upload is one round of 16-byte loads per thread


class GraphSwap:
    """A graph-capturable swap of fixed parts with a per-replay mapping.

    Made by :meth:`BlockSwapper.graph_swap`.

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

    def __init__(self, op, max_blocks: int):
        layout = op._decided.layout
        if not layout.kernel_ok:
            raise ValueError(
                "src, dst: graph swaps run the kernel, which needs host memory mapped into the GPU's "
                f"address space, but {layout.unmapped_reason} (see `python -m cupy_swap info`)"
            )
        sw = op._swapper
        self.device, self.layout, self.max_blocks = sw.device, layout, max_blocks
        words = 2 + 2 * max_blocks  # the count, a pad word, the rows
        with capture.relaxed():
            self._rows_at = release.device_malloc(8 * words, self.device)
            self._buffers = [memory.zeros_pinned_for_gpu(words, np.int64, self.device) for _ in range(2)]
            release.keep_for_process((self._rows_at, self._buffers))  # a replay may come at any time
        ptr = self._rows_at  # zero rows until the first set_mapping, landed before any stream reads them
        from cupy.cuda import runtime

        enqueue_and_wait(self.device, lambda stream: runtime.memsetAsync(ptr, 0, 8 * words, stream))
        self._uploads = [abi.FetchArgs(memory.host_alias(b.ctypes.data, b.nbytes)) for b in self._buffers]
        self._events: list = [None, None]  # behind each half's last upload
        self._next = 0
        self._launcher, self._record = sw._launcher, runtime.eventRecord
        # The rows are checked on the host (set_mapping): the replay copies them unchecked.
        count = _device_view(ptr, (), self.device, self)
        rows = _device_view(ptr + 16, (max_blocks, 2), self.device, self)
        self._swap = CapturedSwap(op, max_blocks, 1, rows=rows, count=count, checked=False)
        self._lock = threading.Lock()  # set_mapping and close one at a time
        self._closed = False
        self.num_pairs = 0

    def close(self) -> None:
        """Refuse further use (the buffers stay: a captured launch may replay)."""
        with self._lock:
            self._closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def set_mapping(self, block_mapping: Mapping, *, stream: Stream = None):
        """Stage ``block_mapping`` for the next launch or replay on ``stream``.

        Parameters
        ----------
        block_mapping : array-like of shape (N, 2)
            ``(src_block, dst_block)`` rows, ``0 <= N <= max_blocks``.
        stream : cupy.cuda.Stream, torch.cuda.Stream or int, optional
            The stream the graph is replayed on.  Default: torch's current
            stream when the parts are torch tensors, else CuPy's current
            stream.  Must not be capturing.

        Returns
        -------
        cupy.cuda.Event
            Recorded after the staging copy.
        """
        mapping = check_mapping_for(self.layout, block_mapping, self.max_blocks)
        n = int(mapping.shape[0])
        with self._lock, on_device(self.device):
            self._refuse_closed("set_mapping")
            handle = self._swap._handle(stream)
            if stream_is_capturing(handle):
                raise RuntimeError(
                    "set_mapping: expected a stream that is not capturing; stage the mapping before "
                    "replaying the graph, and capture only launch()"
                )
            k = self._next
            with capture.relaxed():  # legal while another thread captures
                if self._events[k] is not None:
                    self._events[k].synchronize()  # its last upload has read the half
                event = capture.new_event()
            words = self._buffers[k]
            words[0] = n
            words[2 : 2 + 2 * n] = mapping.reshape(-1)
            n16 = 1 + n  # 16-byte words: count and pad, then one row each
            grid = min(_FETCH_MAX_CTAS, -(-n16 // abi.FETCH_THREADS))
            params = self._uploads[k].set(self._rows_at, n16)
            lau = self._launcher
            lau.launch_kernel(lau.function(abi.FETCH_KERNEL), grid, abi.FETCH_THREADS, handle, params)
            self._record(event.ptr, handle)
            self._events[k], self._next = event, k ^ 1
        self.num_pairs = n
        return event

    def launch(self, *, stream: Stream = None) -> None:
        """Enqueue the swap on ``stream``: the call to capture.  Reads the
        count and rows staged by the last :meth:`set_mapping` that precedes
        it on the stream (default stream: as for ``set_mapping``)."""
        self._refuse_closed("launch")
        self._swap.launch(stream)

    def _refuse_closed(self, method: str) -> None:
        if self._closed:
            raise RuntimeError(f"{method}: this GraphSwap is closed")
