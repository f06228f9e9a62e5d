"""Zero-copy views of other frameworks' arrays (torch tensors and any object
speaking ``__cuda_array_interface__``, DLPack or ``__array_interface__``)."""

from __future__ import annotations

import sys

import numpy as np

from ..core.parts import ElementType, TypedView, readable

# torch dtypes NumPy and CuPy have under the same name.
_PLAIN = frozenset(
    "bool uint8 int8 uint16 int16 uint32 int32 uint64 int64 float16 float32 float64 complex64 complex128".split()
)
# A tensor leaves torch as the integer type of its width: every torch >= 2.4
# exports these through DLPack and .numpy(), which is not so for bool, the
# unsigned types past uint8 (DLPack and .numpy() in some versions) or the
# types NumPy lacks (none).  Same width, so shape and strides stay.
_CARRIERS = {1: "uint8", 2: "int16", 4: "int32", 8: "int64"}


def _torch_tensor(obj):
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        return torch
    return None


def convert_array(obj, name: str):
    """View ``obj``'s memory as a CuPy or NumPy array, copying nothing, or None
    when ``obj`` is no array this library understands.

    Torch CUDA tensors become CuPy arrays read from ``data_ptr()`` and
    ``stride()`` (no DLPack: nothing is recorded on a stream that may be
    capturing), CPU tensors NumPy arrays; a type NumPy lacks comes as a
    :class:`~cupy_swap.core.parts.TypedView` of the integer type of its width
    (uint8 where there is none, widening the last axis).  Other objects go
    through ``__cuda_array_interface__``, ``__array_interface__`` or
    ``__dlpack__``, in that order.  TypeError, naming ``name``, for a tensor
    that cannot be viewed or a protocol that raises.
    """
    torch = _torch_tensor(obj)
    if torch is not None:
        return _torch_view(obj, torch, name)
    # A protocol that raises when read is skipped while another one serves;
    # if none does, the first failure is reported, naming the argument.
    failed = None
    for attr, view in (
        ("__cuda_array_interface__", _cupy_asarray),
        ("__array_interface__", np.asarray),
        ("__dlpack__", _cupy_from_dlpack),
    ):
        try:
            offered = readable(obj, attr, name)
        except TypeError as e:
            failed = failed or e
            continue
        if offered:
            return view(obj)
    if failed is not None:
        raise failed
    return None


def _cupy_asarray(obj):
    import cupy

    return cupy.asarray(obj)


def _cupy_from_dlpack(obj):
    import cupy

    return cupy.from_dlpack(obj)


def _torch_view(obj, torch, name: str):
    """:func:`convert_array` of a torch tensor."""
    t = obj.detach()
    dtype = t.dtype
    if t.device.type not in ("cuda", "cpu"):
        raise TypeError(f"{name}: expected a CUDA or CPU tensor, got a tensor on {t.device}")
    if t.layout != torch.strided:
        raise TypeError(f"{name}: expected a dense (strided) tensor, got layout {t.layout}")
    if t.is_conj() or t.is_neg():
        # A lazy conjugate/negation: the memory does not hold the values.
        raise TypeError(
            f"{name}: expected a tensor whose memory holds its values, got a lazy "
            f"{'conjugate' if t.is_conj() else 'negative'} view; pass "
            f"{'t.resolve_conj()' if t.is_conj() else 't.resolve_neg()'} (a copy)"
        )
    short = str(dtype).rpartition(".")[2]
    plain = np.dtype(short) if short in _PLAIN else None
    width = t.element_size()
    carrier = _CARRIERS.get(width)
    try:
        if carrier is not None:
            t = t.view(getattr(torch, carrier))
        elif plain is None:
            t = t.view(torch.uint8)  # no integer of this width: bytes, last axis widened
        if t.is_cuda:
            array = _cupy_view(t)
        else:
            array = t.numpy()
    except (RuntimeError, TypeError, ValueError, NotImplementedError) as e:
        raise TypeError(f"{name}: could not view the memory of a {dtype} tensor without copying ({e})") from e
    if plain is not None:
        return array if array.dtype == plain else array.view(plain)  # same width: a view
    return TypedView(array, ElementType(str(dtype), array.dtype))


def _cupy_view(t):
    """A CuPy array over a CUDA tensor's memory, owned by the tensor
    (``UnownedMemory`` with the device given makes no CUDA call)."""
    import cupy

    itemsize = t.element_size()
    shape, strides = tuple(t.shape), tuple(itemsize * st for st in t.stride())
    low = sum(st * (n - 1) for n, st in zip(shape, strides) if st < 0 and n)
    high = sum(st * (n - 1) for n, st in zip(shape, strides) if st > 0 and n) + itemsize
    size = 0 if 0 in shape else high - low
    memory = cupy.cuda.UnownedMemory(t.data_ptr() + low, size, t, device_id=t.device.index)
    pointer = cupy.cuda.MemoryPointer(memory, -low)
    return cupy.ndarray(shape, dtype=str(t.dtype).rpartition(".")[2], memptr=pointer, strides=strides)
