"""Zero-copy views of other frameworks' arrays (torch tensors and any object
speaking ``__cuda_array_interface__``, DLPack or ``__array_interface__``)."""

from __future__ import annotations

import contextlib
import sys

import numpy as np

__all__ = ["convert_array", "stream_handle", "stream_device", "stream_on_device", "on_device"]


def _torch_tensor(obj):
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        return torch
    return None


def _torch_fp8(torch) -> tuple:
    names = ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu")
    return tuple(getattr(torch, n) for n in names if hasattr(torch, n))


def convert_array(obj, name: str):
    """A ``cupy.ndarray`` or ``numpy.ndarray`` viewing the same memory as
    ``obj``, or None when ``obj`` is not an array this library understands.

    torch CUDA tensors become CuPy arrays through DLPack; torch CPU tensors
    become NumPy arrays over the same storage (pinned or not: the caller
    checks).  bfloat16 and float8 tensors are viewed as int16 / uint8 (the
    swap copies bytes).  Nothing is copied.
    """
    torch = _torch_tensor(obj)
    if torch is not None:
        t = obj.detach()
        if t.dtype == torch.bfloat16:
            t = t.view(torch.int16)  # neither NumPy nor CuPy has bfloat16: same bytes as int16
        elif t.dtype in _torch_fp8(torch):
            t = t.view(torch.uint8)
        if t.is_cuda:
            import cupy

            return cupy.from_dlpack(t)
        if obj.device.type != "cpu":
            raise TypeError(f"{name}: expected a CUDA or CPU tensor, got a tensor on {obj.device}")
        return t.numpy()
    if hasattr(obj, "__cuda_array_interface__"):
        import cupy

        return cupy.asarray(obj)
    if hasattr(obj, "__array_interface__"):
        return np.asarray(obj)
    if hasattr(obj, "__dlpack__"):
        import cupy

        return cupy.from_dlpack(obj)
    return None


def stream_handle(stream) -> int:
    """Raw ``cudaStream_t`` of a CuPy stream, a torch stream or an int handle;
    None means CuPy's current stream."""
    if stream is None:
        import cupy

        return cupy.cuda.get_current_stream().ptr
    if isinstance(stream, int):
        return stream
    ptr = getattr(stream, "ptr", None)  # cupy.cuda.Stream / ExternalStream
    if ptr is not None:
        return int(ptr)
    handle = getattr(stream, "cuda_stream", None)  # torch.cuda.Stream
    if handle is not None:
        return int(handle)
    raise TypeError(
        f"stream: expected a cupy.cuda.Stream, a torch.cuda.Stream or an int handle, "
        f"got {type(stream).__name__}"
    )


def stream_device(stream) -> int | None:
    """GPU ordinal a CuPy or torch stream object belongs to; None for raw
    handles and None (which follow the current device)."""
    device_id = getattr(stream, "device_id", None)  # cupy.cuda.Stream (-1: the null streams, any device)
    if isinstance(device_id, int):
        return device_id if device_id >= 0 else None
    device = getattr(stream, "device", None)  # torch.cuda.Stream
    index = getattr(device, "index", None)
    return index if isinstance(index, int) else None


def stream_on_device(stream, device: int) -> int:
    """:func:`stream_handle` of a ``stream=`` argument, after checking that a
    stream object belongs to ``device`` (a kernel cannot be launched on a
    stream of another GPU)."""
    handle = stream_handle(stream)
    if stream is not None and not isinstance(stream, int):
        owner = stream_device(stream)
        if owner is not None and owner != device:
            raise ValueError(
                f"stream: expected a stream of GPU {device} (the swapper's device), got one of "
                f"GPU {owner}; use a BlockSwapper(device={owner}) or make the stream on GPU {device}"
            )
    return handle


@contextlib.contextmanager
def on_device(device: int):
    """Make GPU ``device`` current inside the block (and restore the caller's)."""
    from cupy.cuda import runtime

    prev = runtime.getDevice()
    if prev != device:
        runtime.setDevice(device)
    try:
        yield
    finally:
        if prev != device:
            runtime.setDevice(prev)
