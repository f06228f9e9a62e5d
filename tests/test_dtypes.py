"""Element types on the CPU: arrays whose array protocols raise when read
(torch's ``__cuda_array_interface__`` for float8 CUDA tensors), types NumPy
lacks (:class:`~cupy_swap.core.parts.ElementType`) and how source and
destination parts of such types pair, and torch CPU tensors of every dtype
torch has viewed without a copy (those tests need torch)."""

import dataclasses

import numpy as np
import pytest

from cupy_swap.core.layout import layout_from_parts
from cupy_swap.core.parts import ElementType, TypedView, as_parts
from cupy_swap.cuda.arrays import convert_array

from .fakes import on_gpu


class _RaisingCudaInterface:
    """Stands in for a torch float8 CUDA tensor: its ``__cuda_array_interface__``
    property raises KeyError, as torch's does for dtypes it cannot describe."""

    def __init__(self, fallback=None):
        if fallback is not None:  # a readable __array_interface__ besides
            self.__array_interface__ = fallback.__array_interface__
            self._keep = fallback

    @property
    def __cuda_array_interface__(self):
        raise KeyError("torch.float8_e4m3fn")


def test_raising_cuda_interface_is_a_type_error_naming_the_argument():
    obj = _RaisingCudaInterface()
    with pytest.raises(TypeError, match=r"^src: .*__cuda_array_interface__ raised KeyError"):
        as_parts(obj, "src", convert_array)
    with pytest.raises(TypeError, match=r"^dst\[1\]: .*__cuda_array_interface__ raised KeyError"):
        as_parts([np.zeros((4, 8), np.uint8), obj], "dst", convert_array)


def test_raising_cuda_interface_without_a_converter():
    # Without convert_array (NumPy only) it is an array NumPy cannot view.
    with pytest.raises(TypeError, match=r"^src: expected a cupy.ndarray \(GPU\) or a numpy.ndarray"):
        as_parts(_RaisingCudaInterface(), "src")


def test_raising_cuda_interface_falls_back_to_a_readable_protocol():
    host = np.arange(4 * 8, dtype=np.uint8).reshape(4, 8)
    obj = _RaisingCudaInterface(fallback=host)
    for convert in (convert_array, None):
        (p,) = as_parts(obj, "src", convert)
        assert p.ptr == host.ctypes.data and p.block_shape == (8,) and p.dtype == np.uint8


def test_raising_array_interface_names_the_argument():
    class Broken:
        @property
        def __array_interface__(self):
            raise ValueError("no buffer")

    with pytest.raises(TypeError, match=r"^src\[0\]: .*__array_interface__ raised ValueError: no buffer"):
        as_parts([Broken()], "src")


# --- element types NumPy lacks -------------------------------------------

FP8 = ElementType("torch.float8_e4m3fn", np.dtype(np.uint8))
FP8_E5M2 = ElementType("torch.float8_e5m2", np.dtype(np.uint8))
BF16 = ElementType("torch.bfloat16", np.dtype(np.int16))


class _Typed:
    """An array of a type NumPy lacks, as a converter sees it."""

    def __dlpack__(self, stream=None):  # makes it an array to as_parts; _convert views it
        raise AssertionError("not called: _convert views the memory")

    def __init__(self, dtype: ElementType, shape=(6, 4, 8)):
        self.dtype = dtype
        self.memory = np.zeros(shape, dtype.carrier)


def _convert(obj, name):
    if isinstance(obj, _Typed):
        return TypedView(obj.memory, obj.dtype)
    return convert_array(obj, name)


def _pair(src, dst):
    """Check ``src -> dst`` as a swap-out (``src`` on the GPU); only the
    pairing decides whether it passes."""
    return layout_from_parts(on_gpu(as_parts(src, "src", _convert)), as_parts(dst, "dst", _convert))


def test_typed_view_part_describes_the_carrier_bytes():
    t = _Typed(FP8)
    (p,) = as_parts(t, "src", _convert)
    assert p.dtype is FP8 and str(p.dtype) == "torch.float8_e4m3fn"
    assert p.ptr == t.memory.ctypes.data and p.block_shape == (4, 8) and p.block_bytes == 32


def test_same_element_types_pair():
    layout = _pair(_Typed(FP8), _Typed(FP8))
    assert layout.bytes_per_pair == 32


@pytest.mark.parametrize("storage", [np.uint8, np.int8])
def test_foreign_type_pairs_with_integer_storage_of_its_width(storage):
    # NumPy has no float8: a uint8 (or int8) host pool holds its bytes.
    _pair(_Typed(FP8), np.zeros((6, 4, 8), storage))
    _pair(_Typed(BF16), np.zeros((6, 4, 8), np.uint16))


@pytest.mark.parametrize("src_first", [True, False])
def test_two_foreign_types_of_one_width_do_not_pair(src_first):
    a, b = (FP8, FP8_E5M2) if src_first else (FP8_E5M2, FP8)
    with pytest.raises(TypeError, match=rf"^dst: expected dtype {a} like src, got {b}$"):
        _pair(_Typed(a), _Typed(b))


@pytest.mark.parametrize(
    "numpy_dtype", [np.float16, np.int32, np.bool_], ids=["float-of-width", "int-of-other-width", "bool"]
)
def test_foreign_type_refuses_other_numpy_types_both_ways(numpy_dtype):
    other = np.zeros((6, 4, 8 * 2 // np.dtype(numpy_dtype).itemsize), numpy_dtype)
    name = np.dtype(numpy_dtype).name
    with pytest.raises(TypeError, match=rf"^dst: expected dtype torch.bfloat16 like src, got {name}$"):
        _pair(_Typed(BF16), other)
    # numpy.dtype on the left: its comparison defers to ElementType's.
    with pytest.raises(TypeError, match=rf"^dst: expected dtype {name} like src, got torch.bfloat16$"):
        _pair(other, _Typed(BF16))


def test_element_type_equality_is_the_pairing_rule():
    assert FP8 == ElementType("torch.float8_e4m3fn", np.dtype(np.uint8))
    assert hash(FP8) == hash(ElementType("torch.float8_e4m3fn", np.dtype(np.uint8)))
    assert FP8 != FP8_E5M2 and FP8 == dataclasses.replace(FP8, name="ml_dtypes.float8_e4m3fn")
    assert FP8 == np.dtype(np.uint8) and np.dtype(np.uint8) == FP8 and FP8 == np.uint8 and FP8 == "int8"
    assert FP8 != np.dtype(np.uint16) and BF16 != np.float16 and FP8 != "bool"
    assert FP8 != "torch.float8_e4m3fn" and FP8 != None  # noqa: E711 - the == operator is under test
    assert FP8.itemsize == 1 and BF16.itemsize == 2 and not FP8.hasobject


def test_element_type_pairs_with_a_numpy_type_of_its_name():
    ml_dtypes = pytest.importorskip("ml_dtypes", reason="needs ml_dtypes (NumPy dtypes for float8, bfloat16)")
    fp8 = np.zeros((6, 4, 8), ml_dtypes.float8_e4m3fn)
    assert FP8 == fp8.dtype and fp8.dtype == FP8 and FP8_E5M2 != fp8.dtype
    _pair(_Typed(FP8), fp8)
    with pytest.raises(TypeError, match=r"^dst: expected dtype torch.bfloat16 like src, got float8_e4m3fn$"):
        _pair(_Typed(BF16), np.zeros((6, 4, 16), ml_dtypes.float8_e4m3fn))


# --- torch CPU tensors of every dtype (need torch) -------------------------


def _torch():
    return pytest.importorskip("torch", reason="needs PyTorch (a CPU build is enough)")


def _all_torch_dtypes(torch):
    """Every dtype the installed torch defines, so new ones are covered."""
    return sorted({v for v in vars(torch).values() if isinstance(v, torch.dtype)}, key=str)


def test_every_torch_dtype_converts_to_a_view():
    torch = _torch()
    import warnings

    for dtype in _all_torch_dtypes(torch):
        with warnings.catch_warnings():  # complex32 and quantized dtypes warn on creation
            warnings.simplefilter("ignore", UserWarning)
            t = torch.zeros((5, 4, 8 * dtype.itemsize), dtype=torch.uint8).view(dtype)
        got = convert_array(t, "src")
        array = got.array if isinstance(got, TypedView) else got
        assert isinstance(array, np.ndarray), dtype
        assert array.ctypes.data == t.data_ptr(), dtype
        assert array.nbytes == t.numel() * t.element_size(), dtype
        # No copy: a byte written through the view is the tensor's.
        array.reshape(-1).view(np.uint8)[3] = 0x5A
        assert int(t.view(torch.uint8).reshape(-1)[3]) == 0x5A, dtype
        (p,) = as_parts(t, "src", convert_array)
        assert p.ptr == t.data_ptr() and p.block_stride == t.stride(0) * t.element_size(), dtype
        assert p.block_bytes == 4 * 8 * t.element_size(), dtype
        assert str(p.dtype) in (str(dtype), str(dtype).removeprefix("torch.")), dtype
        if isinstance(got, TypedView):
            assert p.dtype == got.dtype and p.dtype.name == str(dtype)
            assert p.block_shape == (4, 8)  # every width torch has today has an integer carrier


def test_torch_bit_patterns_survive_the_view():
    torch = _torch()
    raw = torch.randint(0, 256, (3, 16), dtype=torch.uint8, generator=torch.Generator().manual_seed(5))
    for dtype in (torch.float8_e4m3fn, torch.bfloat16, torch.bool, torch.uint64, torch.complex32):
        t = raw.view(dtype)
        got = convert_array(t, "src")
        array = got.array if isinstance(got, TypedView) else got
        assert np.array_equal(array.view(np.uint8).reshape(3, 16), raw.numpy()), dtype


def test_torch_strided_view_of_a_float8_cache():
    torch = _torch()
    cache = torch.zeros((7, 4, 2, 16), dtype=torch.float8_e4m3fn)  # [blocks, layers, K/V, ...]
    k3 = cache[:, 3, 0]
    (p,) = as_parts(k3, "dst", convert_array)
    assert p.ptr == k3.data_ptr() and p.block_stride == 4 * 2 * 16 and p.block_bytes == 16
    assert str(p.dtype) == "torch.float8_e4m3fn"


def test_torch_dtype_mismatches_name_both_torch_dtypes():
    torch = _torch()
    with pytest.raises(
        TypeError, match=r"^dst: expected dtype torch.float8_e4m3fn like src, got torch.float8_e5m2$"
    ):
        _pair(torch.zeros((4, 8), dtype=torch.float8_e4m3fn), torch.zeros((4, 8), dtype=torch.float8_e5m2))
    with pytest.raises(TypeError, match=r"^dst: expected dtype torch.bfloat16 like src, got float16$"):
        _pair(torch.zeros((4, 8), dtype=torch.bfloat16), torch.zeros((4, 8), dtype=torch.float16))
    # uint8 storage of float8 (vLLM's fp8 caches are uint8 tensors) pairs.
    _pair(torch.zeros((4, 8), dtype=torch.float8_e4m3fn), torch.zeros((4, 8), dtype=torch.uint8))
    _pair(torch.zeros((4, 8), dtype=torch.float8_e5m2), np.zeros((4, 8), np.uint8))


def test_torch_tensors_that_cannot_be_viewed_name_the_argument():
    torch = _torch()
    with pytest.raises(
        TypeError, match=r"^src: expected a tensor whose memory holds its values.*resolve_conj"
    ):
        as_parts(torch.zeros((4, 8), dtype=torch.complex64).conj(), "src", convert_array)
    with pytest.raises(
        TypeError, match=r"^src: expected a dense \(strided\) tensor, got layout torch.sparse_coo"
    ):
        as_parts(torch.zeros((4, 8)).to_sparse(), "src", convert_array)
    with pytest.raises(TypeError, match=r"^dst\[0\]: expected a CUDA or CPU tensor, got a tensor on meta"):
        as_parts([torch.zeros((4, 8), device="meta")], "dst", convert_array)
