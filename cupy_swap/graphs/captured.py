"""A swap captured into your own CUDA graph that copies, on every replay,
the rows your kernels chose in that replay.

A :class:`CapturedSwap` (made by :meth:`PreparedSwap.captured`) owns, at
fixed device addresses, a row buffer (``rows``, shape ``(max_rows, 2)``),
a row count (``count``, a 0-d array) and a completion word; or it reads
your own rows and count buffers, at their addresses (``rows=``,
``count=``: the count is copied into its record right before each
launch, by a memcpy captured with it).  Capture
:meth:`launch` once on your stream; in each replay, kernels before it write
``count`` and the first ``count`` rows, and the swap reads them when the
replay reaches it:

* every row is checked on the GPU (bounds, a destination twice); a bad
  replay writes no byte, and its verdict (the replay's number, the first
  bad row and value) lands in a pinned ring of failures that
  :meth:`failures` reads afterwards, each once, with no host work inside
  the graph (good replays write no verdict, so they never push a failure
  out; more than ``ring`` failures between two reads are reported lost);
* rows whose source or destination is -1 are padding (as SGLang pads its
  CUDA-graph batches): skipped, not errors;
* kernels after the swap on the same stream see its blocks; the
  completion word (``done_ptr``, int64) holds the number of the last
  replay whose copy finished: another stream can wait for it on the GPU
  (:meth:`wait_done`, ``cuStreamWaitValue64``).

Nothing is allocated while you capture (everything is made by
:meth:`PreparedSwap.captured`).  A replay may run whenever a graph that
captured the swap is launched, so its buffers and the op's arrays are kept
for the life of the process.  Replays of one captured swap run one after
another (each numbers itself from the last one's number), not concurrently.
"""

from __future__ import annotations

import threading

import numpy as np

from ..api_types import Stream
from ..cuda import abi, capture, memory, pools, release
from ..cuda.driver import stream_wait_geq
from ..cuda.gpu_mapping import device_rows, device_word
from ..cuda.launcher import launch_shape
from ..cuda.streams import enqueue_and_wait, on_device, stream_is_capturing, stream_on_device
from .replay_verdicts import ReplayVerdicts, ring_words

_H2D, _D2D = 1, 3


class CapturedSwap:
    """See the module docstring.

    Attributes
    ----------
    rows : cupy.ndarray of int64, shape (max_rows, 2)
        ``(src_block, dst_block)`` rows a replay reads (write them before the
        swap in the same replay).
    count : cupy.ndarray of int64, shape ()
        How many of ``rows`` a replay copies, 0 to ``max_rows``.
    done_ptr : int
        Device address of the completion word (int64).
    max_rows, ring : int
    """

    def __init__(self, op, max_rows: int, ring: int, alloc=None, rows=None, count=None, checked=True):
        sw = op._swapper
        decided = op._decided
        # The pools of its host memory, held from here on (before anything is
        # allocated, so a drop meanwhile raises here instead of being missed).
        keep_pinned = pools.owners(decided.layout)
        # checked=False (GraphSwap's rows, checked on the host): no verdict, no check table.
        limit = min(sw.max_blocks, sw._launcher.check_rows_max) if checked else sw.max_blocks
        if type(max_rows) is not int or not 1 <= max_rows <= limit:
            raise ValueError(
                f"max_rows: expected an int from 1 to {limit} (max_blocks, and the rows one launch can check), "
                f"got {max_rows!r}"
            )
        if type(ring) is not int or ring < 1:
            raise ValueError(f"ring: expected an int >= 1 (replay verdicts kept until read), got {ring!r}")
        if checked and not decided.launch_checks:
            raise ValueError(
                "captured(): a captured swap is checked on the GPU in every replay, which this op cannot do "
                "(host memory that cannot be mapped, parts that may share bytes, 2**32 - 1 or more blocks); "
                "use graph_swap() and set_mapping() instead"
            )
        their_rows = None if rows is None else _their_rows(rows, sw.device, max_rows)
        their_count = None if count is None else device_word(count, sw.device, "count")
        self._op, self._layout = op, decided.layout
        self.max_rows, self.ring = max_rows, ring
        lau = sw._launcher
        with on_device(sw.device), capture.relaxed():
            # One device allocation: control record, rows, the CTA count.
            words = abi.CONTROL_WORDS + 2 * max_rows + 1
            base = (alloc or release.device_malloc)(8 * words, sw.device)
            release.keep_for_process(base)  # a replay may run at any time: never freed
            verdicts = memory.zeros_pinned_for_gpu(ring_words(ring), np.int64, sw.device)
            release.keep_for_process(verdicts)
            alias = memory.host_alias(verdicts.ctypes.data, verdicts.nbytes)
            control = np.zeros(words, np.int64)  # count 0, seq 0, done 0, rows at the parameter's addresses
            control[1], control[6], control[7] = alias if checked else 0, 2, ring  # failure ring, step, size
            if their_rows is not None:  # the kernel reads the caller's rows where they are
                control[4:7] = their_rows.src, their_rows.dst, their_rows.step
            self._upload(base, control, sw.device)
        rows_at = base + 8 * abi.CONTROL_WORDS
        arrivals = rows_at + 16 * max_rows
        self._args = lau.byref_args(decided.layout).copy()
        self._args.set(max_rows, 0, 0, rows_at, rows_at + 8, 2, base, arrivals)
        self._grid, self._threads = launch_shape(max_rows * decided.layout.units_per_pair, lau.max_ctas)
        self._smem = abi.check_shared_bytes(max_rows) if checked else 0
        self._launcher = lau
        self._verdicts = ReplayVerdicts(ring, verdicts)
        self._pending: list = []  # found by check() and not raised yet
        self._read_lock = threading.Lock()  # each failure to one caller, once
        self.done_ptr = base + 24
        self._count_from = their_count  # copied into the record by each launch
        self._count_word = base
        self.rows = rows if rows is not None else _device_view(rows_at, (max_rows, 2), sw.device, self)
        self.count = count if count is not None else _device_view(base, (), sw.device, self)
        # What a replay reads or writes, at any time, and the pools that keep its host memory pinned.
        release.keep_for_process((op, rows, count, keep_pinned))

    @staticmethod
    def _upload(base: int, control: np.ndarray, device: int) -> None:
        """The control record into device memory, finished before it
        returns (a private stream: never the legacy one)."""
        from cupy.cuda import runtime

        enqueue_and_wait(
            device,
            lambda stream: runtime.memcpyAsync(base, control.ctypes.data, control.nbytes, _H2D, stream),
        )

    def launch(self, stream: Stream = None) -> None:
        """Launch the swap on ``stream`` (capture it there once): it copies
        ``count`` rows of ``rows`` as they are when it runs.  No allocation,
        no host check, no event."""
        sw = self._op._swapper
        if sw._closed:
            raise RuntimeError("launch: the BlockSwapper of this captured swap is closed; make a new one")
        with on_device(sw.device):
            handle = self._handle(stream)
            if self._count_from is not None:  # the caller's count, read when the replay gets here
                from cupy.cuda import runtime

                runtime.memcpyAsync(self._count_word, self._count_from, 8, _D2D, handle)
            args = self._args
            self._launcher._launch(
                args.fn, self._grid, 1, 1, self._threads, 1, 1, self._smem, handle, args.ptr, 0
            )

    def wait_done(self, stream: Stream, replay: int) -> None:
        """Make ``stream``, a stream outside the graph, wait on the GPU until
        the completion word reaches ``replay``: replay number ``replay`` or
        a later one has finished, copied its rows or, when its check failed,
        copied nothing (:meth:`failures` says which).  ``cuStreamWaitValue64``
        on the completion word, no host involved.  Replays are numbered from 1
        in the order the swap's kernel runs (every launch of a graph that
        captured it, and every eager :meth:`launch`, is one).  The GPU waits
        with no deadline: a replay that is never launched holds ``stream``
        for good, so wait only for replays already launched.  Inside the
        graph, join streams with a captured event instead: a captured wait
        would keep this ``replay`` for every launch of the graph (refused).
        Default-stream semantics of ``stream=None`` as in :meth:`launch`."""
        if type(replay) is not int or not 1 <= replay < 1 << 63:
            raise ValueError(
                f"replay: expected an int from 1 to 2**63 - 1 (replays are numbered from 1), got {replay!r}"
            )
        sw = self._op._swapper
        with on_device(sw.device):
            handle = self._handle(stream)
            if stream_is_capturing(handle):
                raise ValueError(
                    "stream: expected a stream that is not capturing (a captured wait would wait for this "
                    "replay number in every launch of the graph); inside the graph, join streams with a "
                    "captured event"
                )
            stream_wait_geq(handle, self.done_ptr, replay)

    def _handle(self, stream) -> int:
        """The raw handle of a ``stream=`` argument; None: torch's current
        stream for an op over torch tensors, else CuPy's current stream."""
        sw = self._op._swapper
        if stream is not None:
            return stream_on_device(stream, sw.device)
        if self._op._decided.default_stream is not None:
            return self._op._decided.default_stream()
        return sw._current_stream().ptr

    def failures(self) -> list[Exception]:
        """The failures of the replays that finished since the last call,
        oldest first, each once (``IndexError`` or ``ValueError`` naming the
        replay (``exc.replay``), the row and the block; ``RuntimeError`` for
        replays whose verdicts were overwritten before they were read)."""
        with self._read_lock:
            found, self._pending = self._pending + self._verdicts.failures(self._layout), []
        return found

    def check(self) -> None:
        """Raise the oldest failure :meth:`failures` finds; the others wait
        for the next call of either."""
        with self._read_lock:
            found = self._pending + self._verdicts.failures(self._layout)
            self._pending = found[1:]
        if found:
            raise found[0]


def _their_rows(rows, device: int, max_rows: int):
    """Where the caller's rows are (:class:`~cupy_swap.cuda.gpu_mapping.DeviceRows`):
    an int64 ``(N, 2)`` GPU array or two 1-D ones, ``N >= max_rows``."""
    try:
        found = device_rows(rows, device, 1 << 62)
    except (TypeError, ValueError) as e:
        raise type(e)(str(e).replace("block_mapping:", "rows:", 1)) from None
    if found is None:
        raise TypeError(
            "rows: expected an int64 GPU array of shape (max_rows, 2) or a tuple of two 1-D ones (CuPy or "
            f"torch), got {type(rows).__name__}"
        )
    if found.n < max_rows:
        raise ValueError(f"rows: expected at least max_rows={max_rows} rows, got {found.n}")
    return found


def _device_view(ptr: int, shape: tuple, device: int, owner):
    """A CuPy int64 array over device memory the library owns."""
    import cupy

    nbytes = 8 * int(np.prod(shape, dtype=np.int64))
    mem = cupy.cuda.UnownedMemory(ptr, max(nbytes, 8), owner, device)
    return cupy.ndarray(shape, cupy.int64, cupy.cuda.MemoryPointer(mem, 0))
