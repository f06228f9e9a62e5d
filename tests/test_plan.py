"""Parts, pairing and whole-swap checks that need no GPU (GPU parts are
NumPy arrays that claim to be GPU memory: the ``fake_gpu`` fixture)."""

import numpy as np
import pytest

from cupy_swap.core.layout import check_swap, layout_from_parts, vector_width
from cupy_swap.core.mapping import check_mapping_for
from cupy_swap.core.parts import HOST, as_parts
from cupy_swap.cuda.abi import HEADER_WORDS, PART_WORDS, ByRefArgs
from cupy_swap.cuda.resolve import resolve_layout

from .fakes import on_gpu


def test_part_of_plain_array():
    a = np.zeros((10, 16, 8, 128), dtype=np.float16)
    (p,) = as_parts(a, "src")
    assert p.location == HOST and p.num_blocks == 10
    assert p.block_bytes == 16 * 8 * 128 * 2 == p.block_stride
    assert p.block_shape == (16, 8, 128) and p.dtype == np.float16 and p.name == "src"


def test_part_of_block_first_view():
    cache = np.zeros((7, 32, 2, 16, 8), dtype=np.float16)  # [blocks, layers, K/V, ...]
    parts = as_parts([cache[:, 3, 0], cache[:, 3, 1]], "dst")
    assert [p.name for p in parts] == ["dst[0]", "dst[1]"]
    assert parts[0].block_stride == 32 * 2 * 16 * 8 * 2
    assert parts[0].block_bytes == 16 * 8 * 2
    assert parts[1].ptr - parts[0].ptr == 16 * 8 * 2


def test_size_one_axes_do_not_break_contiguity():
    a = np.zeros((4, 1, 8), dtype=np.int8)[:, :, :]
    a = np.lib.stride_tricks.as_strided(a, strides=(8, 999, 1))
    assert as_parts(a, "src")[0].block_bytes == 8


def test_non_contiguous_block_rejected():
    a = np.zeros((4, 8, 8), dtype=np.float32)[:, :, ::2]
    with pytest.raises(ValueError, match=r"src: expected each block src\[i\] to be C-contiguous"):
        as_parts(a, "src")


def test_zero_d_rejected():
    with pytest.raises(ValueError, match="ndim >= 1"):
        as_parts(np.float32(1.0).reshape(()), "src")


@pytest.mark.parametrize(
    "empty",
    [
        np.zeros((0, 16), np.float32),
        np.lib.stride_tricks.as_strided(np.zeros(4, np.float32), (0, 16), (4, 12)),  # any strides
        np.zeros((16, 4), np.float32).T[:0],  # (0, 16), F-order strides
        np.zeros((4, 0), np.float32),  # zero-byte blocks
        np.zeros((3, 2, 0, 5), np.uint8),
    ],
)
def test_empty_arrays_are_parts(empty):
    """As NumPy's own flags treat them: an array with no elements has no
    layout to get wrong, so it is accepted whatever its strides."""
    (p,) = as_parts(empty, "src")
    assert p.num_blocks == empty.shape[0]
    assert p.block_bytes == empty.dtype.itemsize * int(np.prod(empty.shape[1:]))


def test_empty_part_with_empty_mapping_moves_nothing(fake_gpu):
    host = np.zeros((0, 16), np.uint8)
    gpu = fake_gpu.part(np.lib.stride_tricks.as_strided(np.zeros(4, np.uint8), (0, 16), (7, 3)), "dst")
    layout = layout_from_parts(as_parts(host, "src"), [gpu])
    assert check_mapping_for(layout, []).shape == (0, 2)
    with pytest.raises(IndexError, match="out of range for src with 0 blocks"):
        check_mapping_for(layout, [(0, 0)])
    zero_bytes = layout_from_parts(
        as_parts(np.zeros((4, 0), np.uint8), "src"), [fake_gpu.part(np.zeros((4, 0), np.uint8), "dst")]
    )
    assert zero_bytes.bytes_per_pair == 0
    assert check_mapping_for(zero_bytes, [(0, 1)]).tolist() == [[0, 1]]


def test_parts_do_not_keep_arrays_alive():
    import gc
    import weakref

    a = np.zeros((4, 8), np.uint8)
    ref = weakref.ref(a)
    parts = as_parts([a, a[:, :4]], "src")
    del a
    gc.collect()
    assert ref() is None and len(parts) == 2


def test_wrong_types_rejected():
    with pytest.raises(TypeError, match="src: expected an array or a list/tuple of arrays, got dict"):
        as_parts({}, "src")
    with pytest.raises(TypeError, match=r"src\[1\]: expected a cupy.ndarray \(GPU\) or a numpy.ndarray"):
        as_parts([np.zeros((2, 2)), "text"], "src")
    with pytest.raises(ValueError, match="src: expected at least one array"):
        as_parts([], "src")
    with pytest.raises(TypeError, match="Python objects"):
        as_parts(np.empty((2, 2), dtype=object), "src")


def test_host_to_host_rejected():
    a, b = np.zeros((4, 8)), np.zeros((4, 8))
    with pytest.raises(ValueError, match="host memory on both sides"):
        check_swap(a, b, [(0, 1)])


def _check_overlap(src, dst, mapping):
    return check_mapping_for(layout_from_parts(src, dst), mapping)


def test_pairing_checks(monkeypatch):
    import cupy_swap.core.layout as plan_mod

    real = plan_mod.as_parts

    def as_parts_src_on_gpu(obj, name, convert=None):
        parts = real(obj, name, convert)
        return on_gpu(parts) if name == "src" else parts

    monkeypatch.setattr(plan_mod, "as_parts", as_parts_src_on_gpu)
    a = np.zeros((4, 8), dtype=np.float16)
    with pytest.raises(ValueError, match=r"dst: expected as many parts as src \(2\), got 1"):
        check_swap([a, a], [a.copy()], [(0, 1)])
    with pytest.raises(TypeError, match=r"dst: expected dtype float16 like src, got float32"):
        check_swap(a, np.zeros((4, 8), np.float32), [(0, 1)])
    with pytest.raises(ValueError, match=r"dst: expected block shape \(8,\) like src, got \(4, 2\)"):
        check_swap(a, np.zeros((4, 4, 2), np.float16), [(0, 1)])
    ro = np.zeros((4, 8), np.float16)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="dst: expected a writeable destination, got a read-only array"):
        check_swap(a, ro, [(0, 1)])
    with pytest.raises(IndexError, match="destination block index 4"):
        check_swap(a, np.zeros((4, 8), np.float16), [(0, 4)])
    with pytest.raises(IndexError, match=r"source block index 9 .* src\[1\] with 3 blocks"):
        check_swap([a, a[:3]], [a.copy(), a.copy()], [(9, 0)])
    with pytest.raises(ValueError, match="at most max_blocks=1"):
        check_swap(a, np.zeros((4, 8), np.float16), [(0, 1), (1, 2)], max_blocks=1)


def test_mixed_locations_on_one_side_rejected(fake_gpu):
    from cupy_swap.core.layout import _side_location

    a = np.zeros((4, 8), dtype=np.float16)
    parts = [fake_gpu.part(a, "src[0]"), as_parts(a, "src[1]")[0]]
    with pytest.raises(
        ValueError, match=r"src: expected every part on one side .*got src\[1\] in host memory"
    ):
        _side_location(parts, "src")


def test_overlapping_destination_blocks_rejected(fake_gpu):
    a = np.zeros(64, dtype=np.uint8)
    dst = np.lib.stride_tricks.as_strided(a, shape=(8, 16), strides=(8, 1))
    src = np.zeros((8, 16), dtype=np.uint8)
    monkey = fake_gpu.part(src, "src")
    from cupy_swap.core.layout import _pair_parts

    with pytest.raises(ValueError, match="dst: expected destination blocks that do not overlap"):
        _pair_parts([monkey], as_parts(dst, "dst"))


def test_same_buffer_gpu_to_gpu_overlap_rejected(fake_gpu):
    buf = np.zeros((8, 32), dtype=np.uint8)
    s, d = fake_gpu.part(buf, "src"), fake_gpu.part(buf, "dst")
    _check_overlap([s], [d], [(0, 1), (2, 3)])  # disjoint blocks: fine
    with pytest.raises(ValueError, match=r"row 1 writes dst block 2, whose bytes are also read by row 1"):
        _check_overlap([s], [d], [(0, 1), (2, 2)])
    with pytest.raises(ValueError, match=r"row 0 writes dst block 3.*read by row 1 \(src block 3\)"):
        _check_overlap([s], [d], [(0, 3), (3, 4)])


def test_overlap_between_different_views(fake_gpu):
    cache = np.zeros((8, 2, 16), dtype=np.uint8)  # K and V of one buffer
    k_src, v_src = fake_gpu.part(cache[:, 0], "src[0]"), fake_gpu.part(cache[:, 1], "src[1]")
    k_dst, v_dst = fake_gpu.part(cache[:, 0], "dst[0]"), fake_gpu.part(cache[:, 1], "dst[1]")
    _check_overlap([k_src, v_src], [k_dst, v_dst], [(0, 4), (1, 5)])
    with pytest.raises(ValueError, match="also read"):
        _check_overlap([k_src, v_src], [k_dst, v_dst], [(0, 4), (4, 5)])
    # Two destination parts that are the same memory: write/write.
    with pytest.raises(ValueError, match="also written"):
        _check_overlap([k_src, v_src], [k_dst, k_dst], [(0, 4)])


def test_overlap_with_partial_byte_overlap(fake_gpu):
    raw = np.zeros(256, dtype=np.uint8)
    src = fake_gpu.part(np.lib.stride_tricks.as_strided(raw, shape=(8, 16), strides=(16, 1)), "src")
    dst = fake_gpu.part(np.lib.stride_tricks.as_strided(raw[8:], shape=(8, 16), strides=(16, 1)), "dst")
    with pytest.raises(ValueError, match="also read"):
        _check_overlap([src], [dst], [(1, 0)])  # dst block 0 = bytes 8..24, src 1 = 16..32
    _check_overlap([src], [dst], [(5, 0)])


@pytest.mark.parametrize(
    "values, width",
    [
        ([0x1000, 32768, 65536], 16),
        ([0x1008, 32768], 8),
        ([0x1000, 48], 16),
        ([0x1000, 2], 2),
        ([3], 1),
        ([4, 12], 4),
    ],
)
def test_vector_width(values, width):
    assert vector_width(values) == width


def test_kernel_parameter_layout(fake_gpu):
    src = [
        fake_gpu.part(np.zeros((4, 32), np.uint8), "src[0]"),
        fake_gpu.part(np.zeros((4, 64), np.uint8), "src[1]"),
    ]
    dst = [
        fake_gpu.part(np.zeros((6, 32), np.uint8), "dst[0]"),
        fake_gpu.part(np.zeros((6, 64), np.uint8), "dst[1]"),
    ]
    layout = resolve_layout(layout_from_parts(src, dst), device=0)  # device parts: no driver call
    assert check_mapping_for(layout, [(1, 2), (3, 0)]).tolist() == [[1, 2], [3, 0]]
    out = ByRefArgs(16, layout, fn=0).words  # header, four index words, then the part table
    width = layout.width
    assert width == vector_width([p.ptr for p in src + dst] + [32, 64])
    assert out[:HEADER_WORDS].tolist() == [0, 2, (32 + 64) // width, 4, 6, 0, 0, 0]
    at = HEADER_WORDS + 4
    t = out[at : at + 2 * PART_WORDS].reshape(2, PART_WORDS)
    assert t[0].tolist() == [src[0].ptr, dst[0].ptr, 32, 32, 32 // width, 0]
    assert t[1].tolist() == [src[1].ptr, dst[1].ptr, 64, 64, 64 // width, 32 // width]
    assert not out[at + 2 * PART_WORDS :].any()  # the rest of the 16-part table stays zero


def test_device_part_on_other_gpu_rejected(fake_gpu):
    src = [fake_gpu.part(np.zeros((4, 32), np.uint8), "src")]
    dst = [fake_gpu.part(np.zeros((4, 32), np.uint8), "dst", device=1)]
    with pytest.raises(
        ValueError, match=r"dst: expected an array on GPU 0 \(the swapper's device\), got one on GPU 1"
    ):
        resolve_layout(layout_from_parts(src, dst), device=0)


def test_part_span_negative_stride():
    a = np.zeros((5, 8), dtype=np.uint8)[::-1]
    (p,) = as_parts(a, "src")
    lo, hi = p.span()
    assert hi - lo == 40 and p.block_stride == -8


def test_copy_list_and_count(fake_gpu):
    from cupy_swap.core.copies import copy_list

    src = [fake_gpu.part(np.zeros((10, 64), np.uint8), "src")]
    dst = [fake_gpu.part(np.zeros((10, 64), np.uint8), "dst")]
    layout = resolve_layout(layout_from_parts(src, dst), device=0)
    m = check_mapping_for(layout, [(0, 5), (1, 6), (2, 7), (9, 0)])
    assert len(copy_list(layout, m)[2]) == 2
    dsts, srcs, sizes = copy_list(layout, m)
    assert sizes.tolist() == [192, 64]
    assert (srcs - src[0].ptr).tolist() == [0, 9 * 64] and (dsts - dst[0].ptr).tolist() == [5 * 64, 0]
    # A strided (block-first) view copies block by block.
    cache = np.zeros((10, 2, 64), np.uint8)
    layout2 = resolve_layout(layout_from_parts([fake_gpu.part(cache[:, 1], "src")], dst), device=0)
    assert len(copy_list(layout2, m)[2]) == 4
    d2, s2, z2 = copy_list(layout2, m)
    assert z2.tolist() == [64] * 4 and (s2 - layout2.src[0].ptr).tolist() == [0, 128, 256, 9 * 128]


def test_pair_copies_match_numpy_path(fake_gpu):
    from cupy_swap.core.copies import copy_list, pair_copies

    src = [
        fake_gpu.part(np.zeros((10, 64), np.uint8), "src"),
        fake_gpu.part(np.zeros((10, 2, 32), np.uint8)[:, 1], "s1"),
    ]
    dst = [
        fake_gpu.part(np.zeros((10, 64), np.uint8), "dst"),
        fake_gpu.part(np.zeros((10, 32), np.uint8), "d1"),
    ]
    layout = resolve_layout(layout_from_parts(src, dst), device=0)
    for s, d in [(0, 5), (9, 0), (3, 3)]:
        m = check_mapping_for(layout, [(s, d)])
        assert [x.tolist() for x in copy_list(layout, m)] == list(pair_copies(layout, s, d))
    m = check_mapping_for(layout, [(0, 5), (1, 6), (2, 7), (9, 0)])
    assert len(copy_list(layout, m)[2]) == 2 + 4  # runs of the packed part, blocks of the strided one
    one = resolve_layout(layout_from_parts(src[1:], dst[1:]), device=0)  # one part: its own branch
    for s, d in [(0, 5), (9, 0)]:
        m = check_mapping_for(one, [(s, d)])
        assert [x.tolist() for x in copy_list(one, m)] == list(pair_copies(one, s, d))


def test_interleaved_views_never_meet(fake_gpu):
    """K and V views of one block-first buffer never share bytes: the layout
    records no part pairs to check, so mappings skip the overlap search."""
    cache = np.zeros((8, 4, 2, 16), dtype=np.uint8)  # [blocks, layers, K/V, bytes]
    gpu = [fake_gpu.part(np.zeros((8, 16), np.uint8), f"src[{i}]") for i in range(8)]
    views = [
        fake_gpu.part(cache[:, layer, kv], f"dst[{2 * layer + kv}]") for layer in range(4) for kv in range(2)
    ]
    assert layout_from_parts(gpu, views).meeting == []
    # The same view twice is a real write/write conflict.
    assert layout_from_parts(gpu[:2], [views[0], views[0]]).meeting == [(0, 3)]


def test_a_run_copies_as_the_numpy_path_merges_it(fake_gpu):
    """Issue 50, item 5: a mapping that is one run on both sides goes to the
    copy engines as one copy a part, its ends its only check (one_run), the
    copies those of copy_list's merged path; a strided part, a run that
    steps back inside, a run past either end or one row is no run."""
    from cupy_swap.core.copies import copy_list, run_copies
    from cupy_swap.core.mapping import one_run, run_in_range

    src = [
        fake_gpu.part(np.zeros((10, 64), np.uint8), "s0"),
        fake_gpu.part(np.zeros((10, 32), np.uint8), "s1"),
    ]
    dst = [
        fake_gpu.part(np.zeros((12, 64), np.uint8), "d0"),
        fake_gpu.part(np.zeros((12, 32), np.uint8), "d1"),
    ]
    layout = resolve_layout(layout_from_parts(src, dst), device=0)
    for s, d, n in [(0, 0, 10), (2, 5, 7), (8, 10, 2)]:
        m = np.column_stack([np.arange(s, s + n), np.arange(d, d + n)]).astype(np.int64)
        for rows in (m, m.ravel().tolist()):
            assert one_run(rows, n) == (s, d) and run_in_range((s, d), n, layout)
        assert [x.tolist() for x in copy_list(layout, m)] == list(run_copies(layout, s, d, n))
    m = np.array([[0, 4], [2, 6], [1, 5], [3, 7]], np.int64)  # ends span a run, the middle does not
    assert one_run(m, 4) is None and one_run(m.ravel().tolist(), 4) is None
    assert one_run(np.array([[3, 3]], np.int64), 1) is None
    assert not run_in_range((9, 0), 2, layout)  # past the source's end
    assert not run_in_range((-1, 0), 2, layout) and not run_in_range((0, -1), 2, layout)
    assert not run_in_range((1, 11), 2, layout)  # past the destination's
    strided = [fake_gpu.part(np.zeros((10, 2, 32), np.uint8)[:, 1], "s2")]
    assert run_copies(resolve_layout(layout_from_parts(strided, dst[1:]), device=0), 0, 0, 3) is None


def test_a_one_run_swap_on_the_copy_engines_checks_its_ends(fake_gpu, monkeypatch):
    """The prepared op's copy-engine path with one run: one copy a part,
    rows not checked one by one; a run past an end still raises the full
    check's message, naming the row, before anything is issued."""
    from cupy_swap import prepared

    from .fakes import FakeSwapper

    monkeypatch.setattr(prepared, "stream_is_capturing", lambda handle: False)
    sw = FakeSwapper([])
    src = [fake_gpu.part(np.zeros((10, 64), np.uint8), "s0")]
    dst = [fake_gpu.part(np.zeros((12, 64), np.uint8), "d0")]
    layout = resolve_layout(layout_from_parts(src, dst), device=0)
    issued = []
    sw._dma.copy = lambda layout, rows, stream, capturing, merge=True, run=None: issued.append(run)
    op = prepared.PreparedSwap(sw, layout, None, mode="dma")
    op(np.array([[2, 5], [3, 6], [4, 7]], np.int64), stream=7)
    assert issued[-1] == ([dst[0].ptr + 5 * 64], [src[0].ptr + 2 * 64], [3 * 64])
    op(np.array([[2, 5], [4, 6], [3, 7]], np.int64), stream=7)  # not one run: the rows, checked
    assert issued[-1] is None
    with pytest.raises(IndexError, match="source block index 10 in row 1 is out of range"):
        op(np.array([[9, 5], [10, 6]], np.int64), stream=7)
    assert len(issued) == 2
