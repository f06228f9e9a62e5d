"""Mapping normalization and checks (CPU only)."""

import numpy as np
import pytest

from cupy_swap.core.mapping import check_mapping, normalize_mapping


@pytest.mark.parametrize(
    "mapping",
    [
        [(1, 2), (3, 4)],
        np.array([[1, 2], [3, 4]], dtype=np.int32),
        np.array([[1, 2], [3, 4]], dtype=np.uint16),
    ],
)
def test_normalize_accepts_integer_pairs(mapping):
    m = normalize_mapping(mapping)
    assert m.dtype == np.int64 and m.shape == (2, 2) and m.flags.c_contiguous
    assert m.tolist() == [[1, 2], [3, 4]]


def test_normalize_fortran_order_becomes_c_contiguous():
    m = normalize_mapping(np.asfortranarray(np.array([[1, 2], [3, 4], [5, 6]])))
    assert m.flags.c_contiguous and m.tolist() == [[1, 2], [3, 4], [5, 6]]


@pytest.mark.parametrize(
    "empty",
    [
        [],
        np.empty((0, 2), dtype=np.int64),
        np.empty((0,), dtype=np.int32),
        (np.array([]), np.array([])),  # finding 9 of issue 32: float64 when empty, refused as floats
        ([], []),
        ((), ()),
        (np.empty(0, np.int32), []),
    ],
)
def test_empty_mapping_is_zero_rows(empty):
    assert normalize_mapping(empty).shape == (0, 2)


def test_floats_rejected():
    with pytest.raises(TypeError, match=r"block_mapping: expected integer.*float64"):
        normalize_mapping([(1.0, 2.0)])


def test_bool_rejected():
    with pytest.raises(TypeError, match="block_mapping: expected integer"):
        normalize_mapping(np.array([[True, False]]))


def test_three_columns_rejected():
    with pytest.raises(ValueError, match=r"block_mapping: expected shape \(N, 2\).*\(1, 3\)"):
        normalize_mapping([(1, 2, 3)])


def test_one_dimensional_rejected():
    with pytest.raises(ValueError, match=r"expected shape \(N, 2\).*\(4,\)"):
        normalize_mapping([1, 2, 3, 4])


def test_ragged_rejected():
    with pytest.raises(ValueError, match="block_mapping"):
        normalize_mapping([(1, 2), (3,)])


def test_too_many_rows_rejected():
    with pytest.raises(ValueError, match=r"at most max_blocks=2 rows, got 3"):
        normalize_mapping([(0, 0), (1, 1), (2, 2)], max_blocks=2)


def test_huge_uint64_rejected():
    with pytest.raises(IndexError, match="does not fit"):
        normalize_mapping(np.array([[2**63, 0]], dtype=np.uint64))


@pytest.mark.parametrize("mapping", [[[2**63, 0]], [[0, -(2**63) - 1]], [(2**64, 1)], [[2**63, -1]]])
def test_python_ints_beyond_int64_rejected_as_such(mapping):
    """NumPy stacks these as float64 or objects; the message must not blame floats."""
    with pytest.raises(IndexError, match="fit in int64") as e:
        normalize_mapping(mapping)
    assert "float" not in str(e.value)


def test_negative_index_rejected():
    m = normalize_mapping([(0, 1), (-1, 2)])
    with pytest.raises(IndexError, match=r"source block index must be >= 0, got -1 in row 1"):
        check_mapping(m, 10, 10, "src", "dst")


def test_a_bad_row_is_named_with_its_own_index():
    """The first bad row and the index it holds (the message once paired the
    first bad row with the column's extreme, which another row held)."""
    m = normalize_mapping([(0, 1), (-1, 2), (-5, 3)])
    with pytest.raises(IndexError, match=r"source block index must be >= 0, got -1 in row 1"):
        check_mapping(m, 10, 10, "src", "dst")
    m = normalize_mapping([(0, 1), (2, 10), (3, 40)])
    with pytest.raises(IndexError, match=r"destination block index 10 in row 1 is out of range"):
        check_mapping(m, 10, 10, "src", "dst")


def test_out_of_range_names_part_and_row():
    m = normalize_mapping([(0, 1), (2, 10)])
    with pytest.raises(IndexError, match=r"destination block index 10 in row 1.*dst\[3\] with 10 blocks"):
        check_mapping(m, 10, 10, "src[0]", "dst[3]")


def test_duplicate_destination_rejected():
    m = normalize_mapping([(0, 5), (1, 6), (2, 5)])
    with pytest.raises(ValueError, match=r"distinct destination blocks, got block 5 twice \(rows 0 and 2\)"):
        check_mapping(m, 10, 10, "src", "dst")


def test_duplicate_sources_are_fine():
    check_mapping(normalize_mapping([(0, 5), (0, 6)]), 10, 10, "src", "dst")


def test_host_rows_check_the_form_not_the_indices():
    from cupy_swap.core.mapping import host_rows

    assert host_rows([(1, 2), (3, 4)], 100) == [1, 2, 3, 4]  # short lists: flattened, no NumPy
    assert host_rows([[1, 2], (3, 2)], 100) == [1, 2, 3, 2]  # a repeated destination: the launch checks it
    assert host_rows([(-1, 10**6)], 100) == [-1, 10**6]  # out of range: likewise
    assert isinstance(host_rows([(i, i) for i in range(17)], 100), np.ndarray)  # long: NumPy
    for odd in ([(1.0, 2)], [("1", 2)]):  # not ints: the NumPy path says what is wrong
        with pytest.raises(TypeError, match="integer block indices"):
            host_rows(odd, 100)
    with pytest.raises(ValueError, match="shape"):
        host_rows([(1, 2, 3)], 100)
    with pytest.raises(ValueError, match="max_blocks=1"):
        host_rows([(1, 2), (3, 4)], 1)
    m = host_rows(np.array([[1, 2]], dtype=np.int32), 100)
    assert m.dtype == np.int64 and m.tolist() == [[1, 2]]


def test_index_pairs_become_rows():
    from cupy_swap.core.mapping import host_rows, index_pair

    src, dst = np.array([3, 7, 9]), np.array([0, 1, 2], dtype=np.int32)
    assert index_pair((src, dst))
    assert not index_pair([(3, 0), (7, 1)])  # two rows, not two index arrays
    rows = np.array([[3, 0], [7, 1]])
    assert not index_pair(list(rows))  # a list is always rows, even a list of two row arrays
    assert np.asarray(host_rows(list(rows), 100)).reshape(-1, 2).tolist() == rows.tolist()
    assert normalize_mapping((src, dst)).tolist() == [[3, 0], [7, 1], [9, 2]]
    assert host_rows((src, dst), 100).tolist() == [[3, 0], [7, 1], [9, 2]]
    with pytest.raises(ValueError, match="one length, got 3 and 2"):
        normalize_mapping((src, dst[:2]))
    with pytest.raises(TypeError, match="integer destination block indices, got dtype float64"):
        normalize_mapping((src, dst.astype(float)))


def test_five_by_zero_is_not_an_empty_mapping():
    with pytest.raises((ValueError, TypeError), match="block_mapping"):
        normalize_mapping(np.empty((5, 0), dtype=np.int64))


def test_duplicates_found_with_huge_destination_pool():
    m = normalize_mapping([(0, 10_000_000), (1, 5), (2, 10_000_000)])
    with pytest.raises(ValueError, match="got block 10000000 twice"):
        check_mapping(m, 10, 20_000_000, "src", "dst")
    check_mapping(normalize_mapping([(0, 10_000_000), (1, 5)]), 10, 20_000_000, "src", "dst")
