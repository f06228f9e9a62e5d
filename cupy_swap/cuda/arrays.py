"""Zero-copy views of other frameworks' arrays (torch tensors and any object
speaking ``__cuda_array_interface__``, DLPack or ``__array_interface__``)."""

from __future__ import annotations

import sys

import numpy as np

__all__ = ["convert_array"]


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
