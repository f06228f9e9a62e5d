"""Issue 49, finding 7: ``is_pinned`` takes what the README calls host
arrays (NumPy arrays and CPU torch tensors; a CPU tensor answers as its
NumPy view does) and refuses anything else with a ``TypeError`` naming the
argument.  It raised ``AttributeError`` for a torch tensor, a list, a GPU
array."""

import numpy as np
import pytest

import cupy_swap as cs
from cupy_swap.cuda import memory


class CudaArray:
    """A GPU array as CuPy or numba offers one, no CUDA needed."""

    __cuda_array_interface__ = {"shape": (4,), "typestr": "<f4", "data": (0x7000_0000, False), "version": 3}


@pytest.mark.parametrize(
    "obj,said",
    [
        ([1.0, 2.0], "list"),
        (memoryview(b"1234"), "memoryview"),
        (CudaArray(), "GPU"),
        (None, "NoneType"),
    ],
    ids=["list", "memoryview", "gpu array", "None"],
)
def test_what_is_not_a_host_array_is_refused_naming_the_argument(obj, said, fake_cuda):
    with pytest.raises(TypeError, match=rf"^array: expected a host array .*{said}") as caught:
        cs.is_pinned(obj)
    assert "numpy" in str(caught.value).lower() and "torch" in str(caught.value)


def test_an_array_interface_is_read_as_numpy_reads_it(fake_cuda):
    pool = np.asarray(memory._PinnedBuffer((8, 16), np.dtype(np.float32)))

    class Exported:  # any object that exports host memory through __array_interface__
        __array_interface__ = pool.__array_interface__

    assert cs.is_pinned(Exported()) and not cs.is_pinned(np.zeros(64, np.float32))


def test_a_cpu_tensor_answers_as_its_numpy_view(fake_cuda):
    torch = pytest.importorskip("torch")
    pool = np.asarray(memory._PinnedBuffer((16, 8), np.dtype(np.float32)))
    t = torch.from_numpy(pool)
    assert cs.is_pinned(t) and cs.is_pinned(t[3:9]) and cs.is_pinned(t.t()) and cs.is_pinned(t[::2, ::3])
    assert cs.is_pinned(t.view(torch.bfloat16))  # no NumPy dtype: its memory all the same
    assert cs.is_pinned(t.clone()) is False  # a copy: pageable
    assert cs.is_pinned(torch.from_numpy(pool).requires_grad_(True))
    outside = torch.from_numpy(np.lib.stride_tricks.as_strided(pool[8:], (9, 8), pool.strides))
    assert cs.is_pinned(outside) is cs.is_pinned(outside.numpy()) is False  # one row past the end
    assert cs.is_pinned(torch.zeros(4)) is False
    for a in (pool, pool[3:9], pool.T, pool[::2], pool[:, ::3]):
        assert cs.is_pinned(torch.from_numpy(a)) is cs.is_pinned(a)


def test_a_tensor_off_the_host_is_refused_naming_the_argument_and_its_device(fake_cuda):
    torch = pytest.importorskip("torch")
    # A CUDA tensor takes the same branch (every device but "cpu"); this CPU wheel has only meta.
    with pytest.raises(TypeError, match=r"^array: expected a host array .*a torch tensor on meta"):
        cs.is_pinned(torch.empty(4, device="meta"))
