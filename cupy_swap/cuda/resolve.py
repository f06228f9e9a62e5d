"""Device-visible addresses of a checked layout: host parts get their pinned
buffer's device alias, GPU parts are checked to be on the swapper's GPU;
then the vector width and the kernel's part table (:mod:`.abi`)."""

from __future__ import annotations

import numpy as np

from ..core.layout import Layout, vector_width
from ..core.parts import DEVICE, HOST, Part
from . import abi, memory, pools


def _resolve_part(part: Part, device: int, mapped: bool) -> int | None:
    """Device-visible base address of a part; None for pinned host parts where
    host memory cannot be mapped (the copy engines use the host address)."""
    if part.location == DEVICE:
        if part.device != device:
            raise ValueError(
                f"{part.name}: expected an array on GPU {device} (the swapper's device), "
                f"got one on GPU {part.device}"
            )
        return part.ptr
    lo, hi = part.span()
    if hi == lo or part.block_bytes == 0:
        return part.ptr  # no byte of it is ever copied: pinned or not, no alias needed
    pooled = pools.resolve_span(part, lo, hi, mapped)  # a pool pinned in chunks (issue 41, cuda/pools.py)
    if pooled is not pools.NOT_A_POOL:
        return pooled
    alias = memory.host_alias(lo, hi - lo) if mapped else 0
    if not mapped and memory.host_pinned_unmapped(lo):
        return None
    if not alias:
        raise ValueError(
            f"{part.name}: expected page-locked (pinned) host memory, got pageable memory; "
            f"allocate it with cupy_swap.empty_pinned() or pin it once with "
            f"cupy_swap.register_host(array)"
        )
    return part.ptr + (alias - lo)


def resolve_layout(layout: Layout, device: int) -> Layout:
    """Fill in device-visible addresses, the vector width and the part table
    (asks the driver about host memory, so it needs a GPU)."""
    layout.generation = memory.generation()  # before resolving: a change meanwhile resolves again
    has_host = any(p.location == HOST for p in layout.src + layout.dst)
    mapped, why = memory.host_mapping_status(device) if has_host else (True, "")
    layout.src_addrs = [_resolve_part(p, device, mapped) for p in layout.src]
    layout.dst_addrs = [_resolve_part(p, device, mapped) for p in layout.dst]
    layout.kernel_ok = None not in layout.src_addrs and None not in layout.dst_addrs
    layout.unmapped_reason = "" if layout.kernel_ok else (pools.unmapped_reason(layout) or why)
    # Parts with zero-byte blocks move nothing: their (arbitrary) addresses
    # and strides must not narrow the vectors of the others.
    moving = [i for i, p in enumerate(layout.src) if p.block_bytes]
    values = [a for i in moving for a in (layout.src_addrs[i], layout.dst_addrs[i]) if a is not None]
    values += [p.block_stride for i in moving for p in (layout.src[i], layout.dst[i])]
    values += [layout.src[i].block_bytes for i in moving]
    width = vector_width(values)
    units = [p.block_bytes // width for p in layout.src]
    table = np.empty((len(units), abi.PART_WORDS), dtype=np.int64)
    first = 0
    for i, (s, d) in enumerate(zip(layout.src, layout.dst)):
        addrs = (layout.src_addrs[i] or s.ptr, layout.dst_addrs[i] or d.ptr)  # unmapped: never launched
        table[i] = (*addrs, s.block_stride, d.block_stride, units[i], first)
        first += units[i]
    layout.width = width
    layout.table = table.reshape(-1)
    layout.units_per_pair = first
    return layout
