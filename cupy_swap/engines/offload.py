"""An offloading worker over prepared ops, engine-independent: the part of
:mod:`cupy_swap.engines.vllm` that knows no vLLM.

:class:`ChunkOffloadWorker` keeps, per KV cache tensor, a GPU page view
``(num_gpu_blocks, page_bytes)`` and a CPU chunk tensor ``(num_chunks,
blocks_per_chunk * page_bytes)``, and one prepared op per direction for each
set of groups that touch the same bytes (:func:`~.chunks.part_signatures`;
usually one op for everything).  A transfer's GPU blocks and chunks become
mapping rows (:func:`~.chunks.transfer_rows`) and one op call moves them for
every tensor at once.

* **Order.**  Each lane (stores, loads, expedited loads) has its own stream:
  its transfers run, and are reported by
  :meth:`~ChunkOffloadWorker.get_finished`, in submission order; an
  expedited load (one the engine waits for within its step) queues behind
  no regular load: its ops never stage (:func:`unstaged_op`), since the
  staged path's copy stream is one per swapper and direction.
  A transfer first waits for ``current_stream()``'s work (the compute that
  wrote the blocks a store reads, or that last used the blocks a load
  writes).
* **Verdicts.**  The op checks every row (the launch itself, for the kernel
  path) and copies nothing for a bad mapping; the transfer's result then has
  ``success=False``.  A spec whose lists do not add up fails the same way,
  before anything is launched.  A transfer of several calls (several ops,
  more rows than one call takes, or more parts than one op holds) has its
  rows' ranges checked on the host
  first, so a block out of range writes nothing there either.  Nothing is
  raised to the engine for a bad transfer: it is told by its result.
* **Results.**  ``make_result(job_id=, success=, transfer_size=,
  transfer_time=)``: bytes moved and seconds between two events around the
  transfer's calls (with an ``events`` kit) for a good transfer, None for
  both for a failed one, whose result also carries ``error`` (the text)
  where the class allows.
* **Events.**  With an ``events`` kit, the wait for the current stream and
  the timing use events the worker keeps and reuses once their transfer is
  reported.  Creating a CUDA event can wait behind other work of the GPU
  (about 950 ms behind another thread's release of pinned memory:
  benchmarks/NOTES.md, item 77), so the events of ``event_pool`` transfers
  are made with the worker, and a submit makes none while no more than that
  many transfers are unreported (beyond, it makes the next transfer's
  events, through the kit: relaxed, and real when made).  The kit must hand
  out events whose CUDA event exists (:class:`~.vllm.TorchEvents` records
  each once, since torch creates it at the first ``record()``): the worker's
  records on the transfer streams must create nothing.  Without a kit, the
  wait is the op's ``wait_for=`` and there is no timing.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import deque

import numpy as np

from ..cuda import capture
from .chunks import SpecError, merged_rows, out_of_range, part_signatures, transfer_rows

logger = logging.getLogger("cupy_swap.engines")

STORE, LOAD, EXPEDITED = "store", "load", "expedited load"  # the lanes, in get_finished's order
LANES = (STORE, LOAD, EXPEDITED)


@dataclasses.dataclass
class TransferResult:
    """What :meth:`ChunkOffloadWorker.get_finished` reports per job when no
    engine class is given (the fields of vLLM's ``TransferResult``)."""

    job_id: int
    success: bool
    transfer_size: int | None = None
    transfer_time: float | None = None


def unstaged_op(swapper, src, dst):
    """``swapper.prepare(src, dst)`` on a path that runs on the caller's stream
    alone: the kernel, or the copy engines where the host memory cannot be
    mapped (a staged swap's copies run on the swapper's one copy stream of
    that direction, behind every other staged swap's)."""
    try:
        return swapper.prepare(src, dst, mode="kernel")
    except ValueError:  # the kernel cannot reach this host memory: the copy engines, on the caller's stream
        return swapper.prepare(src, dst, mode="dma")


class _Transfer:
    __slots__ = ("job_id", "events", "nbytes", "error", "settled", "seconds", "marks")

    def __init__(self, job_id):
        self.job_id, self.events, self.nbytes = job_id, [], 0
        self.error, self.settled, self.seconds = None, False, None
        self.marks: list = []  # the kit's events: (order, start, end), or ()


class ChunkOffloadWorker:
    """Stores (GPU -> CPU) and loads (CPU -> GPU) of KV cache blocks by chunk.

    Parameters
    ----------
    gpu_pages : list of arrays
        Per tensor, its pages ``(num_gpu_blocks, page_bytes)`` of one-byte
        elements (torch, CuPy, or NumPy arrays standing in for GPU memory).
    cpu_chunks : list of arrays
        Per tensor, its chunks ``(num_chunks, blocks_per_chunk * page_bytes)``,
        C-contiguous, in pinned host memory.
    group_refs : list of list of (int, int)
        Per KV cache group, ``(tensor_idx, page_bytes)`` per layer: the layer's
        bytes are the first ``page_bytes`` of each page of that tensor.
    blocks_per_chunk : int
    swapper : BlockSwapper or alike
        Makes the ops (``prepare``); ``max_blocks`` rows per call.
    store_stream, load_stream, expedited_stream
        Each lane's stream (anything ``stream=`` takes; with an ``events``
        kit, a stream with ``wait_event(event)``); expedited loads use
        ``load_stream`` where ``expedited_stream`` is None.
    current_stream : callable, optional
        The stream whose work a transfer waits for (vLLM: torch's current
        stream); None: no wait.
    events : object, optional
        ``new(timing) -> event`` (its CUDA event created by ``new``, in
        relaxed capture mode), ``record(event, stream)``, ``order(stream,
        event)`` (``stream`` waits for ``event``), ``done(event)``,
        ``wait(event)``, ``elapsed(start, end) -> seconds``; see the module
        docstring.  None: waits through ``wait_for=``, no timing.
    event_pool : int, optional
        Transfers whose events (three each) are made with the worker
        (default 16); more unreported transfers make theirs when submitted.
    make_result : callable, optional
        Builds each result (default :class:`TransferResult`).
    """

    def __init__(
        self,
        gpu_pages,
        cpu_chunks,
        group_refs,
        blocks_per_chunk: int,
        *,
        swapper,
        store_stream=None,
        load_stream=None,
        expedited_stream=None,
        current_stream=None,
        events=None,
        make_result=TransferResult,
        event_pool: int = 16,
    ):
        if not gpu_pages or len(gpu_pages) != len(cpu_chunks):
            raise ValueError(
                f"cpu_chunks: expected one chunk tensor per GPU tensor ({len(gpu_pages)}), got {len(cpu_chunks)}"
            )
        bpc = int(blocks_per_chunk)
        if bpc < 1:
            raise ValueError(f"blocks_per_chunk: expected a positive int, got {blocks_per_chunk}")
        rows_views = []
        for i, (gpu, cpu) in enumerate(zip(gpu_pages, cpu_chunks)):
            if len(gpu.shape) != 2 or len(cpu.shape) != 2 or cpu.shape[1] != bpc * gpu.shape[1]:
                raise ValueError(
                    f"cpu_chunks[{i}]: expected shape (chunks, {bpc} x {gpu.shape[-1]}) for GPU pages of shape "
                    f"{tuple(gpu.shape)}, got {tuple(cpu.shape)}"
                )
            rows_views.append(cpu.reshape(cpu.shape[0] * bpc, gpu.shape[1]))  # a view: chunks are contiguous
        self.blocks_per_chunk = bpc
        self.num_groups = len(group_refs)
        signatures, self._op_of_group = part_signatures(group_refs)
        self._ops: dict[str, list] = {lane: [] for lane in LANES}  # per lane, per signature: its ops
        self._limits = []
        for signature in signatures:
            gpu_parts, cpu_parts = [], []
            for t, nbytes in signature:
                page = gpu_pages[t].shape[1]
                if nbytes > page:
                    raise ValueError(
                        f"group_refs: {nbytes} bytes per page of tensor {t}, whose pages hold {page}"
                    )
                gpu_parts.append(gpu_pages[t] if nbytes == page else gpu_pages[t][:, :nbytes])
                cpu_parts.append(rows_views[t] if nbytes == page else rows_views[t][:, :nbytes])
            # At most max_parts parts an op (the kernel's limit): more take several ops.
            step = int(getattr(swapper, "max_parts", 256))
            cuts = [slice(at, at + step) for at in range(0, len(gpu_parts), step)]
            self._ops[STORE].append([swapper.prepare(gpu_parts[c], cpu_parts[c]) for c in cuts])
            self._ops[LOAD].append([swapper.prepare(cpu_parts[c], gpu_parts[c]) for c in cuts])
            self._ops[EXPEDITED].append([unstaged_op(swapper, cpu_parts[c], gpu_parts[c]) for c in cuts])
            # (GPU blocks, chunk rows) every part of the op has: the rows' bounds
            self._limits.append((min(p.shape[0] for p in gpu_parts), min(p.shape[0] for p in cpu_parts)))
        self._max_rows = int(swapper.max_blocks)
        expedited = load_stream if expedited_stream is None else expedited_stream
        self._streams = {STORE: store_stream, LOAD: load_stream, EXPEDITED: expedited}
        self._current_stream = current_stream
        self._events, self._free_marks = events, []
        if events is not None:  # made here, not on the submit path (the module docstring)
            self._free_marks = [self._new_marks() for _ in range(max(0, int(event_pool)))]
        self._make_result = make_result
        self._queues: dict[str, deque] = {lane: deque() for lane in LANES}
        self._swapper, self._gpu_pages, self._cpu_chunks = swapper, list(gpu_pages), list(cpu_chunks)
        self._closed = False

    @property
    def cpu_chunks(self) -> list:
        """The CPU chunk tensors, one per KV cache tensor (as given)."""
        return list(self._cpu_chunks)

    # -- the engine's calls ---------------------------------------------------

    def submit_store(self, job_id: int, src_spec, dst_spec) -> bool:
        """GPU blocks ``src_spec`` (block ids, group sizes, block indices) to
        chunks ``dst_spec.block_ids``, after the current stream's work."""
        return self._submit(job_id, STORE, src_spec, dst_spec)

    def submit_load(self, job_id: int, src_spec, dst_spec, expedited: bool = False) -> bool:
        """Chunks ``src_spec.block_ids`` to GPU blocks ``dst_spec``;
        ``expedited``: on a lane of its own, behind no regular load (the
        engine waits for it within its step)."""
        return self._submit(job_id, EXPEDITED if expedited else LOAD, dst_spec, src_spec)

    def get_finished(self) -> list:
        """Results of the transfers finished since the last call: stores, then
        loads, then expedited loads, each lane in submission order (never
        waits)."""
        out = []
        for lane in LANES:
            queue = self._queues[lane]
            while queue and self._done(queue[0]):
                out.append(self._result(queue.popleft()))
        return out

    def wait(self, job_ids) -> None:
        """Block until the given jobs (and every job submitted before them in
        their lane) have finished; their results stay for
        :meth:`get_finished`."""
        wanted = set(job_ids)
        for queue in self._queues.values():
            last = max((i for i, t in enumerate(queue) if t.job_id in wanted), default=-1)
            for i in range(last + 1):
                self._settle(queue[i])

    def shutdown(self) -> None:
        """Wait for every transfer in flight, then drop the ops and tensors
        (every lane is drained even where one fails to; the first failure is
        raised after)."""
        failure = None
        try:
            for queue in self._queues.values():
                try:
                    for t in queue:
                        self._settle(t)
                except Exception as e:  # noqa: BLE001 - the other lanes still drain
                    failure = failure or e
                queue.clear()
        finally:
            self._ops, self._free_marks = {lane: [] for lane in LANES}, []
            self._gpu_pages, self._cpu_chunks = [], []
            self._closed = True
        if failure is not None:
            raise failure

    # -- inside ---------------------------------------------------------------

    def _submit(self, job_id: int, lane: str, gpu_spec, cpu_spec) -> bool:
        if self._closed:
            raise RuntimeError("submit: this worker was shut down")
        t = _Transfer(job_id)
        self._queues[lane].append(t)
        try:
            self._launch(t, lane, gpu_spec, cpu_spec)
        except Exception as e:  # noqa: BLE001 - told by the job's result, never by a dead engine
            t.error = e
        if t.error is not None:
            logger.warning("cupy_swap: %s job %s failed: %s", lane, job_id, t.error)
        return True

    def _launch(self, t: _Transfer, lane: str, gpu_spec, cpu_spec) -> None:
        store = lane == STORE
        block_ids = np.asarray(gpu_spec.block_ids).reshape(-1)
        sizes = getattr(gpu_spec, "group_sizes", None)
        starts = getattr(gpu_spec, "block_indices", None)
        per_group = transfer_rows(
            block_ids,
            [len(block_ids)] if sizes is None else sizes,
            [0] * (1 if sizes is None else len(sizes)) if starts is None else starts,
            cpu_spec.block_ids,
            self.blocks_per_chunk,
            self.num_groups,
        )
        ops = self._ops[lane]
        calls = [
            (i, rows)
            for i, rows in enumerate(merged_rows(per_group, self._op_of_group, len(ops), store))
            if rows is not None
        ]
        if len(calls) > 1 or any(len(rows) > self._max_rows or len(ops[i]) > 1 for i, rows in calls):
            for i, rows in calls:  # several calls: none runs unless every row is in range
                gpu_limit, cpu_limit = self._limits[i]
                limits = (gpu_limit, cpu_limit) if store else (cpu_limit, gpu_limit)
                problem = out_of_range(rows, *limits)
                if problem is not None:
                    raise SpecError(f"block_mapping: {problem}; nothing was copied")
        stream, kit = self._streams[lane], self._events
        wait_for = self._current_stream() if self._current_stream is not None else None
        if kit is not None:
            t.marks = order, start, end = self._free_marks.pop() if self._free_marks else self._new_marks()
            if wait_for is not None:
                kit.record(order, wait_for)
                kit.order(stream, order)
                wait_for = None
            kit.record(start, stream)
        try:
            for i, rows in calls:
                for op in ops[i]:
                    for at in range(0, len(rows), self._max_rows):
                        chunk = rows[at : at + self._max_rows]
                        t.events.append(self._call(op, chunk, stream, wait_for))
                        t.nbytes += len(chunk) * op.bytes_per_pair
                        wait_for = None  # later calls follow on the same stream
        finally:
            if kit is not None:
                kit.record(end, stream)

    def _new_marks(self) -> tuple:
        return self._events.new(False), self._events.new(True), self._events.new(True)

    def _call(self, op, rows, stream, wait_for):
        # A failure of an earlier transfer of this op that no event has told
        # yet is raised once by the op's next call, which then launches
        # nothing: that transfer's own event tells it (get_finished), and the
        # call is made again.
        waits = () if wait_for is None else wait_for
        for _ in range(sum(map(len, self._queues.values())) + 1):
            try:
                return op(rows, stream=stream, wait_for=waits)
            except Exception as e:
                if getattr(e, "swap_seq", None) is None:
                    raise
        return op(rows, stream=stream, wait_for=waits)

    def _done(self, t: _Transfer) -> bool:
        if t.settled:
            return True
        with capture.relaxed():  # event queries: legal while another thread captures
            if not all(e.done for e in t.events):
                return False
            return not t.marks or self._events.done(t.marks[2])

    def _settle(self, t: _Transfer) -> None:
        """Wait for a transfer's calls and read their verdicts (once)."""
        if t.settled:
            return
        with capture.relaxed():  # waits: legal while another thread captures
            for event in t.events:
                try:
                    event.synchronize()  # raises the verdict of a bad mapping
                except Exception as e:  # noqa: BLE001 - every failure is this transfer's result
                    if t.error is None:
                        t.error = e
            if t.marks:
                self._events.wait(t.marks[2])
        if t.marks and t.error is None:
            t.seconds = self._events.elapsed(t.marks[1], t.marks[2])
        elif self._events is not None and t.error is None:
            t.seconds = 0.0  # a transfer that failed before launching, or moved nothing
        t.settled = True

    def _result(self, t: _Transfer):
        self._settle(t)
        if t.marks:
            self._free_marks.append(t.marks)  # every event of the transfer has completed
            t.marks = ()
        ok = t.error is None
        result = self._make_result(
            job_id=t.job_id,
            success=ok,
            transfer_size=t.nbytes if ok else None,
            transfer_time=t.seconds if ok else None,
        )
        if not ok:
            try:
                result.error = f"{type(t.error).__name__}: {t.error}"
            except AttributeError:  # a class with slots: the log has it
                pass
        return result
