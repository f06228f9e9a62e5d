"""Swaps inside CUDA graphs whose mapping changes on every replay.

A :class:`GraphSwap` fixes the parts and owns a descriptor buffer in device
memory at a fixed address.  :meth:`launch`, the piece you capture, is one
kernel launch that reads the pair count and pairs from that buffer when it
runs (its grid is sized for ``max_blocks``).  Between replays,
:meth:`set_mapping` checks the mapping, writes it into a free slot of the
swapper's pinned descriptor ring and enqueues that slot's upload into the
buffer on ``stream``: stream-ordered, after every replay already queued there
and before the next one.  Replay on the stream you pass to ``set_mapping``.

The buffer is freed once the work queued on it has completed when the
GraphSwap is closed or dropped; once :meth:`launch` was captured, it (and
the ``src`` and ``dst`` arrays) is kept for the life of the process.
"""

from __future__ import annotations

import functools
import threading

from ..api_types import Mapping, Stream
from ..core.mapping import check_mapping_for
from ..cuda import capture, release
from ..cuda.abi import descriptor_words
from ..cuda.streams import (
    enqueue_and_wait,
    on_device,
    stream_is_capturing,
    stream_on_device,
    torch_stream_getter,
)


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

    def __init__(self, launcher, layout, held: tuple, max_blocks: int, torch_parts: bool = False):
        if not layout.kernel_ok:
            raise ValueError(
                "src, dst: graph swaps run the kernel, which needs host memory mapped into the GPU's "
                "address space; this system cannot map it (see `python -m cupy_swap info`)"
            )
        self._launcher = launcher
        self.device = launcher.device
        self.layout = layout
        self.max_blocks = max_blocks
        nbytes = descriptor_words(len(layout.src), max_blocks) * 8
        # The caller's arrays live as long as the descriptor: once a launch was
        # captured, a replay may write them at any time, so both are kept.
        self._state = _DescriptorState(release.device_malloc(nbytes, self.device), self.device, held)
        self._finalizer = release.finalizer(self, _drop_descriptor, self._state)
        # Launches, mapping uploads and close() one at a time: close() then
        # sees every event (or the capture) of the work queued on the buffer.
        self._lock = threading.Lock()
        # Zero pairs until the first set_mapping, written and finished before
        # any stream can use the buffer (so no stream ordering is needed).
        from cupy.cuda import runtime

        ptr = self._state.ptr
        enqueue_and_wait(self.device, lambda stream: runtime.memsetAsync(ptr, 0, nbytes, stream))
        with on_device(self.device):
            self._fn, self._grid, self._threads, self._args = launcher.replay_args(
                layout, self._state.ptr, max_blocks
            )
        self.num_pairs = 0
        # Torch parts: torch's current stream by default, as prepared ops do.
        self._default_stream = torch_stream_getter(self.device) if torch_parts else None

    def close(self) -> None:
        """Give the descriptor buffer back once the work queued on it has
        completed (kept for good if a launch was captured).  The object
        cannot be used afterwards."""
        with self._lock:
            self._finalizer()

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
        with self._lock, on_device(self.device):
            state = self._live_state("set_mapping")
            handle = self._stream(stream)
            if stream_is_capturing(handle):
                raise RuntimeError(
                    "set_mapping: expected a stream that is not capturing; stage the mapping before "
                    "replaying the graph, and capture only launch()"
                )
            layout = self.layout
            event = self._launcher.stage_descriptor(layout, mapping, state.ptr, handle)
            state.note(event)
        self.num_pairs = int(mapping.shape[0])
        return event

    def launch(self, *, stream: Stream = None) -> None:
        """Enqueue the swap kernel on ``stream``: the call to capture.  Reads
        the pair count and pairs staged by the last :meth:`set_mapping` that
        precedes it on the stream (default stream: as for ``set_mapping``)."""
        import cupy

        with self._lock, on_device(self.device):
            state = self._live_state("launch")
            handle = self._stream(stream)
            capturing = stream_is_capturing(handle)
            event = None if capturing else capture.new_event()
            self._launcher.launch_kernel(self._fn, self._grid, self._threads, handle, self._args.ptr)
            if capturing:
                state.captured = True  # a graph reads the buffer from now on
            else:
                cupy.cuda.runtime.eventRecord(event.ptr, handle)
                state.note(event)

    def _stream(self, stream) -> int:
        if stream is None and self._default_stream is not None:
            return self._default_stream()
        return stream_on_device(stream, self.device)

    def _live_state(self, method: str) -> _DescriptorState:
        if not self._finalizer.alive:
            raise RuntimeError(f"{method}: this GraphSwap is closed")
        return self._state


class _DescriptorState:
    """A GraphSwap's descriptor buffer and what gates its release: the events
    of uploads and launches that may not have completed (not one per stream:
    a destroyed stream's handle can come back as another's), and whether a
    launch was captured (then neither it nor the arrays ``held`` are freed)."""

    __slots__ = ("ptr", "device", "events", "captured", "held")

    def __init__(self, ptr: int, device: int, held: tuple):
        self.ptr, self.device, self.held = ptr, device, held
        self.events: list = []
        self.captured = False

    def note(self, event) -> None:
        """Keep ``event`` as a gate; drop the ones that completed."""
        if len(self.events) >= 16:
            self.events = [e for e in self.events if not capture.event_done(e)]
        self.events.append(event)


def _drop_descriptor(state: _DescriptorState) -> None:
    """Finalizer (may run inside any code: only enqueues)."""
    if state.captured:
        release.keep_for_process(state)
        return
    events = list(state.events)
    release.defer(
        functools.partial(release.device_free, state.ptr, state.device),
        functools.partial(_wait_all, events),
        f"graph-swap descriptor on GPU {state.device}",
    )


def _wait_all(events: list) -> None:
    for event in events:
        event.synchronize()
