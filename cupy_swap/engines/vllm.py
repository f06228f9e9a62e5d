"""cupy_swap as vLLM's CPU offloading worker: an ``OffloadingSpec`` that vLLM's
``OffloadingConnector`` loads by name::

    --kv-transfer-config '{"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
      "kv_connector_extra_config": {"spec_name": "CupySwapOffloadingSpec",
        "spec_module_path": "cupy_swap.engines.vllm", "cpu_bytes_to_use": 34359738368,
        "blocks_per_chunk": 4}}'

:class:`CupySwapOffloadingSpec` is vLLM's own ``CPUOffloadingSpec`` (its
manager, eviction policy and CPU sizing from ``cpu_bytes_to_use``) with one
change: ``get_worker`` returns :class:`CupySwapOffloadingWorker`, which moves
each ``submit_store``/``submit_load`` with one prepared-op call over every
KV cache tensor (chunks are rows of a view of each CPU tensor:
:mod:`cupy_swap.engines.chunks`) where vLLM's worker builds one pointer per
block and tensor for ``cuMemcpyBatchAsync``, and reports real verdicts: a
transfer whose mapping fails the copy's check is ``success=False`` and wrote
nothing (:mod:`cupy_swap.engines.offload`).

**Followed.**  The contract as read in vLLM's source (vllm-project/vllm):
``vllm/v1/kv_offload/base.py`` at commit 0105e232b7fa4e1b59ec87531f167c0443a5095d
(``OffloadingSpec(config)``, ``get_manager()``, ``get_worker(kv_caches:
CanonicalKVCaches) -> OffloadingWorker``; ``submit_store(job_id, src_spec:
GPULoadStoreSpec, dst_spec)``, ``submit_load(job_id, src_spec, dst_spec:
GPULoadStoreSpec) -> bool``, ``get_finished() -> list[TransferResult]``,
``wait(job_ids)``, ``shutdown()``; ``GPULoadStoreSpec(block_ids, group_sizes,
block_indices)``; ``TransferResult(job_id, success, transfer_size,
transfer_time)``), the connector's worker side
``vllm/distributed/kv_transfer/kv_connector/v1/offloading/worker.py`` at
0078e9d2b020be709d7d756877106fd1015ea4f4, and ``CPUOffloadingSpec`` /
``CPUOffloadingWorker`` (``vllm/v1/kv_offload/cpu/spec.py``,
``cpu/gpu_worker.py``) as stored beside them (``blocks_per_chunk``,
``create_worker``; the index that served them named no commit).  Then the
release vLLM 0.33.0 (the package index's newest, built 2026-11-01), whose
classes the CPU tests check this module against where it imports
(``tests/test_engines_adapters.py``): ``submit_load(job_id, src_spec,
dst_spec, expedited=False)`` (an expedited load, which the connector waits
for within its step, runs on a stream of its own, behind no regular load),
and the spec's ``num_chunks`` (``num_blocks`` before).  vLLM marks this API
unstable: this module stays thin, and everything below the engine's calls
is engine-independent.

**Not followed.**  The worker keeps vLLM's direct per-rank CPU layout only
(each rank its own pinned tensor per KV cache tensor, chunk ids its rows):
``per_group_cpu_pools`` (chunk ids are rows of a shared per-group arena),
the replicated layout (one copy for every rank, stored by rank 0, which
vLLM picks by itself for a pure-MLA model at tensor parallel > 1 on one
node), ``enable_compact_layout`` and the canonical (shared,
parallelism-free) layout are refused with NotImplementedError when the
worker is made.  The older ``OffloadingHandler.transfer_async`` interface
is not provided.  At commit 0078e9d2 the connector asserts
``transfer_result.success``: a failed transfer is reported as vLLM's
interface allows, and that vLLM then stops at its own assertion rather than
using bad blocks.

Importing this module needs neither vLLM nor torch: the two classes are
built on first use (``getattr(module, "CupySwapOffloadingSpec")``, as vLLM's
factory does), subclassing vLLM's own.
"""

from __future__ import annotations

import numpy as np

from ..cuda import capture
from ..cuda.streams import stream_handle, torch_stream_getter
from .offload import ChunkOffloadWorker, TransferResult

VLLM_COMMIT = "0105e232b7fa4e1b59ec87531f167c0443a5095d"  # vllm/v1/kv_offload/base.py as read
VLLM_RELEASE = "0.33.0"  # the release followed since (module docstring)
DEFAULT_MAX_ROWS = 8192  # rows of one op call (a longer transfer takes several)

_classes: dict = {}


def _vllm_base():
    try:
        from vllm.v1.kv_offload import base
    except ImportError as e:
        raise ImportError(
            f"cupy_swap.engines.vllm: this class subclasses vLLM's offloading classes and needs vLLM "
            f"(vllm.v1.kv_offload.base, as in vLLM {VLLM_RELEASE} and at commit {VLLM_COMMIT[:12]}): {e}"
        ) from e
    return base


def _cpu_spec_class():
    _vllm_base()  # says what is missing when vLLM is
    try:
        from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec
    except ModuleNotFoundError as e:
        if e.name != "vllm.v1.kv_offload.cpu.spec":
            raise  # a package vLLM needs is missing: say so, not where older releases keep the class
        from vllm.v1.kv_offload.cpu import CPUOffloadingSpec  # where older releases keep it
    return CPUOffloadingSpec


def page_rows(tensor, page_size_bytes: int):
    """A KV cache tensor as vLLM's workers see it: int8 pages ``(num_blocks,
    page_size_bytes)`` (the tensor itself when it is one already, whatever
    its block stride)."""
    import torch

    if tensor.dtype == torch.int8 and tensor.dim() == 2 and tensor.shape[1] == page_size_bytes:
        return tensor
    return tensor.view(torch.int8).view(-1, page_size_bytes)


def _runtime():
    """CuPy's CUDA runtime module (a function: a CPU test stands in for it)."""
    from cupy.cuda import runtime

    return runtime


class TorchEvents:
    """The worker's event kit (:mod:`cupy_swap.engines.offload`) on torch's
    CUDA events, as vLLM's own worker times its transfers.

    torch creates an event's CUDA event (``cudaEventCreate``) lazily, at its
    first ``record()``: :meth:`new` records each event once on a private
    stream of ``device`` (made on first use), so the CUDA event exists when
    :meth:`new` returns.  Creations, queries, waits and timings run in relaxed
    capture mode (legal while another thread captures a CUDA graph:
    :mod:`cupy_swap.cuda.capture`); the worker's records on its own streams
    then create nothing (and so never wait behind another thread's release
    of pinned memory, which ``cudaEventCreate`` can: benchmarks/NOTES.md,
    item 77)."""

    def __init__(self, device=None):
        self.device = device  # None: torch's current device when the first event is made
        self._stream = None
        self._handles: dict = {}  # stream object -> raw handle

    # record and order: the runtime's calls on raw handles, not torch's
    # wrappers (which cost several times as much host time a transfer:
    # benchmarks/NOTES.md, item 88); the events' CUDA events exist (new).
    def record(self, event, stream) -> None:
        """Record ``event`` on ``stream`` (a raw handle or a stream object)."""
        _runtime().eventRecord(event.cuda_event, self._handle(stream))

    def order(self, stream, event) -> None:
        """Make ``stream``'s later work wait for ``event``."""
        _runtime().streamWaitEvent(self._handle(stream), event.cuda_event, 0)

    def _handle(self, stream) -> int:
        if type(stream) is int:
            return stream
        handle = self._handles.get(stream)
        if handle is None:
            handle = self._handles[stream] = stream_handle(stream)
        return handle

    def new(self, timing: bool):
        import torch

        with capture.relaxed():
            if self._stream is None:
                self._stream = torch.cuda.Stream(device=self.device)
            event = torch.cuda.Event(enable_timing=timing)
            event.record(self._stream)  # creates the CUDA event, here (torch's is lazy)
        return event

    def done(self, event) -> bool:
        with capture.relaxed():
            return event.query()

    def wait(self, event) -> None:
        with capture.relaxed():
            event.synchronize()

    def elapsed(self, start, end) -> float:
        with capture.relaxed():  # cudaEventElapsedTime
            return start.elapsed_time(end) * 1e-3  # milliseconds


def make_worker(
    kv_caches,
    blocks_per_chunk: int,
    num_cpu_chunks: int,
    *,
    swapper=None,
    max_rows: int | None = None,
    worker_class=None,
):
    """The worker for ``kv_caches`` (vLLM's ``CanonicalKVCaches``, or any
    object with its fields: ``tensors[i].tensor``, ``.page_size_bytes``;
    ``group_data_refs[g][j].tensor_idx``, ``.page_size_bytes``).

    Allocates one pinned, zeroed CPU tensor ``(num_cpu_chunks,
    blocks_per_chunk * page_size_bytes)`` per KV cache tensor
    (:func:`cupy_swap.zeros_pinned`), a ``BlockSwapper`` on the tensors'
    GPU unless ``swapper`` is given (``max_rows`` rows a call, default
    :data:`DEFAULT_MAX_ROWS` or fewer where the cache has fewer blocks), and
    a torch stream per lane (stores, loads, expedited loads).  ``worker_class``: default
    :class:`CupySwapOffloadingWorker` when vLLM imports, else
    :class:`~cupy_swap.engines.offload.ChunkOffloadWorker` (results are then
    :class:`~cupy_swap.engines.offload.TransferResult`).
    """
    import torch

    from ..cuda.memory import zeros_pinned
    from ..swapper import BlockSwapper

    pages = [page_rows(t.tensor, t.page_size_bytes) for t in kv_caches.tensors]
    if not pages:
        raise ValueError("kv_caches: expected at least one KV cache tensor, got none")
    device = pages[0].device.index if pages[0].device.index is not None else torch.cuda.current_device()
    if swapper is None:
        rows = max_rows or min(DEFAULT_MAX_ROWS, max(p.shape[0] for p in pages))
        swapper = BlockSwapper(max_blocks=int(rows), device=device)
    with capture.relaxed():  # pinned allocations and streams: legal while another thread captures
        chunks = [
            zeros_pinned((int(num_cpu_chunks), int(blocks_per_chunk) * p.shape[1]), np.int8) for p in pages
        ]
        with torch.cuda.device(device):
            store_stream, load_stream, expedited_stream = (torch.cuda.Stream() for _ in range(3))
    refs = [[(r.tensor_idx, r.page_size_bytes) for r in group] for group in kv_caches.group_data_refs]
    make_result = TransferResult
    if worker_class is None:
        try:
            worker_class = _worker_class()
            make_result = _vllm_base().TransferResult
        except ImportError:
            worker_class = ChunkOffloadWorker
    return worker_class(
        pages,
        chunks,
        refs,
        blocks_per_chunk,
        swapper=swapper,
        store_stream=store_stream,
        load_stream=load_stream,
        expedited_stream=expedited_stream,
        current_stream=torch_stream_getter(device),  # a raw handle: TorchEvents.record takes it
        events=TorchEvents(device),
        make_result=make_result,
    )


# The CPU layouts of vLLM's own worker that this one does not keep: (what
# names it, whether a spec asks for it, why it cannot serve it, what to do).
_LAYOUTS = (
    (
        "per_group_cpu_pools (OffloadingConfig.per_group_pools)",
        lambda spec, config: (
            bool(getattr(config, "per_group_pools", False)) or getattr(spec, "arena", None) is not None
        ),
        "chunk ids are then rows of vLLM's shared per-group arena, sized per group",
        "remove per_group_cpu_pools from kv_connector_extra_config",
    ),
    (
        "the replicated layout (OffloadingConfig.replicated_layout, which vLLM picks by itself for a pure-MLA "
        "model at tensor parallel > 1 on one node)",
        lambda spec, config: bool(
            getattr(spec, "replicated_layout", getattr(config, "replicated_layout", False))
        ),
        "the CPU space is then sized for one copy and shared by every rank, and only rank 0 stores",
        "run such a model at tensor parallel 1, or with vLLM's own CPUOffloadingSpec",
    ),
    (
        "enable_compact_layout",
        lambda spec, config: bool(getattr(spec, "compact_layout_requested", False)),
        "it packs blocks in vLLM's own compact format",
        "remove enable_compact_layout from kv_connector_extra_config",
    ),
    (
        "canonical_layout (OffloadingConfig.canonical_layout)",
        lambda spec, config: bool(getattr(config, "canonical_layout", False)),
        "it stores parallelism-free canonical pages shared across ranks",
        "remove canonical_layout from kv_connector_extra_config",
    ),
)


def _refuse_layouts(spec) -> None:
    """Raise NotImplementedError, naming each setting, where ``spec`` (vLLM's
    ``CPUOffloadingSpec`` and its ``config``) asks for a CPU layout other than
    the one this worker keeps: per rank, one private pinned tensor per KV
    cache tensor, whose rows are the chunk ids (vLLM's direct per-rank
    layout).  Settings missing from this vLLM's classes count as unset."""
    config = getattr(spec, "config", None)
    found = [(name, why, fix) for name, asked, why, fix in _LAYOUTS if asked(spec, config)]
    if found:
        raise NotImplementedError(
            "CupySwapOffloadingSpec: cupy_swap's worker keeps vLLM's direct per-rank CPU layout only (each rank "
            "its own pinned tensor per KV cache tensor, chunk ids its rows); not supported: "
            + "; ".join(f"{name}: {why} ({fix})" for name, why, fix in found)
        )


def _worker_class():
    if "CupySwapOffloadingWorker" not in _classes:
        base = _vllm_base()

        class CupySwapOffloadingWorker(ChunkOffloadWorker, base.OffloadingWorker):
            """vLLM's ``OffloadingWorker`` contract served by
            :class:`~cupy_swap.engines.offload.ChunkOffloadWorker`: one
            prepared-op call per transfer over every KV cache tensor,
            in-order results with bytes, device time and real success."""

        CupySwapOffloadingWorker.__module__ = __name__
        CupySwapOffloadingWorker.__qualname__ = "CupySwapOffloadingWorker"
        _classes["CupySwapOffloadingWorker"] = CupySwapOffloadingWorker
    return _classes["CupySwapOffloadingWorker"]


def _spec_class():
    if "CupySwapOffloadingSpec" not in _classes:
        cpu_spec = _cpu_spec_class()

        class CupySwapOffloadingSpec(cpu_spec):
            """vLLM's ``CPUOffloadingSpec`` whose worker is cupy_swap's.

            Extra keys of ``kv_connector_extra_config`` besides vLLM's own
            (``cpu_bytes_to_use``, ``blocks_per_chunk`` or ``block_size``,
            ``eviction_policy``, ...): ``cupy_swap_max_rows``, the rows of one
            op call (default 8192; a longer transfer takes several calls)."""

            def get_worker(self, kv_caches):
                worker = getattr(self, "_cupy_swap_worker", None)
                if worker is None:
                    _refuse_layouts(self)
                    extra = self.extra_config
                    chunks = getattr(self, "num_chunks", None)  # vLLM 0.33.0; num_blocks before
                    worker = make_worker(
                        kv_caches,
                        self.blocks_per_chunk,
                        self.num_blocks if chunks is None else chunks,
                        max_rows=int(extra.get("cupy_swap_max_rows", 0)) or None,
                    )
                    self._cupy_swap_worker = worker
                return worker

        CupySwapOffloadingSpec.__module__ = __name__
        CupySwapOffloadingSpec.__qualname__ = "CupySwapOffloadingSpec"
        _classes["CupySwapOffloadingSpec"] = CupySwapOffloadingSpec
    return _classes["CupySwapOffloadingSpec"]


def __getattr__(name: str):
    # Built on first use, subclassing vLLM's classes (vLLM's factory asks
    # getattr(module, spec_name) and checks issubclass(..., OffloadingSpec)).
    if name == "CupySwapOffloadingSpec":
        return _spec_class()
    if name == "CupySwapOffloadingWorker":
        return _worker_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# The two classes are left out of __all__: they need vLLM (``import *`` must not).
__all__ = ["make_worker", "page_rows", "TorchEvents", "VLLM_COMMIT", "VLLM_RELEASE"]
