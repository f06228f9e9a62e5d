"""sgl-kernel's KV cache transfer functions (``sgl_kernel.kvcacheio``) on
cupy_swap, and a patch that routes SGLang's HiCache host pools to them.

Each function has the name, signature and meaning of sgl-kernel's: per
``item`` (one token of one layer, ``item_size`` bytes, for K and for V, or
once for MLA), copy ``src[src_indices[i]]`` to ``dst[dst_indices[i]]``, in
the layouts SGLang's host pools keep (``lf`` layer-first: a layer's buffer
``[tokens, ...]``; ``pf`` page-first: ``[tokens, layers, ...]`` with
``layout_dim`` bytes per token; ``ph`` page-head: ``[pages, heads,
page_size, layers, head_dim]``), with the indices as int64 tensors on the
GPU (read there: nothing waits on the host, but for the check of a transfer
of several calls, below), on the caller's stream (torch's current stream
for torch tensors), returning nothing.  ``block_quota`` and
``num_warps_per_block`` are accepted and unused.  The ``all_layer`` functions
take what SGLang passes: tables of layer addresses (uint64 tensors), known
to this module by :func:`register_layers` (:func:`adopt` registers a host
pool's and its device pool's), or the lists of layer tensors themselves.

Each call is one prepared-op call over every layer (and K and V) it moves,
more only past ``max_parts`` parts or one call's rows
(:data:`DEFAULT_MAX_ROWS`, and for indices on the GPU at most the rows one
launch checks: 8192 on an H200).  Unlike sgl-kernel, every index is checked:

* **One op call** (the usual case): the launch checks every row and copies
  nothing for a bad one (an index out of range, or one destination twice).
  The function has returned by then: the failure is raised by the call's
  event (:func:`last_events` gives this thread's last events;
  ``synchronize()`` raises it), and, where nobody synchronizes it (SGLang
  does not), once by the next call of the *same op* from the same thread:
  the next call of the same function with the same buffers and parameters
  (for a per-layer function, the next transfer of that layer), which then
  raises that earlier failure (naming the earlier call's swap number),
  launches nothing and copies none of its own indices.  A call of another
  op (another layer, another function) is not affected.
* **Several op calls** (more rows than one call takes, or more than
  ``max_parts`` parts; a page-head load makes a part per head, a page-head
  backup a row per item and head, so with 8 heads on an H200 a backup past
  1,024 tokens): before the first launch, the minimum and maximum of
  the source and destination rows are checked against every buffer's
  rows, and an index out of range raises IndexError from the call itself,
  with nothing copied.  For indices on the GPU that costs four reductions
  on the caller's stream and one 32-byte device-to-host read, for which
  the host waits until that stream has run everything queued before it
  (once for the index tensors of a load layer by layer: NOTES 79, 82;
  made in relaxed capture mode; skipped while that
  stream captures a graph, where the op refuses GPU indices at its first
  call, before launching anything).  A destination given twice is still
  found by each call alone: twice within one call's rows, that call
  copies nothing and is reported as above while the others copy; in two
  different calls, both copies are made.

sgl-kernel's layer-first and page-first kernels skip an item whose source
or destination index is negative; here that is an index out of range,
reported as above.

**Followed.**  sgl-project/sglang: ``sgl-kernel/python/sgl_kernel/kvcacheio.py``
at 0ba3cdd474639a50317df43db246ca3351fbeecf (names, signatures),
``sgl-kernel/csrc/kvcacheio/transfer.cu`` at
1243cf3da37cb08cb73faa12db09653eb997d142 (address arithmetic and checks of
each layout), the host pools ``python/sglang/srt/mem_cache/pool_host/mha.py``
at 0047d999bb3a3ad311df5a4b6356bfb5586e0d66 and ``pool_host/mla.py`` at
01c0ede38cc9645488fd2847dbea8a2f6a9241d8 (how they call them).

**In SGLang.**  :func:`patch_host_pools` replaces these names in the host
pool modules, and makes every host pool built afterwards :func:`adopt` itself
(its JIT kernels off, so ``io_backend="kernel"`` reaches these functions, and
its address tables registered).  It acts in the process that calls it: run
it in each scheduler process before the cache is built.

Importing this module needs neither SGLang, sgl-kernel, torch nor CuPy.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import itertools
import sys
import threading

import numpy as np

from ..cuda import capture

SGL_KERNEL_COMMIT = "0ba3cdd474639a50317df43db246ca3351fbeecf"  # sgl-kernel/python/sgl_kernel/kvcacheio.py
DEFAULT_MAX_ROWS = 8192  # rows of one op call (items, or items x heads for a page-head backup)
# Launches a swapper of this module keeps queued before a call waits for the
# GPU (its slot ring, 128 KiB of pinned memory a slot): SGLang queues a load
# layer by layer (a launch per layer up to 8,192 rows, 3 at 20,000 tokens of
# 32 layers); at 16 slots the host waited for the copies (NOTES 79).
DEFAULT_RING = 128

KERNEL_FUNCTIONS = (
    "transfer_kv_per_layer",
    "transfer_kv_per_layer_pf_lf",
    "transfer_kv_per_layer_ph_lf",
    "transfer_kv_all_layer",
    "transfer_kv_all_layer_lf_pf",
    "transfer_kv_all_layer_lf_ph",
    "transfer_kv_per_layer_mla",
    "transfer_kv_per_layer_mla_pf_lf",
    "transfer_kv_all_layer_mla",
    "transfer_kv_all_layer_mla_lf_pf",
)
DIRECT_FUNCTIONS = (
    "transfer_kv_direct",
    "transfer_kv_per_layer_direct_pf_lf",
    "transfer_kv_all_layer_direct_lf_pf",
)
HOST_POOL_MODULES = (
    "sglang.srt.mem_cache.pool_host.mha",
    "sglang.srt.mem_cache.pool_host.mla",
    "sglang.srt.mem_cache.memory_pool_host",  # where releases before the pool_host package keep them
)
HOST_POOL_CLASSES = ("MHATokenToKVPoolHost", "MLATokenToKVPoolHost")

# -- arrays of any framework, as bytes ------------------------------------------


def _framework(a) -> str:
    """``"torch"``, ``"cupy"`` or ``"numpy"``: by ``a``'s type, classified
    once (about ten asks a call; SGLang's per-layer calls, NOTES 82)."""
    kind = _kinds.get(type(a))
    if kind is None:
        torch, cupy = sys.modules.get("torch"), sys.modules.get("cupy")
        if torch is not None and isinstance(a, torch.Tensor):
            kind = "torch"
        elif cupy is not None and isinstance(a, cupy.ndarray):
            kind = "cupy"
        else:
            kind = "numpy"
        _kinds[type(a)] = kind  # a type made before torch or CuPy was imported subclasses neither
    return kind


_kinds: dict = {}  # type -> framework


def _ptr(a) -> int:
    kind = _framework(a)
    if kind == "torch":
        return a.data_ptr()
    if kind == "cupy":
        return a.data.ptr
    return np.asarray(a).__array_interface__["data"][0]


def _span(a) -> int:
    """Bytes from ``a``'s first element to one past its last."""
    if _framework(a) == "torch":
        itemsize, strides = a.element_size(), [s * a.element_size() for s in a.stride()]
    else:
        itemsize, strides = a.itemsize, a.strides
    if 0 in a.shape:
        return 0
    if any(s < 0 for s in strides):
        raise ValueError(f"expected a buffer with non-negative strides, got strides {tuple(strides)}")
    return itemsize + sum((n - 1) * s for n, s in zip(a.shape, strides))


def _rows(a, offset: int, stride: int, block: int):
    """``a``'s memory as rows of ``block`` bytes, ``stride`` bytes apart,
    from byte ``offset``: as many rows as fit in ``a``'s span."""
    span = _span(a)
    count = max(0, (span - offset - block) // stride + 1) if span >= offset + block else 0
    kind = _framework(a)
    if kind == "torch":
        import torch

        flat = torch.as_strided(a, (span // a.element_size(),), (1,)).view(torch.uint8)
        return flat.as_strided((count, block), (stride, 1), flat.storage_offset() + offset)
    xp = sys.modules["cupy"] if kind == "cupy" else np
    flat = xp.lib.stride_tricks.as_strided(a, (span // a.itemsize,), (a.itemsize,)).view(xp.uint8)
    return xp.lib.stride_tricks.as_strided(flat[offset:], (count, block), (stride, 1))


def _geometry(a) -> tuple:
    """What identifies ``a``'s memory as the rows built over it read it:
    address, shape, strides and dtype (a key of the op cache: one attribute
    read each, where :func:`_span` computes; asked of every buffer at every
    call, so torch's case first)."""
    if _kinds.get(type(a)) == "torch":
        return a.data_ptr(), a.shape, a.stride(), a.dtype
    if type(a) is _Registered:  # a registered table's layers
        return a.serial
    if isinstance(a, list):
        return tuple(_geometry(b) for b in a)
    if _framework(a) == "torch":
        return a.data_ptr(), a.shape, a.stride(), a.dtype
    return _ptr(a), a.shape, a.strides, a.dtype


def _token_bytes(a) -> int:
    """Bytes of one row along axis 0 (one token of a layer buffer)."""
    itemsize = a.element_size() if _framework(a) == "torch" else a.itemsize
    for n in a.shape[1:]:
        itemsize *= n
    return itemsize


def _offsets(like, n: int, step: int):
    """``[0, step, ..., (n - 1) step]`` as int64 on ``like``'s device, made
    once per device (a transfer per layer would otherwise launch it each
    call).  On the GPU it is made on a stream of its own and kept once that
    stream finished it: a later call on any stream reads it, with nothing
    else ordering it, and the caller's queued work is not waited for."""
    kind = _framework(like)
    device = like.device if kind != "numpy" else None
    key = (kind, str(device), n, step)
    got = _offsets_made.get(key)
    if got is None:
        on_gpu = kind == "cupy" or (kind == "torch" and like.is_cuda)
        if on_gpu and _capturing(like):  # made in the capture, it would hold its values only in replays
            return _arange(kind, device, n, step, side=False)
        got = _offsets_made[key] = _arange(kind, device, n, step, side=on_gpu)
    return got


def _arange(kind: str, device, n: int, step: int, side: bool):
    """``arange(0, n * step, step)`` as int64 on ``device``; ``side``: on a
    new stream, waited for before it returns (in relaxed capture mode)."""
    if kind == "numpy":
        return np.arange(0, n * step, step, dtype=np.int64)
    with capture.relaxed():
        if kind == "torch":
            import torch

            stream = torch.cuda.Stream(device) if side else None
            with torch.cuda.stream(stream):  # None: the current one
                got = torch.arange(0, n * step, step, dtype=torch.int64, device=device)
        else:
            import cupy

            with device:
                stream = cupy.cuda.Stream(non_blocking=True) if side else None
                with stream if side else contextlib.nullcontext():
                    got = cupy.arange(0, n * step, step, dtype=cupy.int64)
        if side:
            stream.synchronize()
        return got


_offsets_made: dict = {}


def _spread(first, offsets):
    """``first[i] + offsets[j]`` for every i, then j: 1-D, on ``first``'s device."""
    return (first.reshape(-1, 1) + offsets.reshape(1, -1)).reshape(-1)


# -- indices, tables, swappers, ops ------------------------------------------------


def _numel(a) -> int:
    return a.numel() if _framework(a) == "torch" else int(a.size)


def _check_indices(src_indices, dst_indices) -> int:
    if src_indices.dtype not in _longs or dst_indices.dtype not in _longs:  # once per dtype object
        for name, idx in (("Source", src_indices), ("Destination", dst_indices)):
            if not str(idx.dtype).endswith("int64"):
                raise TypeError(f"{name} indices must be of type long (int64), got {idx.dtype}")
            _longs.add(idx.dtype)
    n, m = _numel(src_indices), _numel(dst_indices)
    if n != m:
        raise ValueError(f"Source and destination indices must have the same length, got {n} and {m}")
    return n


_longs: set = set()  # the int64 dtypes of each framework, as seen


def _check_item_size(item_size: int) -> None:
    if item_size <= 0 or item_size % 8:
        raise ValueError(f"Item byte size must be divisible by 8, got {item_size}")


_tables: dict = {}  # address of a layer-address table -> (table, its layer buffers)


def _table_values(table) -> list[int]:
    if _framework(table) == "torch":
        import torch

        values = table.reshape(-1).view(torch.int64).cpu().tolist()  # uint64 read as int64
    elif _framework(table) == "cupy":
        values = table.reshape(-1).view("int64").get().tolist()
    else:
        values = np.asarray(table).reshape(-1).view(np.int64).tolist()
    return [v & ((1 << 64) - 1) for v in values]


def register_layers(table, buffers) -> None:
    """Tell this module that ``table`` (a uint64 tensor of layer base
    addresses, as SGLang builds with ``torch.tensor([x.data_ptr() ...])``)
    holds the addresses of ``buffers``, in order.  Reads the table once (a
    device-to-host copy); raises ValueError if it holds other addresses."""
    buffers = list(buffers)
    values, wanted = _table_values(table), [_ptr(b) for b in buffers]
    if values != wanted:
        raise ValueError(
            f"register_layers: the table holds {len(values)} addresses that are not those of the {len(buffers)} "
            f"buffers given (first: {values[:1]} against {wanted[:1]})"
        )
    _tables[_ptr(table)] = (table, _Registered(buffers))


class _Registered(list):
    """A registered table's layer buffers: one op-cache key for all of
    them (its serial), where a list passed in is keyed buffer by buffer."""

    _serials = itertools.count(1)

    def __init__(self, buffers):
        super().__init__(buffers)
        self.serial = next(self._serials)


def _kv(k_layers, v_layers) -> list:
    """K and V of every layer, layer by layer: the parts of an all-layer op."""
    return [b for kv in zip(k_layers, v_layers) for b in kv]


def _layers(arg, num_layers: int, name: str) -> list:
    if isinstance(arg, (list, tuple)):
        layers = list(arg)
    else:
        entry = _tables.get(_ptr(arg))
        if entry is None:
            raise LookupError(
                f"{name}: a table of layer addresses this module was not told of; pass the layer tensors "
                f"(a list), or call cupy_swap.engines.sglang.register_layers(table, tensors) once "
                f"(adopt() does it for a host pool)"
            )
        layers = entry[1]
    if len(layers) != num_layers:
        raise ValueError(
            f"Number of layers in {name} does not match num_layers: {len(layers)} != {num_layers}"
        )
    return layers


_state = threading.local()  # .events: this thread's last call's events; .checked: its last split check
_lock = threading.Lock()
_swappers: dict = {}
_override: list = [None]
_ops: dict = {}
_OPS_KEPT = 1024


def use_swapper(swapper) -> None:
    """Make every transfer go through ``swapper`` (None: one ``BlockSwapper``
    per GPU, made on first use, :data:`DEFAULT_MAX_ROWS` rows a call and
    :data:`DEFAULT_RING` launches queued)."""
    with _lock:
        _override[0] = swapper
        _ops.clear()


def _swapper_for(buffers):
    if _override[0] is not None:
        return _override[0]
    device = None
    for b in buffers:
        if isinstance(b, list):  # a group of layers (see _geometry)
            b = b[0] if b else None
        kind = _framework(b)
        if kind == "torch" and b.is_cuda:
            device = b.device.index
        elif kind == "cupy":
            device = b.device.id
        if device is not None:
            break
    with _lock:
        sw = _swappers.get(device)
        if sw is None:
            from ..swapper import BlockSwapper

            sw = _swappers[device] = BlockSwapper(
                max_blocks=DEFAULT_MAX_ROWS, device=device, ring_size=DEFAULT_RING
            )
        return sw


def last_events() -> list:
    """The events of this thread's last transfer call (one per op call; each
    ``synchronize()`` raises a bad index's error)."""
    return list(getattr(_state, "events", ()))


def _bounds(src_rows, dst_rows) -> list[int]:
    """``[min, max]`` of the source rows, then of the destination rows: on
    the host for NumPy; for GPU tensors, four reductions on the caller's
    stream and one 32-byte device-to-host read (the host waits for that
    stream), in relaxed capture mode (a stream synchronize)."""
    kind = _framework(src_rows)
    if kind == "numpy":
        return [int(src_rows.min()), int(src_rows.max()), int(dst_rows.min()), int(dst_rows.max())]
    xp = sys.modules["torch"] if kind == "torch" else sys.modules["cupy"]
    with capture.relaxed():
        both = xp.stack((src_rows.min(), src_rows.max(), dst_rows.min(), dst_rows.max()))
        return (both if kind == "torch" else both.get()).tolist()


def _capturing(rows) -> bool:
    """Whether the stream a call on GPU ``rows`` would use captures a graph."""
    kind = _framework(rows)
    if kind == "torch":
        import torch

        return bool(rows.is_cuda) and torch.cuda.is_current_stream_capturing()
    if kind == "cupy":
        import cupy

        return cupy.cuda.get_current_stream().is_capturing()
    return False


def _remembered(name: str, tensors: tuple, extra: tuple, compute):
    """``compute()``, or what it gave this thread's last time under ``name``
    when ``tensors`` are the same torch tensors with no in-place write since
    and ``extra`` is equal: SGLang loads layer by layer with one pair of
    index tensors, so what is derived from them is derived at the first
    layer.  torch's version of a tensor counts its in-place writes (a raw
    kernel's write is not counted: the op's launch still checks every row
    it reads).  NumPy and CuPy arrays and inference tensors keep no
    version: ``compute()`` at every call.  A raised error is not kept."""
    key = None
    if all(_framework(t) == "torch" and not t.is_inference() for t in tensors):
        key = (tuple(map(id, tensors)), tuple(t._version for t in tensors), extra)
        last = getattr(_state, name, None)
        if last is not None and last[0] == key:  # the ids are theirs: the entry holds the tensors
            return last[2]
    value = compute()
    setattr(_state, name, (key, tensors, value))
    return value


def _check_split(src_rows, dst_rows, limits) -> None:
    """Before the first call of a transfer of several: every row in range,
    or IndexError and nothing launched (read once for a layer-by-layer
    load's index tensors: NOTES 79, 82)."""
    if _capturing(src_rows):
        return  # the op refuses GPU rows in a capture at its first call, before launching anything

    def check() -> None:
        low_s, high_s, low_d, high_d = _bounds(src_rows, dst_rows)
        for side, low, high, limit in (
            ("source", low_s, high_s, limits[0]),
            ("destination", low_d, high_d, limits[1]),
        ):
            if low < 0 or high >= limit:
                value = low if low < 0 else high
                raise IndexError(
                    f"{side} row {value} (of the {side} indices) is out of range (expected 0 <= row < "
                    f"{limit}); this transfer takes several calls and was checked whole before the first: "
                    f"nothing was copied"
                )

    _remembered("checked", (src_rows, dst_rows), (limits,), check)


def _transfer(name: str, params: tuple, buffers: list, build, src_rows, dst_rows, n: int) -> None:
    """One transfer: the ops of ``build() -> (src views, dst views)`` (kept by
    the buffers' addresses and ``params``), called on rows ``(src_rows[i],
    dst_rows[i])``.  A transfer of several calls (several ops, or more rows
    than one call takes) has every row's range checked first
    (:func:`_check_split`)."""
    _state.events = []
    if n == 0:
        return
    # No swapper in the key: use_swapper() clears the ops, and otherwise a
    # buffer's address (unique in the process: UVA) names its GPU's swapper.
    key = (name, params, *map(_geometry, buffers))
    entry = _ops.get(key)
    if entry is None:
        sw = _swapper_for(buffers)
        src, dst = build()
        step = int(getattr(sw, "max_parts", 256))
        ops = [sw.prepare(src[i : i + step], dst[i : i + step]) for i in range(0, len(src), step)]
        limits = (min(v.shape[0] for v in src), min(v.shape[0] for v in dst))  # rows every part has
        host_max = int(sw.max_blocks)  # rows of one call; on the GPU at most what one launch checks
        gpu_max = min(host_max, int(getattr(getattr(sw, "_launcher", None), "check_rows_max", host_max)))
        entry = (ops, limits, host_max, gpu_max)
        with _lock:
            if len(_ops) >= _OPS_KEPT:
                _ops.clear()
            _ops[key] = entry
    ops, limits, host_max, gpu_max = entry
    rows = host_max if _framework(src_rows) == "numpy" else gpu_max
    if src_rows.ndim != 1 or dst_rows.ndim != 1:
        src_rows, dst_rows = src_rows.reshape(-1), dst_rows.reshape(-1)
    if len(ops) == 1 and src_rows.shape[0] <= rows:  # the usual transfer: one op call
        _state.events.append(ops[0]((src_rows, dst_rows)))
        return
    _check_split(src_rows, dst_rows, limits)
    for op in ops:
        for at in range(0, len(src_rows), rows):
            _state.events.append(op((src_rows[at : at + rows], dst_rows[at : at + rows])))


def _bounded(indices):
    """``indices`` clipped to ``[-1, 2**40]``: as far out of range as they
    were, and no product below can wrap an int64 back into range."""
    return indices.clip(-1, _INDEX_CLIP)


_INDEX_CLIP = 1 << 40  # tokens: past any pool's


def _page_rows(indices, page_size: int, head_num: int):
    """Rows of a page-head buffer seen one head at a time (rows of that
    head's bytes of a layer, a token apart, from the head's first page):
    token ``i`` sits ``(i // page_size) * page_size * head_num + i %
    page_size`` rows in, as the pages of the other heads lie between."""
    indices = _bounded(indices)
    return indices + (indices // page_size) * ((head_num - 1) * page_size)


def _load_page_rows(indices, page_size: int, head_num: int):
    """:func:`_page_rows` of a page-head load's source indices, made at its
    first layer and kept for the next layers (:func:`_remembered`; its four
    GPU operations cost about 59 µs of host time a layer: NOTES 86, 88):
    on the GPU, kept for calls on the stream that made them, and never
    kept from inside a capture (there they hold values only in replays)."""
    stream = 0
    if _framework(indices) == "torch" and indices.is_cuda:
        if _capturing(indices):
            return _page_rows(indices.reshape(-1), page_size, head_num)
        stream = sys.modules["torch"].cuda.current_stream(indices.device).cuda_stream
    return _remembered(
        "page_rows",
        (indices,),
        (page_size, head_num, stream),
        lambda: _page_rows(indices.reshape(-1), page_size, head_num),
    )


def _page_head_rows(indices, page_size: int, head_num: int):
    """Rows of a page-head buffer, one per (item, head): its page's heads
    are ``page_size`` items apart, its items ``head_num`` rows apart."""
    return _spread(_page_rows(indices, page_size, head_num), _offsets(indices, head_num, page_size))


def _head_rows(indices, head_num: int):
    """Rows of a layer-first buffer seen one head at a time."""
    return _spread(_bounded(indices) * head_num, _offsets(indices, head_num, 1))


# -- sgl_kernel.kvcacheio ---------------------------------------------------------


def transfer_kv_per_layer(
    src_k,
    dst_k,
    src_v,
    dst_v,
    src_indices,
    dst_indices,
    item_size: int,
    block_quota: int = 2,
    num_warps_per_block=32,
):
    """One layer's K and V items, layer-first to layer-first."""
    _check_item_size(item_size)
    n = _check_indices(src_indices, dst_indices)
    bufs = [src_k, src_v, dst_k, dst_v]

    def build():
        return [_rows(b, 0, item_size, item_size) for b in bufs[:2]], [
            _rows(b, 0, item_size, item_size) for b in bufs[2:]
        ]

    _transfer("per_layer", (item_size,), bufs, build, src_indices, dst_indices, n)


def transfer_kv_per_layer_pf_lf(
    src_k,
    dst_k,
    src_v,
    dst_v,
    src_indices,
    dst_indices,
    layer_id: int,
    item_size: int,
    src_layout_dim: int,
    block_quota: int = 2,
    num_warps_per_block=32,
):
    """Layer ``layer_id``'s items from page-first buffers (``src_layout_dim``
    bytes per token) to a layer's layer-first buffers."""
    _check_item_size(item_size)
    n = _check_indices(src_indices, dst_indices)
    bufs = [src_k, src_v, dst_k, dst_v]

    def build():
        src = [_rows(b, layer_id * item_size, src_layout_dim, item_size) for b in bufs[:2]]
        return src, [_rows(b, 0, item_size, item_size) for b in bufs[2:]]

    _transfer(
        "per_layer_pf_lf", (layer_id, item_size, src_layout_dim), bufs, build, src_indices, dst_indices, n
    )


def transfer_kv_per_layer_ph_lf(
    src_k,
    dst_k,
    src_v,
    dst_v,
    src_indices,
    dst_indices,
    layer_id: int,
    item_size: int,
    src_layout_dim: int,
    page_size: int,
    head_num: int,
    block_quota: int = 2,
    num_warps_per_block=32,
):
    """Layer ``layer_id``'s items from page-head buffers to a layer's
    layer-first buffers (one row per item, a part per head of K and of V:
    a head's bytes are the contiguous unit of this layout)."""
    _check_item_size(item_size)
    n = _check_indices(src_indices, dst_indices)
    head = item_size // head_num
    bufs = [src_k, src_v, dst_k, dst_v]

    def build():  # a part per head of K and of V: a token's head is the unit of this layout
        stride = src_layout_dim // head_num  # a (page, head, token)'s bytes of every layer
        heads = [layer_id * head + h * page_size * stride for h in range(head_num)]
        src = [_rows(b, at, stride, head) for b in bufs[:2] for at in heads]
        return src, [_rows(b, h * head, item_size, head) for b in bufs[2:] for h in range(head_num)]

    params = (layer_id, item_size, src_layout_dim, page_size, head_num)
    src_rows = _load_page_rows(src_indices, page_size, head_num) if n else src_indices
    _transfer("per_layer_ph_lf", params, bufs, build, src_rows, dst_indices, n)


def transfer_kv_all_layer(
    src_k_layers,
    dst_k_layers,
    src_v_layers,
    dst_v_layers,
    src_indices,
    dst_indices,
    item_size: int,
    num_layers: int,
    block_quota: int = 2,
    num_warps_per_block=32,
):
    """Every layer's K and V items, layer-first to layer-first; the layers
    are tables of addresses (or lists of the layer tensors)."""
    _check_item_size(item_size)
    n = _check_indices(src_indices, dst_indices)
    sk, dk = (
        _layers(src_k_layers, num_layers, "src_k_layers"),
        _layers(dst_k_layers, num_layers, "dst_k_layers"),
    )
    sv, dv = (
        _layers(src_v_layers, num_layers, "src_v_layers"),
        _layers(dst_v_layers, num_layers, "dst_v_layers"),
    )

    def build():
        return [_rows(b, 0, item_size, item_size) for b in _kv(sk, sv)], [
            _rows(b, 0, item_size, item_size) for b in _kv(dk, dv)
        ]

    _transfer("all_layer", (item_size,), [sk, sv, dk, dv], build, src_indices, dst_indices, n)


def transfer_kv_all_layer_lf_pf(
    src_k_layers,
    dst_k,
    src_v_layers,
    dst_v,
    src_indices,
    dst_indices,
    item_size: int,
    dst_layout_dim: int,
    num_layers: int,
    block_quota: int = 2,
    num_warps_per_block=32,
):
    """Every layer's K and V items from layer-first layers to page-first
    buffers (``dst_layout_dim`` bytes per token)."""
    _check_item_size(item_size)
    n = _check_indices(src_indices, dst_indices)
    sk, sv = (
        _layers(src_k_layers, num_layers, "src_k_layers"),
        _layers(src_v_layers, num_layers, "src_v_layers"),
    )

    def build():
        dst = [
            _rows(b, j * item_size, dst_layout_dim, item_size)
            for j in range(num_layers)
            for b in (dst_k, dst_v)
        ]
        return [_rows(b, 0, item_size, item_size) for b in _kv(sk, sv)], dst

    params = (item_size, dst_layout_dim, num_layers)
    _transfer("all_layer_lf_pf", params, [sk, sv, dst_k, dst_v], build, src_indices, dst_indices, n)


def transfer_kv_all_layer_lf_ph(
    src_k_layers,
    dst_k,
    src_v_layers,
    dst_v,
    src_indices,
    dst_indices,
    item_size: int,
    dst_layout_dim: int,
    num_layers: int,
    page_size: int,
    head_num: int,
    block_quota: int = 2,
    num_warps_per_block=32,
):
    """Every layer's K and V items from layer-first layers to page-head
    buffers (one row per item and head)."""
    _check_item_size(item_size)
    n = _check_indices(src_indices, dst_indices)
    head = item_size // head_num
    sk, sv = (
        _layers(src_k_layers, num_layers, "src_k_layers"),
        _layers(src_v_layers, num_layers, "src_v_layers"),
    )

    def build():
        stride = dst_layout_dim // head_num
        dst = [_rows(b, j * head, stride, head) for j in range(num_layers) for b in (dst_k, dst_v)]
        return [_rows(b, 0, head, head) for b in _kv(sk, sv)], dst

    params = (item_size, dst_layout_dim, num_layers, page_size, head_num)
    src_rows = _head_rows(src_indices.reshape(-1), head_num) if n else src_indices
    dst_rows = _page_head_rows(dst_indices.reshape(-1), page_size, head_num) if n else dst_indices
    _transfer("all_layer_lf_ph", params, [sk, sv, dst_k, dst_v], build, src_rows, dst_rows, n * head_num)


def transfer_kv_per_layer_mla(
    src, dst, src_indices, dst_indices, item_size: int, block_quota: int = 2, num_warps_per_block=32
):
    """One layer's MLA items, layer-first to layer-first."""
    _check_item_size(item_size)
    n = _check_indices(src_indices, dst_indices)

    def build():
        return [_rows(src, 0, item_size, item_size)], [_rows(dst, 0, item_size, item_size)]

    _transfer("per_layer_mla", (item_size,), [src, dst], build, src_indices, dst_indices, n)


def transfer_kv_per_layer_mla_pf_lf(
    src,
    dst,
    src_indices,
    dst_indices,
    layer_id: int,
    item_size: int,
    src_layout_dim: int,
    block_quota: int = 2,
    num_warps_per_block=32,
):
    """Layer ``layer_id``'s MLA items from a page-first buffer to a layer's
    layer-first buffer."""
    _check_item_size(item_size)
    n = _check_indices(src_indices, dst_indices)

    def build():
        return [_rows(src, layer_id * item_size, src_layout_dim, item_size)], [
            _rows(dst, 0, item_size, item_size)
        ]

    params = (layer_id, item_size, src_layout_dim)
    _transfer("per_layer_mla_pf_lf", params, [src, dst], build, src_indices, dst_indices, n)


def transfer_kv_all_layer_mla(
    src_layers,
    dst_layers,
    src_indices,
    dst_indices,
    item_size: int,
    num_layers: int,
    block_quota: int = 2,
    num_warps_per_block=32,
):
    """Every layer's MLA items, layer-first to layer-first (tables or lists)."""
    _check_item_size(item_size)
    n = _check_indices(src_indices, dst_indices)
    src, dst = _layers(src_layers, num_layers, "src_layers"), _layers(dst_layers, num_layers, "dst_layers")

    def build():
        return [_rows(b, 0, item_size, item_size) for b in src], [
            _rows(b, 0, item_size, item_size) for b in dst
        ]

    _transfer("all_layer_mla", (item_size,), [src, dst], build, src_indices, dst_indices, n)


def transfer_kv_all_layer_mla_lf_pf(
    src_layers,
    dst,
    src_indices,
    dst_indices,
    item_size: int,
    dst_layout_dim: int,
    num_layers: int,
    block_quota: int = 2,
    num_warps_per_block=32,
):
    """Every layer's MLA items from layer-first layers to a page-first buffer."""
    _check_item_size(item_size)
    n = _check_indices(src_indices, dst_indices)
    src = _layers(src_layers, num_layers, "src_layers")

    def build():
        dst_parts = [_rows(dst, j * item_size, dst_layout_dim, item_size) for j in range(num_layers)]
        return [_rows(b, 0, item_size, item_size) for b in src], dst_parts

    params = (item_size, dst_layout_dim, num_layers)
    _transfer("all_layer_mla_lf_pf", params, [src, dst], build, src_indices, dst_indices, n)


def _check_pages(n: int, page_size: int) -> None:
    if page_size <= 0:
        raise ValueError(f"Page size must be positive, got {page_size}")
    if n % page_size:
        raise ValueError(f"Source indices size must be divisible by page size, got {n} and {page_size}")


def transfer_kv_direct(src_layers, dst_layers, src_indices, dst_indices, page_size: int):
    """Tokens ``src_indices`` of every layer tensor to tokens ``dst_indices``
    of the matching one (any layout whose axis 0 is tokens)."""
    if len(src_layers) != len(dst_layers):
        raise ValueError("Source and destination layers must have the same number of layers")
    n = _check_indices(src_indices, dst_indices)
    _check_pages(n, page_size)
    src, dst = list(src_layers), list(dst_layers)

    def build():
        return [_rows(b, 0, _token_bytes(b), _token_bytes(b)) for b in src], [
            _rows(b, 0, _token_bytes(b), _token_bytes(b)) for b in dst
        ]

    _transfer("direct", (), src + dst, build, src_indices, dst_indices, n)


def transfer_kv_per_layer_direct_pf_lf(
    src_ptrs, dst_ptrs, src_indices, dst_indices, layer_id: int, page_size: int
):
    """Host pages ``[pages, layers, page_size, ...]`` (K and V, or one for
    MLA) to tokens of layer tensors: page ``src_indices[i * page_size] //
    page_size``, layer ``layer_id + j``, to tokens from ``dst_indices[i *
    page_size]`` of ``dst_ptrs[j]`` (and V to ``dst_ptrs[j + layers]``)."""
    n = _check_indices(src_indices, dst_indices)
    _check_pages(n, page_size)
    mla = len(src_ptrs) == 1
    layers = len(dst_ptrs) if mla else len(dst_ptrs) // 2
    host, dst = list(src_ptrs), list(dst_ptrs)
    token, held = _token_bytes(dst[0]), host[0].shape[1]  # bytes per token, layers the host pages hold

    def build():
        src, out = [], []
        for j in range(layers):
            for kv, h in enumerate(host):
                src.append(_rows(h, (layer_id + j) * page_size * token, token, token))
                out.append(_rows(dst[j + kv * layers], 0, token, token))
        return src, out

    pages = n // page_size
    if pages:
        offsets = _offsets(src_indices, page_size, 1)
        first = _bounded(src_indices.reshape(-1)[::page_size])
        src_rows = _spread((first // page_size) * (held * page_size), offsets)
        dst_rows = _spread(dst_indices.reshape(-1)[::page_size], offsets)
    else:
        src_rows, dst_rows = src_indices, dst_indices
    _transfer("per_layer_direct_pf_lf", (layer_id, page_size), host + dst, build, src_rows, dst_rows, n)


def transfer_kv_all_layer_direct_lf_pf(src_ptrs, dst_ptrs, src_indices, dst_indices, page_size: int):
    """Tokens of every layer tensor (K layers then V layers, or MLA's) to
    host pages ``[pages, layers, page_size, ...]``: tokens from
    ``src_indices[i * page_size]`` to page ``dst_indices[i * page_size] //
    page_size`` (one row per page)."""
    n = _check_indices(src_indices, dst_indices)
    _check_pages(n, page_size)
    mla = len(dst_ptrs) == 1
    layers = len(src_ptrs) if mla else len(src_ptrs) // 2
    src, host = list(src_ptrs), list(dst_ptrs)
    token, held = _token_bytes(src[0]), host[0].shape[1]

    def build():
        page = page_size * token
        src_parts, dst_parts = [], []
        for j in range(layers):
            for kv, h in enumerate(host):
                src_parts.append(_rows(src[j + kv * layers], 0, token, page))  # a page from any token
                dst_parts.append(_rows(h, j * page, held * page, page))
        return src_parts, dst_parts

    if n:
        src_rows = src_indices.reshape(-1)[::page_size] * 1  # a contiguous copy
        dst_rows = dst_indices.reshape(-1)[::page_size] // page_size
    else:
        src_rows, dst_rows = src_indices, dst_indices
    _transfer("all_layer_direct_lf_pf", (page_size,), src + host, build, src_rows, dst_rows, n // page_size)


# -- SGLang's host pools ---------------------------------------------------------

_TABLES_OF = (  # (table attribute, layer buffers attribute) of a host pool and of its device pool
    ("k_data_ptrs", "k_data_refs"),
    ("v_data_ptrs", "v_data_refs"),
    ("data_ptrs", "data_refs"),
    ("packed_device_k_data_ptrs", "packed_device_k_buffers"),
    ("packed_device_v_data_ptrs", "packed_device_v_buffers"),
    ("packed_device_data_ptrs", "packed_device_kv_buffers"),
)
_DEVICE_TABLES_OF = (("k_data_ptrs", "k_buffer"), ("v_data_ptrs", "v_buffer"), ("data_ptrs", "kv_buffer"))


def adopt(pool) -> None:
    """Make an SGLang host pool's ``io_backend="kernel"`` transfers reach the
    kvcacheio names of its module (its own JIT kernels off), and register
    its and its device pool's tables of layer addresses."""
    for flag in ("can_use_jit", "can_use_write_back_jit"):
        if hasattr(pool, flag):
            setattr(pool, flag, False)
    device_pool = getattr(pool, "device_pool", None)
    for owner, pairs in ((pool, _TABLES_OF), (device_pool, _DEVICE_TABLES_OF)):
        for table_name, buffers_name in pairs:
            table, buffers = getattr(owner, table_name, None), getattr(owner, buffers_name, None)
            if table is not None and isinstance(buffers, (list, tuple)) and len(buffers):
                register_layers(table, buffers)


class Patch:
    """What :func:`patch_host_pools` changed; :meth:`undo` puts it back."""

    def __init__(self):
        self.names: list = []  # (module, name, the previous value)
        self.classes: list = []  # (class, its own __init__)

    def undo(self) -> None:
        for module, name, old in reversed(self.names):
            setattr(module, name, old)
        for cls, init in reversed(self.classes):
            cls.__init__ = init
        self.names, self.classes = [], []


def patch_host_pools(modules=None, *, direct: bool = False) -> Patch:
    """Route SGLang's HiCache host pools to this module, in this process.

    In each of ``modules`` (default: those of :data:`HOST_POOL_MODULES` that
    import), every kvcacheio name of :data:`KERNEL_FUNCTIONS` (and of
    :data:`DIRECT_FUNCTIONS` with ``direct=True``) the module holds becomes
    this module's, and every host pool class of :data:`HOST_POOL_CLASSES` it
    defines calls :func:`adopt` at the end of its ``__init__``.
    """
    if modules is None:
        modules = []
        for name in HOST_POOL_MODULES:
            try:
                modules.append(importlib.import_module(name))
            except ImportError:
                continue
        if not modules:
            raise ImportError(
                f"patch_host_pools: none of {', '.join(HOST_POOL_MODULES)} imports (is SGLang installed?)"
            )
    patch, here = Patch(), sys.modules[__name__]
    names = KERNEL_FUNCTIONS + (DIRECT_FUNCTIONS if direct else ())
    for module in modules:
        for name in names:
            if hasattr(module, name):
                patch.names.append((module, name, getattr(module, name)))
                setattr(module, name, getattr(here, name))
        for cls_name in HOST_POOL_CLASSES:
            cls = module.__dict__.get(cls_name)
            if cls is None or getattr(cls.__init__, "_cupy_swap_adopts", False):
                continue
            patch.classes.append((cls, cls.__init__))
            cls.__init__ = _adopting(cls.__init__)
    return patch


def _adopting(init):
    """``init``, then :func:`adopt` of the pool it built."""

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        adopt(self)

    __init__._cupy_swap_adopts = True
    return __init__


__all__ = [
    *KERNEL_FUNCTIONS,
    *DIRECT_FUNCTIONS,
    "register_layers",
    "use_swapper",
    "last_events",
    "adopt",
    "patch_host_pools",
    "Patch",
    "SGL_KERNEL_COMMIT",
]
