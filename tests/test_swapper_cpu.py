"""Pieces of the swapper that need no GPU."""

import ctypes

import pytest

from cupy_swap.swapper import _check_mode, _KernelArgs, _positive_int


def test_kernel_args_pack_as_void_pointer_array():
    args = _KernelArgs(0x7F0000001000)
    ptr = args.set(n_parts=64, units_per_pair=4096, n_pairs=-1, first_pair=300)
    slots = (ctypes.c_void_p * 5).from_address(ptr)
    assert ctypes.c_uint64.from_address(slots[0]).value == 0x7F0000001000
    assert ctypes.c_int32.from_address(slots[1]).value == 64
    assert ctypes.c_uint64.from_address(slots[2]).value == 4096
    assert ctypes.c_int64.from_address(slots[3]).value == -1
    assert ctypes.c_int64.from_address(slots[4]).value == 300


def test_argument_checks():
    assert _check_mode("dma") == "dma"
    with pytest.raises(ValueError, match="mode: expected one of"):
        _check_mode("turbo")
    assert _positive_int(3, "x") == 3
    with pytest.raises(TypeError, match="x: expected a positive int, got bool"):
        _positive_int(True, "x")
