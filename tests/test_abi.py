"""The kernel ABI is defined once in Python (cupy_swap/cuda/abi.py); these
CPU tests read kernels_cu/swap_abi.cuh and block_swap.cu and check that the
CUDA side agrees: constants, struct fields, tiers, argument lists."""

import ctypes
import re
from types import SimpleNamespace

import numpy as np

from cupy_swap.cuda import abi, kernels


def _layout(table, units_per_pair, src_limit=10, dst_limit=20):
    """What the ABI reads of a resolved layout."""
    return SimpleNamespace(
        table=table, units_per_pair=units_per_pair, src_limit=src_limit, dst_limit=dst_limit
    )


def _header() -> str:
    return (kernels.kernel_dir() / "swap_abi.cuh").read_text()


def _kernel_source() -> str:
    return (kernels.kernel_dir() / "block_swap.cu").read_text()


def _define(name: str) -> str:
    match = re.search(rf"^#define {name} (.+?)(\s*//.*)?$", _header(), re.MULTILINE)
    assert match, f"{name} not defined in swap_abi.cuh"
    return match.group(1).strip()


def _struct_fields(name: str) -> list[tuple[str, str]]:
    body = re.search(rf"struct {name} \{{(.*?)\}};", _header(), re.DOTALL).group(1)
    return re.findall(r"^\s*(\w+) (\w+(?:\[[^\]]+\])?);", body, re.MULTILINE)


def test_constants_match():
    assert int(_define("CUPY_SWAP_HEADER_WORDS")) == abi.HEADER_WORDS
    assert int(_define("CUPY_SWAP_PART_WORDS")) == abi.PART_WORDS
    assert int(_define("CUPY_SWAP_MAX_PARTS")) == abi.MAX_PARTS
    assert int(_define("CUPY_SWAP_UNROLL")) == abi.UNROLL
    assert int(_define("CUPY_SWAP_MAX_THREADS")) == abi.MAX_THREADS


def test_structs_are_64_bit_words_in_the_documented_order():
    header = _struct_fields("SwapHeader")
    names = ["n_pairs", "n_parts", "units_per_pair", "src_limit", "dst_limit", "status", "seq", "arrivals"]
    assert [n for _, n in header] == names
    part = _struct_fields("SwapPart")
    assert [n for _, n in part] == ["src", "dst", "src_stride", "dst_stride", "units", "first_unit"]
    for ctype, _ in header + part:
        assert ctype in ("u64", "i64")  # one word each, so words == fields
    assert len(header) == abi.HEADER_WORDS and len(part) == abi.PART_WORDS
    # The .cuh asserts the sizes the compiler sees.
    for struct in ("SwapHeader", "SwapPart"):
        assert f"static_assert(sizeof({struct})" in _header()


def test_control_record_matches_the_slot_words():
    from cupy_swap.cuda import slots

    assert int(_define("CUPY_SWAP_CONTROL_WORDS")) == abi.CONTROL_WORDS
    control = [n for _, n in _struct_fields("SwapControl")]
    assert control == ["n_pairs", "status", "seq", "done", "src_index", "dst_index", "index_step", "replays"]
    where = (
        slots.N_PAIRS,
        slots.STATUS,
        slots.SEQ,
        slots.DONE,
        slots.SRC_INDEX,
        slots.DST_INDEX,
        slots.INDEX_STEP,
    )
    assert list(where) == [control.index(n) for n in control[:7]]
    assert "static_assert(sizeof(SwapControl)" in _header()
    assert "SwapInline" not in _header() and "SwapInline" not in _kernel_source()  # one form per use


def test_gpu_mapping_structs_match():
    assert int(_define("CUPY_SWAP_STATUS_WORDS")) == abi.STATUS_WORDS
    status = _struct_fields("SwapStatus")
    assert [n for _, n in status] == ["seq", "kind", "row", "value", "alarm", "unused[3]"]
    tiers = re.findall(r"X\((\d+)\)", _define("CUPY_SWAP_BYREF_TIERS\\(X\\)"))
    assert tuple(int(p) for p in tiers) == abi.BYREF_PARTS
    body = re.search(r"struct SwapByRef \{(.*?)\};", _header(), re.DOTALL).group(1)
    names = re.findall(r"(\w+(?:\[\w+\])?);", body)  # pointers too: the name before each ';'
    assert names == ["header", "src_index", "dst_index", "index_step", "control", "parts[P]"]
    table = np.arange(2 * abi.PART_WORDS, dtype=np.int64)
    args = abi.ByRefArgs(16, _layout(table, 5), fn=0)
    args.set(7, 0x2000, 42, 0x1000, 0x1008, 2, 0x3000, 0x4000)
    words = args.words
    assert words[:8].tolist() == [7, 2, 5, 10, 20, 0x2000, 42, 0x4000]
    assert words[8:12].tolist() == [0x1000, 0x1008, 2, 0x3000]
    assert words[12 : 12 + table.size].tolist() == table.tolist() and words.size == 12 + 16 * abi.PART_WORDS
    (struct_ptr,) = (ctypes.c_void_p * 1).from_address(args.ptr)
    assert struct_ptr == words.ctypes.data


def test_check_table_has_two_slots_a_row_then_keeps_the_rows():
    for n in (1, 2, 3, 16, 1250, 1792, 4096):
        slots = abi.check_shared_bytes(n) // 8 - n  # the table, then 8 bytes a kept row
        assert slots >= 2 * n and slots & (slots - 1) == 0 and slots < 4 * max(n, 2)


def test_launch_shape_covers_every_unit():
    from cupy_swap.cuda.launcher import launch_shape

    for units in (1, 31, 256, 4096, 65536, 1 << 20, 40 << 20):
        grid, threads = launch_shape(units, max_ctas=8)
        assert 1 <= threads <= abi.MAX_THREADS and threads % 32 == 0
        assert grid <= 8  # the CTA budget holds
        if units <= 8 * abi.MAX_THREADS * abi.UNROLL:
            assert grid * threads * abi.UNROLL >= units  # one round of loads when the budget allows
