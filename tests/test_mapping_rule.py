"""Issue 49, finding 3: one rule for every reader of a block mapping, decided
by type alone.  A list (or an ``(N, 2)`` array) is rows ``(src_block,
dst_block)``; a tuple is the pair form ``(src_indices, dst_indices)``, so a
tuple of any other length than 2 is refused, naming both forms.

Before, ``((5, 0), (9, 1))`` copied 5 -> 9 and 0 -> 1 while a tuple of three
rows was read as rows, and ``cupy_swap.remote`` read tuples of pairs as rows
and lists of two 1-D arrays as the pair form: code right at one length was
silently wrong at another."""

import numpy as np
import pytest

from cupy_swap.core.layout import layout_from_parts
from cupy_swap.core.mapping import check_mapping_for, host_rows, index_pair, normalize_mapping
from cupy_swap.core.parts import as_parts
from cupy_swap.cuda.gpu_mapping import device_rows
from cupy_swap.remote.mapping import split_mapping

from .fakes import on_gpu

# What every reader says of a tuple that is not a pair (the argument, both forms).
REFUSAL = r"block_mapping: a tuple is the pair form \(src_indices, dst_indices\).*got a tuple of {n}.*a list.*\(N, 2\) array"

ROWS_3 = ((5, 0), (9, 1), (2, 3))  # three rows in a tuple: not rows any more
NOT_PAIRS = {
    "3 rows": ROWS_3,
    "1 row": ((5, 0),),
    "empty": (),
    "4 rows": ((5, 0), (9, 1), (2, 3), (4, 4)),
    "3 arrays": (np.arange(3), np.arange(3), np.arange(3)),
}


def _layout(blocks: int = 16):
    host = np.zeros((blocks, 64), np.uint8)
    return layout_from_parts(as_parts(host, "src"), on_gpu(as_parts(np.zeros((blocks, 64), np.uint8), "dst")))


def _readers():
    """Every reader of a mapping, as ``reader(mapping) -> (src, dst)`` columns."""
    layout = _layout()

    def columns(m):
        m = np.asarray(m).reshape(-1, 2)
        return m[:, 0].tolist(), m[:, 1].tolist()

    return {
        "index_pair": lambda m: index_pair(m) and None,
        "normalize_mapping": lambda m: columns(normalize_mapping(m, 64)),
        "host_rows": lambda m: columns(host_rows(m, 64)),
        "check_mapping_for (swap with check='host', plan, graph_swap.set_mapping)": lambda m: columns(
            check_mapping_for(layout, m, 64)
        ),
        "device_rows (swap, prepared ops, captured rows=)": lambda m: device_rows(m, 0, 64),
        "remote split_mapping": lambda m: tuple(c.tolist() for c in split_mapping(m, 16, 16, "a", "b")),
    }


@pytest.mark.parametrize("reader", list(_readers()))
@pytest.mark.parametrize("form", list(NOT_PAIRS))
def test_every_reader_refuses_a_tuple_that_is_not_a_pair(reader, form):
    mapping = NOT_PAIRS[form]
    with pytest.raises(ValueError, match=REFUSAL.format(n=len(mapping))) as caught:
        _readers()[reader](mapping)
    assert "rows" in str(caught.value) and "(src_block, dst_block)" in str(caught.value)


def test_every_reader_says_the_same_words():
    said = set()
    for read in _readers().values():
        with pytest.raises(ValueError) as caught:
            read(ROWS_3)
        said.add(str(caught.value))
    assert len(said) == 1, said


@pytest.mark.parametrize("reader", [r for r in _readers() if not r.startswith(("index_pair", "device_rows"))])
def test_a_two_tuple_is_always_the_pair_form_and_a_list_always_rows(reader):
    read = _readers()[reader]
    # tuple(zip(srcs, dsts)) for two blocks: the pair form, src = [5, 0], dst = [9, 1], as documented.
    assert read(((5, 0), (9, 1))) == ([5, 0], [9, 1])
    assert read(([5, 0], [9, 1])) == ([5, 0], [9, 1])
    assert read((np.array([5, 0]), np.array([9, 1]))) == ([5, 0], [9, 1])
    # A list is rows at every length: of tuples, of lists, of two 1-D arrays (remote read this as pairs).
    assert read([(5, 0), (9, 1)]) == ([5, 9], [0, 1])
    assert read([[5, 0], [9, 1], [2, 3]]) == ([5, 9, 2], [0, 1, 3])
    assert read([np.array([5, 0]), np.array([9, 1])]) == ([5, 9], [0, 1])
    assert read(np.array([[5, 0], [9, 1], [2, 3]])) == ([5, 9, 2], [0, 1, 3])
    assert read([]) == ([], [])


def test_index_pair_is_the_one_rule():
    assert index_pair(([1], [2])) and index_pair(((5, 0), (9, 1)))
    assert not index_pair([(5, 0), (9, 1)]) and not index_pair(np.zeros((2, 2), np.int64))
    for m in NOT_PAIRS.values():
        with pytest.raises(ValueError, match=REFUSAL.format(n=len(m))):
            index_pair(m)


def test_a_tuple_of_gpu_arrays_that_is_not_a_pair_is_refused_before_it_is_described():
    class CudaArray:  # what device_rows would otherwise read (a torch CUDA tensor's attributes)
        is_cuda = True

    with pytest.raises(ValueError, match=REFUSAL.format(n=3)):
        device_rows((CudaArray(), CudaArray(), CudaArray()), 0, 64)
    assert device_rows([(1, 2)], 0, 64) is None and device_rows(([1], [2]), 0, 64) is None  # host: None


def test_a_prepared_op_refuses_a_tuple_of_three_rows_before_anything_is_enqueued(fake_gpu, monkeypatch):
    pytest.importorskip("cupy", reason="wait_handle tells CuPy events apart")
    import cupy_swap.prepared as prepared
    from cupy_swap.prepared import PreparedSwap

    from .fakes import FakeSwapper

    monkeypatch.setattr(prepared, "stream_is_capturing", lambda handle: False)
    calls: list = []
    host = np.zeros((16, 64), np.uint8)
    layout = layout_from_parts(as_parts(host, "src"), fake_gpu.parts(np.zeros((16, 64), np.uint8), "dst"))
    op = PreparedSwap(FakeSwapper(calls), layout, (host,))

    class Recorded:  # an event to wait for (a CuPy event's attribute)
        cuda_event = 0xBEEF

    for mode in (None, "kernel", "dma"):
        with pytest.raises(ValueError, match=REFUSAL.format(n=3)):
            op(ROWS_3, mode=mode, wait_for=Recorded())
        assert calls == []  # no wait, no launch, no copy
    op(((5, 0), (9, 1)), mode="kernel", check="launch")  # the pair form: 5 -> 9, 0 -> 1
    assert calls[0][:2] == ("kernel", [5, 9, 0, 1])
    calls.clear()
    op([(5, 0), (9, 1), (2, 3)], mode="kernel", check="launch")  # the same rows in a list
    assert calls[0][:2] == ("kernel", [5, 0, 9, 1, 2, 3])


def test_torch_cpu_tensors_follow_the_same_rule():
    torch = pytest.importorskip("torch")
    rows = torch.tensor([[5, 0], [9, 1], [2, 3]])
    assert normalize_mapping(rows).tolist() == [[5, 0], [9, 1], [2, 3]]
    assert normalize_mapping(tuple(rows.T)).tolist() == [[5, 0], [9, 1], [2, 3]]  # (src, dst) of tensors
    with pytest.raises(ValueError, match=REFUSAL.format(n=3)):
        host_rows(tuple(rows), 64)  # three row tensors in a tuple
    with pytest.raises(ValueError, match=REFUSAL.format(n=3)):
        split_mapping(tuple(rows), 16, 16, "a", "b")
