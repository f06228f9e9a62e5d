"""Block mappings: ``(N, 2)`` rows of ``(src_block, dst_block)``, as vLLM
passes them, or the pair form ``(src_indices, dst_indices)``, as SGLang keeps
them, told apart by type alone (:func:`index_pair`, the one rule every reader
asks).  Normalized and checked here, before anything is launched, and cut
into runs of consecutive blocks by the one run detector, :func:`run_starts`.
NumPy only."""

from __future__ import annotations

import sys

import numpy as np

# Mappings up to this many rows take a pure-Python path: building NumPy arrays
# costs more than the conversion itself at this size.
SMALL_MAPPING = 16
_ROW_TYPES = {tuple, list}  # of one row of a list of rows
_INT = {int}
_INT64 = np.dtype(np.int64)


def index_pair(block_mapping) -> bool:
    """The one rule for every reader of a mapping (``swap()``, prepared ops,
    captured swaps, plans, graph swaps, ``cupy_swap.remote``), decided by type
    alone: a tuple is the pair form ``(src_indices, dst_indices)``, anything
    else (a list, an ``(N, 2)`` array or tensor) is rows ``(src_block,
    dst_block)``.

    Returns
    -------
    bool
        True for a 2-tuple: two 1-D sequences of any type (NumPy, CuPy,
        torch arrays, lists, tuples), source indices and destination indices.
        A 2-tuple is never read as two rows: ``([5, 9], [0, 1])`` and
        ``((5, 9), (0, 1))`` copy 5 -> 0 and 9 -> 1.  False for anything that
        is not a tuple: a list is always rows.

    Raises
    ------
    ValueError
        A tuple of any other length than 2 (a tuple of three rows is not
        rows: the same code would be read as rows at one length and as the
        pair form at another).
    """
    if not isinstance(block_mapping, tuple):
        return False
    if len(block_mapping) != 2:
        raise ValueError(
            "block_mapping: a tuple is the pair form (src_indices, dst_indices) and holds two 1-D "
            f"sequences, got a tuple of {len(block_mapping)}; pass (src_block, dst_block) rows in a "
            "list or an (N, 2) array"
        )
    return True


def host_rows(block_mapping, max_blocks: int):
    """A host mapping as the launch takes it, with its form checked but not
    its indices (the copy launch checks those, or :func:`check_mapping_for`).

    Returns
    -------
    list of 2N ints, or numpy.ndarray of shape (N, 2), int64
        Short lists of ``(s, d)`` int rows come flattened
        ``[s0, d0, s1, d1, ...]`` (no NumPy: faster at this size);
        anything else as :func:`normalize_mapping` returns it.
    """
    if type(m := block_mapping) is np.ndarray and m.dtype == _INT64 and m.ndim == 2 and m.shape[1] == 2:
        if m.flags.c_contiguous and m.shape[0] <= max_blocks:  # as vLLM passes it: taken as it is
            return m
    if type(m) is list and len(block_mapping) <= SMALL_MAPPING:  # rows (a tuple: normalize_mapping's rule)
        flat: list = []
        for row in block_mapping:
            if type(row) not in _ROW_TYPES or len(row) != 2:
                break
            flat += row
        else:
            if set(map(type, flat)) <= _INT and flat and len(flat) <= 2 * max_blocks:
                if -(1 << 63) <= min(flat) and max(flat) < (1 << 63):
                    return flat
    return normalize_mapping(block_mapping, max_blocks)


def normalize_mapping(block_mapping, max_blocks: int | None = None) -> np.ndarray:
    """Return ``block_mapping`` as a C-contiguous ``(N, 2)`` int64 NumPy array.

    Parameters
    ----------
    block_mapping : list, array or tensor of shape (N, 2), or a tuple (src_indices, dst_indices)
        Integer rows ``(src_block, dst_block)`` in a list (of pairs), a NumPy
        array or a CPU torch tensor; or a tuple of two 1-D sequences of one
        length, source and destination indices (:func:`index_pair`: a tuple
        is always this pair form).  ``N == 0`` (``[]``) is allowed.
    max_blocks : int, optional
        Largest N accepted (the swapper's buffer capacity).

    Raises
    ------
    TypeError
        The mapping is not integers, or lives on the GPU.
    ValueError
        The mapping is not ``(N, 2)``, is a tuple of other than two
        sequences, or has more than ``max_blocks`` rows.
    """
    cupy = sys.modules.get("cupy")
    if (cupy is not None and isinstance(block_mapping, cupy.ndarray)) or getattr(
        block_mapping, "is_cuda", False
    ):
        raise TypeError(
            "block_mapping: expected the rows on the host here (list, numpy array or CPU tensor), got "
            f"a {type(block_mapping).__name__} on the GPU; reading it back would synchronize the GPU "
            "(swap() and prepared ops take mappings on the GPU; plan() and GraphSwap do not)"
        )
    if index_pair(block_mapping):
        src, dst = (_index_column(a, side) for a, side in zip(block_mapping, ("source", "destination")))
        if src.shape != dst.shape:
            raise ValueError(
                f"block_mapping: expected source and destination indices of one length, got "
                f"{src.shape[0]} and {dst.shape[0]}"
            )
        block_mapping = np.column_stack((src, dst))
    m = None
    if _is_torch_cpu(block_mapping):
        try:  # shares the tensor's memory; np.asarray goes through __array__, many times slower
            m = block_mapping.numpy()
        except (RuntimeError, TypeError):  # requires grad, conj/neg bits...: asarray says what is wrong
            m = None
    try:
        if m is None:
            m = np.asarray(block_mapping)
    except (ValueError, TypeError) as e:
        raise ValueError(
            f"block_mapping: expected (N, 2) integer pairs, got something NumPy cannot stack ({e})"
        ) from None
    if m.size == 0 and m.shape[0] == 0 and (m.ndim == 1 or m.ndim == 2 and m.shape[1] in (0, 2)):
        return np.empty((0, 2), dtype=np.int64)
    if m.dtype.kind in "fO" and _python_int_too_large(block_mapping):
        # NumPy stacks ints beyond 64 bits as float64 or objects: say what is wrong.
        raise IndexError(
            "block_mapping: expected block indices that fit in int64, got a Python int outside "
            f"[{np.iinfo(np.int64).min}, {np.iinfo(np.int64).max}]"
        )
    if m.dtype.kind not in "iu":
        raise TypeError(
            f"block_mapping: expected integer block indices, got dtype {m.dtype}"
            + (" (floats are not rounded; convert explicitly)" if m.dtype.kind == "f" else "")
        )
    if m.ndim != 2 or m.shape[1] != 2:
        raise ValueError(
            f"block_mapping: expected shape (N, 2) of (src_block, dst_block) rows, got shape {m.shape}"
        )
    if max_blocks is not None and m.shape[0] > max_blocks:
        raise ValueError(
            f"block_mapping: expected at most max_blocks={max_blocks} rows, got {m.shape[0]}; "
            f"create the BlockSwapper with a larger max_blocks or split the swap"
        )
    if m.dtype == np.int64 and m.flags.c_contiguous:
        return m
    if m.dtype == np.uint64 and m.size and int(m.max()) > np.iinfo(np.int64).max:
        raise IndexError(f"block_mapping: block index {int(m.max())} does not fit in int64")
    return np.ascontiguousarray(m, dtype=np.int64)


def _index_column(obj, side: str) -> np.ndarray:
    """One sequence of the 1-D form as int64 (CPU torch tensors by their NumPy view)."""
    try:
        a = np.asarray(obj.numpy() if _is_torch_cpu(obj) else obj)
    except (ValueError, TypeError) as e:
        raise ValueError(
            f"block_mapping: a 2-tuple is (src_indices, dst_indices); expected 1-D {side} block indices, "
            f"got something NumPy cannot read ({e})"
        ) from None
    if a.ndim != 1:
        raise ValueError(
            f"block_mapping: a 2-tuple is (src_indices, dst_indices); expected 1-D {side} block indices, "
            f"got shape {a.shape} (pass rows as a list or an (N, 2) array)"
        )
    if a.size == 0:  # np.array([]) is float64: empty is empty, whatever its dtype
        return np.empty(0, np.int64)
    if a.dtype.kind not in "iu":
        raise TypeError(f"block_mapping: expected integer {side} block indices, got dtype {a.dtype}")
    if a.dtype == np.uint64 and a.size and int(a.max()) > np.iinfo(np.int64).max:
        raise IndexError(f"block_mapping: block index {int(a.max())} does not fit in int64")
    return a.astype(np.int64, copy=False)


def _is_torch_cpu(obj) -> bool:
    return type(obj).__module__.startswith("torch") and hasattr(obj, "numpy")


def _python_int_too_large(block_mapping) -> bool:
    """True when a list/tuple mapping holds a Python int that no int64
    holds (only called on the error path, so the loop costs nothing)."""
    if not isinstance(block_mapping, (list, tuple)):
        return False
    lo, hi = np.iinfo(np.int64).min, np.iinfo(np.int64).max
    for row in block_mapping:
        for v in row if isinstance(row, (list, tuple)) else (row,):
            if isinstance(v, (int, np.integer)) and not isinstance(v, bool) and not lo <= int(v) <= hi:
                return True
    return False


def _check_column(col: np.ndarray, limit: int, side: str, part_name: str) -> None:
    lo, hi = int(col.min()), int(col.max())
    if lo < 0:  # the first bad row, and its own index
        row = int(np.argmax(col < 0))
        raise IndexError(f"block_mapping: {side} block index must be >= 0, got {int(col[row])} in row {row}")
    if hi >= limit:
        row = int(np.argmax(col >= limit))
        raise IndexError(
            f"block_mapping: {side} block index {int(col[row])} in row {row} is out of range for "
            f"{part_name} with {limit} blocks (expected 0 <= index < {limit})"
        )


def check_mapping(m: np.ndarray, src_blocks: int, dst_blocks: int, src_name: str, dst_name: str) -> None:
    """Check a normalized mapping against the parts' block counts.

    Parameters
    ----------
    m : numpy.ndarray of shape (N, 2), int64
        Output of :func:`normalize_mapping`, ``N >= 1``.
    src_blocks, dst_blocks : int
        Fewest blocks among the source / destination parts.
    src_name, dst_name : str
        Names of the parts with those fewest blocks, for messages.

    Raises
    ------
    IndexError
        An index is negative or past the end.
    ValueError
        A destination block appears twice (the result would depend on timing).
    """
    # Few NumPy calls on the common, valid path (each costs microseconds);
    # the precise error is searched for only once something is wrong.  Seen
    # as uint64, a negative index is larger than any block count, so one
    # whole-array reduction checks both bounds.  (NumPy's axis=0 reduction of
    # an (N, 2) array was measured at ~30 us for N = 1250, the flat one at
    # ~1.5 us.)
    if int(m.view(np.uint64).max()) >= min(src_blocks, dst_blocks) and (
        m.min() < 0 or int(m[:, 0].max()) >= src_blocks or int(m[:, 1].max()) >= dst_blocks
    ):
        _check_column(m[:, 0], src_blocks, "source", src_name)
        _check_column(m[:, 1], dst_blocks, "destination", dst_name)
    if m.shape[0] > 1 and _has_duplicates(m[:, 1], dst_blocks):
        d = np.sort(m[:, 1])
        dup = np.flatnonzero(d[1:] == d[:-1])
        block = int(d[dup[0]])
        rows = np.flatnonzero(m[:, 1] == block)[:2].tolist()
        raise ValueError(
            f"block_mapping: expected distinct destination blocks, got block {block} "
            f"twice (rows {rows[0]} and {rows[1]})"
        )


def _has_duplicates(col: np.ndarray, limit: int) -> bool:
    """True if ``col`` (in-range indices) repeats a value.  A counting pass
    is fastest while ``limit`` counters are few next to the rows; else sort
    (on the device's host: 11 us for 1250 rows, where counting 50 000
    blocks takes 23 us; benchmarks/host_costs.py)."""
    if limit <= 8 * col.shape[0]:
        return bool(np.bincount(col, minlength=0).max() > 1)
    s = np.sort(col)
    return bool((s[1:] == s[:-1]).any())


def run_starts(columns: np.ndarray) -> np.ndarray:
    """The run detector: where runs of consecutive blocks start.

    Parameters
    ----------
    columns : numpy.ndarray of shape (N,) or (N, C), int64
        Block indices; a run continues while every column steps by +1.

    Returns
    -------
    numpy.ndarray of shape (R,), int64
        Row index of each run's first row, ascending (``[0, ...]``; empty
        when ``N == 0``).
    """
    n = columns.shape[0]
    if n == 0:
        return np.empty(0, dtype=np.int64)
    step = columns[1:] - columns[:-1]
    if step.ndim == 1:
        broken = step != 1
    else:  # column by column: NumPy's any(axis=1) over (N, 2) costs 5x more (17 against 3.6 µs at 1250 rows)
        broken = step[:, 0] != 1
        for c in range(1, step.shape[1]):
            broken |= step[:, c] != 1
    return np.concatenate(([0], np.flatnonzero(broken) + 1))


def one_run(rows, n: int) -> tuple[int, int] | None:
    """``(first source, first destination)`` when ``n >= 2`` rows (an
    ``(n, 2)`` array, or its flat list) are one run on both sides, else
    None (its ends in O(1), then one NumPy pass: 1,250 rows in a few µs).
    A run in range (:func:`run_in_range`) needs no other check: no block
    comes twice."""
    flat = rows.item if type(rows) is np.ndarray else rows.__getitem__
    if n < 2:
        return None
    s, d, last = flat(0), flat(1), 2 * n - 2
    if flat(last) - s != n - 1 or flat(last + 1) - d != n - 1:
        return None
    if type(rows) is list:
        if rows[0::2] != list(range(s, s + n)) or rows[1::2] != list(range(d, d + n)):
            return None
    elif not bool((rows[1:] - rows[:-1] == 1).all()):
        return None
    return s, d


def run_in_range(ends, n: int, layout) -> bool:
    """Whether the run of ``n`` rows from ``ends`` (:func:`one_run`) lies in
    ``layout``'s blocks on both sides."""
    return (
        ends[0] >= 0 and ends[1] >= 0 and ends[0] + n <= layout.src_limit and ends[1] + n <= layout.dst_limit
    )


def check_rows_for(layout, rows, max_blocks: int):
    """The host check of :func:`host_rows`' output: a short flattened list
    is checked with builtins (``min``, ``max``, ``set``: no NumPy at this
    size) and returned as it is; anything else (and any failure, for its
    precise message) goes through :func:`check_mapping_for`."""
    if type(rows) is np.ndarray and rows.shape[0] <= SMALL_MAPPING:
        rows = rows.ravel().tolist()  # the copy engines also take short lists faster
    if type(rows) is list and rows and not layout.meeting:
        dsts = rows[1::2]
        if (
            min(rows) >= 0
            and max(rows[0::2]) < layout.src_limit
            and max(dsts) < layout.dst_limit
            and len(set(dsts)) == len(dsts)
        ):
            return rows
    if type(rows) is list:
        rows = np.array(rows, dtype=np.int64).reshape(-1, 2)
    elif (
        type(rows) is np.ndarray
        and rows.dtype == np.int64
        and rows.ndim == 2
        and rows.shape[1] == 2
        and rows.shape[0] <= max_blocks
        and rows.flags.c_contiguous
    ):
        return _checked(layout, rows)  # host_rows' form already: no second normalization
    return check_mapping_for(layout, rows, max_blocks)


def check_mapping_for(layout, block_mapping, max_blocks: int | None = None) -> np.ndarray:
    """Normalize ``block_mapping`` and check it against ``layout``.

    Returns
    -------
    numpy.ndarray of shape (N, 2), int64
    """
    return _checked(layout, normalize_mapping(block_mapping, max_blocks))


def _checked(layout, m: np.ndarray) -> np.ndarray:
    """``m`` (normalized) after the checks of :func:`check_mapping_for`."""
    if m.shape[0]:
        check_mapping(m, layout.src_limit, layout.dst_limit, layout.src_limit_name, layout.dst_limit_name)
        for di, oi in layout.meeting:
            _check_part_overlap(layout, m, di, oi)
    return m


def _block_intervals(part, blocks: np.ndarray) -> np.ndarray:
    starts = part.ptr + blocks * part.block_stride
    return np.column_stack((starts, starts + part.block_bytes))


def _check_part_overlap(layout, m: np.ndarray, di: int, oi: int) -> None:
    """Reject a mapping where bytes written to ``dst[di]`` are also read (or
    written) through part ``oi`` in the same launch: blocks are copied in
    parallel, so the result would depend on timing."""
    n_src = len(layout.src)
    d = layout.dst[di]
    written = _block_intervals(d, m[:, 1])
    if oi < n_src:
        other, other_rows, verb = layout.src[oi], m[:, 0], "read"
    else:
        other, other_rows, verb = layout.dst[oi - n_src], m[:, 1], "written"
    touched = _block_intervals(other, other_rows)
    # All touched intervals have one size, so sorted by start they are sorted
    # by end too: the last one starting before a write ends is the only
    # candidate that can still reach into it.  O(N log N).
    order = np.argsort(touched[:, 0], kind="stable")
    t_start, t_end = touched[order, 0], touched[order, 1]
    cand = np.searchsorted(t_start, written[:, 1], side="left") - 1
    valid = cand >= 0
    hit = np.zeros(len(written), dtype=bool)
    hit[valid] = t_end[cand[valid]] > written[valid, 0]
    if hit.any():
        row = int(np.argmax(hit))
        other_row = int(order[cand[row]])
        raise ValueError(
            f"block_mapping: row {row} writes {d.name} block {int(m[row, 1])}, whose bytes "
            f"are also {verb} by row {other_row} ({other.name} block {int(other_rows[other_row])}) "
            f"in the same swap; copy through a separate buffer or split the swap"
        )
