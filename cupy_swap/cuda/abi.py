"""The kernel ABI, defined once on the Python side: kernel names, argument
lists, and the layout of the header, part table and pairs.  It mirrors
``kernels_cu/swap_abi.cuh``; ``tests/test_abi.py`` reads that file and checks
that the two agree, and the ``.cuh`` asserts its struct sizes.

One form carries a swap to the kernel (see the ``.cuh``): a
``SwapByRef<P>`` parameter holding header and part table and the addresses
of a ``SwapControl`` record (count, status, number, where the rows are:
:mod:`.slots`) and of the rows (:class:`ByRefArgs`).  The launch can check
its rows (the bounds in header words 3-4; the status address and the swap's
number in the control record); the check needs :func:`check_shared_bytes`
of dynamic shared memory.
"""

from __future__ import annotations

import ctypes

import numpy as np

HEADER_WORDS = 8  # n_pairs, n_parts, units_per_pair, src_limit, dst_limit, status, seq, arrivals
CONTROL_WORDS = 8  # SwapControl: n_pairs, status, seq, done, src_index, dst_index, index_step, replays
PART_WORDS = 6  # src, dst, src_stride, dst_stride, units, first_unit
MAX_PARTS = 256  # the largest slot kernel's part table (BYREF_PARTS)
UNROLL = 4  # 16-byte loads in flight per thread
MAX_THREADS = 1024  # __launch_bounds__ of the swap kernels
WIDTHS = (16, 8, 4, 2, 1)  # bytes per unit, one kernel each
PARAM_LIMIT = 32764  # bytes of kernel parameters CUDA 12.1+ allows


FETCH_KERNEL = "cupy_swap_fetch"  # graph swaps' row upload, 16-byte words
STATUS_WORDS = 8  # SwapStatus: seq, kind, row, value, alarm, 3 unused
CHECK_KEY_LIMIT = 0xFFFFFFFF  # the check keeps source and destination blocks below this (32 bits)
BYREF_PARTS = (16, 64, 256)  # CUPY_SWAP_BYREF_TIERS
FETCH_THREADS = 256


def byref_kernel(width: int, parts: int) -> str:
    """Name of the slot kernel of up to ``parts`` parts moving
    ``width``-byte units."""
    if width not in WIDTHS:
        raise ValueError(f"width: expected one of {WIDTHS}, got {width!r}")
    return f"cupy_swap_w{width}_ref{parts}"


def kernel_names() -> list[str]:
    """Every kernel the module may hold (the largest slot tier needs
    CUDA 12.1 or later)."""
    return [byref_kernel(w, p) for w in WIDTHS for p in BYREF_PARTS] + [FETCH_KERNEL]


def check_shared_bytes(n_pairs: int) -> int:
    """Dynamic shared memory the in-launch check of ``n_pairs`` rows needs:
    its table of at least ``2 n`` slots (a power of two), 8 bytes each
    (``table_slots`` in the ``.cu``), then the rows it keeps for the copy,
    8 bytes each."""
    slots = 2
    while slots < 2 * n_pairs:
        slots <<= 1
    return 8 * slots + 8 * n_pairs


def write_layout(words: np.ndarray, layout, table_at: int = HEADER_WORDS) -> None:
    """Write what every launch of ``layout`` shares: header words 1-4 (parts,
    units per pair, the check's bounds) and the part table at ``table_at``.
    The pair count, status and seq (words 0, 5, 6) are written per launch;
    status 0 turns the check off."""
    table = layout.table
    words[1] = table.shape[0] // PART_WORDS
    words[2] = layout.units_per_pair
    words[3], words[4] = layout.src_limit, layout.dst_limit
    words[table_at : table_at + table.shape[0]] = table


class FetchArgs:
    """Arguments ``(src, dst, n16)`` of the upload kernel."""

    def __init__(self, src_ptr: int):
        self.src = ctypes.c_uint64(src_ptr)
        self.dst = ctypes.c_uint64(0)
        self.n16 = ctypes.c_uint64(0)
        fields = (self.src, self.dst, self.n16)
        self._array = (ctypes.c_void_p * 3)(*(ctypes.addressof(f) for f in fields))

    def set(self, dst_ptr: int, n16: int) -> int:
        self.dst.value = dst_ptr
        self.n16.value = n16
        return ctypes.addressof(self._array)


class ByRefArgs:
    """The one parameter of a slot kernel, a ``SwapByRef<P>``: header and
    part table of one layout, written once; :meth:`set` writes a launch's
    capacity, rows and control record.  ``ptr`` is the ``void**`` a launch
    (or a graph's kernel node) takes; the driver copies the struct then.
    ``parts``: ``P``, one of :data:`BYREF_PARTS`; ``layout``: resolved, at
    most ``parts`` parts; ``fn``: the kernel function.
    """

    __slots__ = ("fn", "words", "ptr", "_array")

    def __init__(self, parts: int, layout, fn: int):
        self.fn = fn
        self.words = np.zeros(HEADER_WORDS + 4 + parts * PART_WORDS, dtype=np.int64)
        write_layout(self.words, layout, HEADER_WORDS + 4)  # after the index addresses, step and control
        self._array = (ctypes.c_void_p * 1)(self.words.ctypes.data)
        self.ptr = ctypes.addressof(self._array)

    def copy(self) -> ByRefArgs:
        """Another parameter with the same words (a ring slot's own)."""
        other = ByRefArgs.__new__(ByRefArgs)
        other.fn, other.words = self.fn, self.words.copy()
        other._array = (ctypes.c_void_p * 1)(other.words.ctypes.data)
        other.ptr = ctypes.addressof(other._array)
        return other

    def set(
        self,
        n_pairs: int,
        status: int,
        seq: int,
        src_index: int,
        dst_index: int,
        step: int,
        control: int = 0,
        arrivals: int = 0,
    ) -> int:
        """Store one launch's words; returns the ``void**`` address.
        ``control`` 0: ``n_pairs``, ``status`` and ``seq`` are the launch's;
        else the kernel reads them from the ``SwapControl`` at ``control``
        and ``n_pairs`` is how many rows it may read at ``src_index``.
        ``arrivals``: the slot's CTA count (0: no done word)."""
        w = self.words
        w[0], w[5], w[6], w[7] = n_pairs, status, seq, arrivals
        h = HEADER_WORDS
        w[h], w[h + 1], w[h + 2], w[h + 3] = src_index, dst_index, step, control
        return self.ptr
