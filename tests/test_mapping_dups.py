"""The O(N) duplicate search of mapping checks (core.mapping._has_duplicates)
against a sort, on random columns, at every size the stamp table takes, and
from threads at once (each thread has its own table)."""

import threading

import numpy as np
import pytest

from cupy_swap.core import mapping


def _by_sort(col: np.ndarray) -> bool:
    s = np.sort(col)
    return bool((s[1:] == s[:-1]).any())


@pytest.mark.parametrize("limit", [2, 17, 1000, 70_000])
def test_stamps_agree_with_sorting(limit):
    rng = np.random.default_rng(limit)
    for n in (2, 3, 16, 17, 500, 1250):
        for _ in range(20):
            if n <= limit and rng.random() < 0.5:
                col = rng.choice(limit, n, replace=False)
            else:
                col = rng.integers(0, limit, n)
            col = col.astype(np.int64)
            assert mapping._has_duplicates(col, limit) == _by_sort(col), (limit, n, col)


def test_stamps_see_a_repeat_written_by_an_earlier_call():
    # Stale entries from an earlier mapping must not hide (or invent) a repeat.
    first = np.arange(100, dtype=np.int64)
    assert not mapping._has_duplicates(first, 100)
    assert mapping._has_duplicates(np.array([5, 7, 5], dtype=np.int64), 100)
    assert not mapping._has_duplicates(np.array([7, 5, 99], dtype=np.int64), 100)


def test_a_strided_column_as_the_checks_pass_it():
    m = np.array([[0, 3], [1, 9], [2, 3]], dtype=np.int64)
    assert mapping._has_duplicates(m[:, 1], 10) and not mapping._has_duplicates(m[:, 0], 10)


def test_over_the_stamp_limit_sorting_answers(monkeypatch):
    monkeypatch.setattr(mapping, "STAMP_MAX_BLOCKS", 8)
    assert mapping._has_duplicates(np.array([9, 20, 9], dtype=np.int64), 50)
    assert not mapping._has_duplicates(np.array([9, 20, 10], dtype=np.int64), 50)


def test_threads_keep_their_own_tables():
    errors = []

    def work(seed):
        rng = np.random.default_rng(seed)
        try:
            for _ in range(300):
                col = rng.integers(0, 3000, 1250) if seed % 2 else rng.choice(3000, 1250, replace=False)
                if mapping._has_duplicates(col, 3000) != _by_sort(col):
                    errors.append(seed)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


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
