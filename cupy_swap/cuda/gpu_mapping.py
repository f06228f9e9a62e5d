"""Mappings that already live on the GPU, as SGLang and LMCache keep them:
an int64 ``(N, 2)`` array of rows, or a tuple of two 1-D int64 arrays (source
indices, destination indices: the pair form, by the one rule of
:func:`cupy_swap.core.mapping.index_pair`), as CuPy arrays or torch CUDA
tensors.  The host never
reads them: the copy launch reads the indices by address and checks them
itself (:mod:`.status`), so a swap costs no host synchronization."""

from __future__ import annotations

import sys
from typing import NamedTuple

import numpy as np

from ..core.mapping import index_pair

_INT64 = np.dtype(np.int64)


class DeviceRows(NamedTuple):
    """Where a GPU mapping's indices are: row ``i``'s source block at
    ``src + 8 * step * i``, its destination block at ``dst + 8 * step * i``;
    ``keep`` holds the arrays."""

    src: int
    dst: int
    step: int
    n: int
    keep: object


def _describe(obj):
    """(device, address, C-contiguous, int64, shape) of a GPU array, or None."""
    cupy = sys.modules.get("cupy")
    if cupy is not None and type(obj) is cupy.ndarray:
        return obj.data.device_id, obj.data.ptr, obj.flags.c_contiguous, obj.dtype == _INT64, obj.shape
    if getattr(obj, "is_cuda", False):  # torch CUDA tensor
        int64 = obj.dtype is sys.modules["torch"].int64
        return obj.get_device(), obj.data_ptr(), obj.is_contiguous(), int64, tuple(obj.shape)
    return None


def device_rows(obj, device: int, max_blocks: int) -> DeviceRows | None:
    """The GPU mapping ``obj`` describes, or None for host mappings.

    Raises
    ------
    TypeError, ValueError
        A GPU array that is not C-contiguous int64 of shape (N, 2) (or two
        of shape (N,)) on ``device``, or with more than ``max_blocks`` rows
        (checked without reading it); a tuple of other than two sequences,
        wherever they live (:func:`~cupy_swap.core.mapping.index_pair`).
    """
    if type(obj) is list:  # rows on the host (the common form after NumPy's, taken first by the caller)
        return None
    if index_pair(obj):  # a tuple: two 1-D arrays (src, dst); any other length raises
        a, b = (_describe(x) for x in obj)
        if a is None and b is None:
            return None
        if a is None or b is None or len(a[4]) != 1 or len(b[4]) != 1 or a[4] != b[4]:
            raise ValueError(
                "block_mapping: expected two 1-D GPU arrays of one length (source and destination "
                f"indices), got shapes {getattr(obj[0], 'shape', None)} and {getattr(obj[1], 'shape', None)}"
            )
        for d in (a, b):
            _check(d, device)
        n = a[4][0]
        rows = DeviceRows(a[1], b[1], 1, n, obj)
    else:
        d = _describe(obj)
        if d is None:
            return None
        _check(d, device)
        if len(d[4]) != 2 or d[4][1] != 2:
            raise ValueError(
                f"block_mapping: expected shape (N, 2) of (src_block, dst_block) rows, got {d[4]}"
            )
        n = d[4][0]
        rows = DeviceRows(d[1], d[1] + 8, 2, n, obj)
    if n > max_blocks:
        raise ValueError(
            f"block_mapping: expected at most max_blocks={max_blocks} rows, got {n}; "
            f"create the BlockSwapper with a larger max_blocks or split the swap"
        )
    return rows


def _check(d, device: int) -> None:
    owner, _, contiguous, int64, _ = d
    if not int64:
        raise TypeError("block_mapping: expected int64 block indices on the GPU; convert them first")
    if not contiguous:
        raise ValueError("block_mapping: expected C-contiguous GPU arrays; make a contiguous copy first")
    if owner != device:
        raise ValueError(
            f"block_mapping: expected a mapping on GPU {device} (the swapper's), got one on GPU {owner}"
        )


def device_word(obj, device: int, name: str) -> int:
    """The device address of ``obj``, one int64 on GPU ``device`` (a CuPy
    array or torch tensor of one element).

    Raises
    ------
    TypeError, ValueError
        Naming ``name``: not a GPU array, not int64, not one element, or on
        another GPU."""
    d = _describe(obj)
    if d is None:
        raise TypeError(f"{name}: expected a CuPy array or torch CUDA tensor, got {type(obj).__name__}")
    owner, ptr, _, int64, shape = d
    if not int64:
        raise TypeError(f"{name}: expected int64, got {getattr(obj, 'dtype', None)}")
    if int(np.prod(shape, dtype=np.int64)) != 1:
        raise ValueError(f"{name}: expected one element (shape () or (1,)), got shape {shape}")
    if owner != device:
        raise ValueError(f"{name}: expected an array on GPU {device} (the swapper's), got one on GPU {owner}")
    return ptr
