"""Turn the arrays a caller passes into *parts*: plain descriptions of memory.

A part is one array taking part in a swap (say layer 3's V cache).  Axis 0
indexes blocks; one block ``a[i]`` must be C-contiguous; the stride between
blocks is free, so views such as ``host_cache[:, layer, 0]`` of a block-first
cache ``[num_blocks, layers, 2, ...]`` are parts too.

Nothing here touches the GPU: a part only records addresses and geometry, so
the checks run (and are tested) on machines without one.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np

__all__ = ["Part", "as_parts", "HOST", "DEVICE"]

HOST = "host"
DEVICE = "device"


@dataclass(frozen=True)
class Part:
    """One array of a swap, reduced to what the kernel needs.

    Attributes
    ----------
    name : str
        How error messages name it, e.g. ``"dst[3]"``.
    location : str
        ``"host"`` (NumPy memory) or ``"device"`` (GPU memory).
    device : int or None
        GPU ordinal of a device part.
    ptr : int
        Address of block 0 (a host address for host parts).
    num_blocks : int
        Length of axis 0.
    block_stride : int
        Bytes from block ``i`` to block ``i + 1`` (any sign).
    block_bytes : int
        Bytes in one block.
    block_shape : tuple of int
        Shape of one block, ``array.shape[1:]``.
    dtype : numpy.dtype
        Element type.
    writeable : bool
        False for read-only NumPy arrays.

    A part holds no reference to the caller's array, so a cached layout
    never keeps a dropped cache alive; the caller keeps its arrays alive
    while swaps on them are queued (as with any asynchronous copy).
    """

    name: str
    location: str
    device: int | None
    ptr: int
    num_blocks: int
    block_stride: int
    block_bytes: int
    block_shape: tuple
    dtype: np.dtype
    writeable: bool

    def span(self) -> tuple[int, int]:
        """Lowest and one-past-highest byte address the part can touch."""
        if self.num_blocks == 0:
            return self.ptr, self.ptr
        last = self.ptr + (self.num_blocks - 1) * self.block_stride
        lo, hi = min(self.ptr, last), max(self.ptr, last)
        return lo, hi + self.block_bytes


def _is_block_contiguous(shape: tuple, strides: tuple, itemsize: int) -> bool:
    """True when one block (axes 1..) is C-contiguous; size-1 axes are free."""
    expected = itemsize
    for size, stride in zip(reversed(shape[1:]), reversed(strides[1:])):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True


def _describe(array, name: str, convert=None) -> Part:
    """Describe one array as a part, or raise naming ``name``; ``convert``
    views other arrays (torch, DLPack) as NumPy or CuPy ones."""
    cupy = sys.modules.get("cupy")
    if isinstance(array, np.ndarray):
        location, device = HOST, None
        ptr = array.__array_interface__["data"][0]
        writeable = bool(array.flags.writeable)
    elif cupy is not None and isinstance(array, cupy.ndarray):
        location, device = DEVICE, array.device.id
        ptr = array.data.ptr
        writeable = True
    else:
        converted = (convert or _numpy_view)(array, name)
        if converted is None:
            raise TypeError(
                f"{name}: expected a cupy.ndarray (GPU) or a numpy.ndarray in pinned host "
                f"memory, got {type(array).__module__}.{type(array).__qualname__}"
            )
        return _describe(converted, name)  # a NumPy or CuPy array now

    shape, strides, dtype = array.shape, array.strides, array.dtype
    if len(shape) == 0:
        raise ValueError(f"{name}: expected an array with a block axis (ndim >= 1), got a 0-d array")
    if dtype.hasobject:
        raise TypeError(f"{name}: expected a plain numeric dtype, got {dtype} (holds Python objects)")
    block_bytes = dtype.itemsize
    for s in shape[1:]:
        block_bytes *= s
    # An array with no elements has no layout to check (NumPy and torch may
    # give it any strides); its swaps move no bytes.
    empty = 0 in shape
    if not empty and not _is_block_contiguous(shape, strides, dtype.itemsize):
        raise ValueError(
            f"{name}: expected each block {name}[i] to be C-contiguous, got shape {shape} "
            f"with strides {strides}; use a view whose trailing axes are contiguous "
            f"(e.g. cache[:, layer] of a block-first cache) or ascontiguousarray()"
        )
    return Part(
        name=name,
        location=location,
        device=device,
        ptr=int(ptr),
        num_blocks=int(shape[0]),
        block_stride=int(strides[0]),
        block_bytes=int(block_bytes),
        block_shape=tuple(shape[1:]),
        dtype=dtype,
        writeable=writeable,
    )


def _numpy_view(obj, name: str):
    """NumPy's view of an object exposing ``__array_interface__`` (the
    conversion used when no GPU-aware ``convert`` is given), else None."""
    return np.asarray(obj) if hasattr(obj, "__array_interface__") else None


def _is_single_array(obj) -> bool:
    return (
        isinstance(obj, np.ndarray)
        or hasattr(obj, "__cuda_array_interface__")
        or hasattr(obj, "__dlpack__")
        or hasattr(obj, "__array_interface__")
    )


def as_parts(obj, name: str, convert=None) -> list[Part]:
    """Describe ``obj`` (one array, or a sequence of arrays) as a list of parts.

    Parameters
    ----------
    obj : array or sequence of arrays
        Each array has shape ``(num_blocks, *block_shape)``.
    name : str
        Argument name for error messages (``"src"`` or ``"dst"``).
    convert : callable, optional
        ``convert(obj, name)``: a NumPy or CuPy view of a foreign array, or
        None (:func:`cupy_swap.cuda.arrays.convert_array`).

    Returns
    -------
    list of Part
        One part per array, in order.
    """
    if _is_single_array(obj):
        return [_describe(obj, name, convert)]
    if isinstance(obj, (list, tuple)):
        if len(obj) == 0:
            raise ValueError(f"{name}: expected at least one array, got an empty sequence")
        return [_describe(a, f"{name}[{i}]", convert) for i, a in enumerate(obj)]
    raise TypeError(f"{name}: expected an array or a list/tuple of arrays, got {type(obj).__name__}")
