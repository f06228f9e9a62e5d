"""Turn the arrays a caller passes into *parts*: plain descriptions of memory
(no GPU needed).

A part is one array of a swap (say layer 3's V cache).  Axis 0 indexes
blocks; one block ``a[i]`` must be C-contiguous; the stride between blocks
is free, so views such as ``host_cache[:, layer, 0]`` are parts too.

An element type NumPy lacks (torch's ``bfloat16``, ``float8_*`` ...) is
viewed as the integer type of its width, and the part's ``dtype`` is an
:class:`ElementType` keeping the caller's type.  It pairs with the same
type, with a NumPy integer type of its width (vLLM's uint8 fp8 caches) and
with a NumPy type of its name (ml_dtypes' ``float8_e4m3fn``); never with
another such type or a NumPy float (the same bytes mean other numbers).

Host parts whose blocks tile whole rows of one pool form *copy groups*
(:func:`copy_groups`, kept in ``Layout.host_groups``): a staged swap
(:mod:`cupy_swap.staged`) copies a run of their rows in one copy.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

import numpy as np

HOST = "host"
DEVICE = "device"


@dataclass(frozen=True, eq=False)
class ElementType:
    """An element type NumPy lacks, held in an array of another NumPy type.

    Parameters
    ----------
    name : str
        The caller's type, as its framework spells it (``"torch.bfloat16"``).
    carrier : numpy.dtype
        The integer type of the same width whose array holds the bytes.

    ``==`` is the pairing rule of the module docstring (not transitive:
    ``torch.float8_e4m3fn == uint8 == torch.float8_e5m2``); ``str()`` is
    ``name``.
    """

    name: str
    carrier: np.dtype
    hasobject = False  # as numpy.dtype: plain bytes, never Python objects

    @property
    def short_name(self) -> str:
        """``name`` without its framework prefix: ``"bfloat16"``."""
        return self.name.rpartition(".")[2]

    @property
    def itemsize(self) -> int:
        return self.carrier.itemsize

    def __eq__(self, other):
        if isinstance(other, ElementType):
            return other.short_name == self.short_name
        if isinstance(other, (type, str)):  # np.uint8, "uint8": what np.dtype() takes
            try:
                other = np.dtype(other)
            except TypeError:
                return NotImplemented
        if isinstance(other, np.dtype):
            storage = other.kind in "iu" and other.itemsize == self.itemsize
            return storage or other.name == self.short_name
        return NotImplemented  # numpy.dtype returns it too, so dtype != ElementType lands here

    def __hash__(self):
        return hash(self.short_name)

    def __str__(self):
        return self.name


class TypedView(NamedTuple):
    """What ``convert`` returns for an array of a type NumPy lacks: an array
    over the same memory as ``dtype.carrier``, and the caller's type."""

    array: Any
    dtype: ElementType


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
    dtype : numpy.dtype or ElementType
        Element type: an :class:`ElementType` for a type NumPy lacks
        (``torch.float8_e4m3fn``), whose bytes ``block_shape`` and
        ``block_bytes`` describe as ``dtype.carrier``.
    writeable : bool
        False for read-only NumPy arrays.

    A part holds no reference to the caller's array (a cached layout never
    keeps a dropped cache alive).
    """

    name: str
    location: str
    device: int | None
    ptr: int
    num_blocks: int
    block_stride: int
    block_bytes: int
    block_shape: tuple
    dtype: np.dtype | ElementType
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
    """Describe one array as a part, or raise naming ``name`` (``convert``: as
    in :func:`as_parts`)."""
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
        if isinstance(converted, TypedView):  # the bytes of a type NumPy lacks
            return replace(_describe(converted.array, name), dtype=converted.dtype)
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
    return np.asarray(obj) if readable(obj, "__array_interface__", name) else None


_ARRAY_PROTOCOLS = ("__cuda_array_interface__", "__dlpack__", "__array_interface__")


def _offers(obj, attr: str) -> bool:
    """True when ``obj`` defines ``attr``, even if reading it raises (torch's
    ``__cuda_array_interface__`` does for bfloat16: still an array)."""
    try:
        return readable(obj, attr, "")
    except TypeError:  # it raised: offered, not served
        return True


def readable(obj, attr: str, name: str) -> bool:
    """True when ``obj`` has a readable ``attr``, False when it has none;
    TypeError naming ``name`` when reading it raises anything else."""
    try:
        getattr(obj, attr)
    except AttributeError:
        return False
    except Exception as e:
        raise TypeError(
            f"{name}: expected an array whose {attr} can be read, got a "
            f"{type(obj).__module__}.{type(obj).__qualname__} whose {attr} raised "
            f"{type(e).__name__}: {e}"
        ) from e
    return True


def _is_torch_tensor(obj) -> bool:
    # Asked first, so torch's array-interface properties are never read here;
    # sys.modules: a caller passing a tensor has imported torch already.
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


def _is_single_array(obj) -> bool:
    return (
        isinstance(obj, np.ndarray)
        or _is_torch_tensor(obj)
        or any(_offers(obj, attr) for attr in _ARRAY_PROTOCOLS)
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
        ``convert(obj, name)``: a NumPy or CuPy view (or :class:`TypedView`) of
        a foreign array, or None (:func:`cupy_swap.cuda.arrays.convert_array`).
    """
    if _is_single_array(obj):
        return [_describe(obj, name, convert)]
    if isinstance(obj, (list, tuple)):
        if len(obj) == 0:
            raise ValueError(f"{name}: expected at least one array, got an empty sequence")
        return [_describe(a, f"{name}[{i}]", convert) for i, a in enumerate(obj)]
    raise TypeError(f"{name}: expected an array or a list/tuple of arrays, got {type(obj).__name__}")


@dataclass(frozen=True)
class CopyGroup:
    """Host parts whose blocks tile whole rows of one pool, so ``k``
    consecutive blocks of all of them are one contiguous range.

    Attributes
    ----------
    host_ptr : int
        Host address of block 0's row (the lowest part's block 0).
    row_bytes : int
        The parts' block stride: bytes a block occupies in the pool, all of
        them swapped (no bytes of arrays outside the swap).
    parts : tuple of int
        Indices of the parts (into the swap's ``src``).
    offsets : tuple of int
        Byte offset of each part's block within a row.
    """

    host_ptr: int
    row_bytes: int
    parts: tuple
    offsets: tuple


def copy_groups(parts: list[Part]) -> list[CopyGroup] | None:
    """Group host parts into :class:`CopyGroup` s (a packed array alone, views
    ``pool[:, i]`` that together cover every byte of a row), or None when a
    part's rows hold bytes outside the swap or its blocks descend."""
    groups: list[CopyGroup] = []
    members: list[int] = []
    for i in sorted(range(len(parts)), key=lambda i: (parts[i].ptr, i)):
        p = parts[i]
        if members:
            first = parts[members[0]]
            end = parts[members[-1]].ptr + parts[members[-1]].block_bytes
            if p.ptr != end or p.block_stride != first.block_stride or p.num_blocks != first.num_blocks:
                return None
        elif p.block_stride < p.block_bytes:
            return None
        members.append(i)
        first = parts[members[0]]
        span = p.ptr + p.block_bytes - first.ptr
        if span == first.block_stride:
            groups.append(
                CopyGroup(first.ptr, span, tuple(members), tuple(parts[j].ptr - first.ptr for j in members))
            )
            members = []
        elif span > first.block_stride:
            return None
    return None if members else groups


def groups_problem(parts: list[Part]) -> str:
    """Why :func:`copy_groups` refused ``parts``, in words (error path only)."""
    for p in parts:
        if p.block_stride < 0:
            return (
                f"copies runs of host blocks in ascending address order, but {p.name} has a "
                f"negative block stride ({p.block_stride} bytes: a reversed view); pass the "
                f"forward array and reverse the mapping instead"
            )
    for p in parts:
        if p.num_blocks > 1 and p.block_stride < p.block_bytes:
            return (
                f"copies whole host rows, but {p.name}'s blocks overlap (block stride "
                f"{p.block_stride} bytes for {p.block_bytes}-byte blocks)"
            )
    return (
        "copies whole runs of host rows, but the host parts' rows hold bytes of arrays that "
        "are not in this swap (pass every view of a block-first pool, or packed arrays)"
    )
