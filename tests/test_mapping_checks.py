"""Mapping checks on the hot path: the duplicate search
(core.mapping._has_duplicates: counting for few blocks, sorting for many)
against a plain sort on random columns, and the one-reduction bounds check."""

import numpy as np
import pytest

from cupy_swap.core import mapping


def _by_sort(col: np.ndarray) -> bool:
    s = np.sort(col)
    return bool((s[1:] == s[:-1]).any())


@pytest.mark.parametrize("limit", [2, 17, 1000, 70_000])
def test_duplicate_search_agrees_with_sorting(limit):
    rng = np.random.default_rng(limit)
    for n in (2, 3, 16, 17, 500, 1250):
        for _ in range(20):
            if n <= limit and rng.random() < 0.5:
                col = rng.choice(limit, n, replace=False)
            else:
                col = rng.integers(0, limit, n)
            col = col.astype(np.int64)
            assert mapping._has_duplicates(col, limit) == _by_sort(col), (limit, n, col)


def test_a_strided_column_as_the_checks_pass_it():
    m = np.array([[0, 3], [1, 9], [2, 3]], dtype=np.int64)
    assert mapping._has_duplicates(m[:, 1], 10) and not mapping._has_duplicates(m[:, 0], 10)


def test_range_check_catches_negative_and_large_indices_in_one_pass():
    m = np.array([[0, 1], [-1, 2]], dtype=np.int64)
    with pytest.raises(IndexError, match="source block index must be >= 0, got -1 in row 1"):
        mapping.check_mapping(m, 4, 4, "src[0]", "dst[0]")
    m = np.array([[0, 1], [2, 4]], dtype=np.int64)
    with pytest.raises(IndexError, match="destination block index 4 in row 1 is out of range"):
        mapping.check_mapping(m, 8, 4, "src[0]", "dst[0]")
    # In range for both sides though above the smaller count: accepted.
    mapping.check_mapping(np.array([[6, 1], [7, 2]], dtype=np.int64), 8, 4, "src[0]", "dst[0]")
    with pytest.raises(ValueError, match="block 2 twice"):
        mapping.check_mapping(np.array([[6, 2], [7, 2]], dtype=np.int64), 8, 4, "src[0]", "dst[0]")
