"""Mappings that live on the GPU (CuPy arrays, torch CUDA int64 tensors,
as (N, 2) rows or two 1-D index arrays): swapped with no host
synchronization, checked by the copy launch; a bad one writes no byte and
its error comes from the event's synchronize() and from the op's next call."""

import numpy as np
import pytest

import cupy_swap as cs
from cupy_swap.tools.bench import random_mapping

from .gpu_helpers import DIRECTIONS, Gate, make, poison, rand_fill, require_gpu, to_host

pytestmark = pytest.mark.gpu

cp = require_gpu()


def _expect(src, dst_before, mapping):
    expected = dst_before.copy()
    expected[mapping[:, 1]] = to_host(src)[mapping[:, 0]]
    return expected


@pytest.mark.parametrize("direction", list(DIRECTIONS))
@pytest.mark.parametrize("n", [1, 2, 16, 1250, 4096])
def test_gpu_mapping_moves_the_same_bytes(rng, direction, n):
    sw = cs.BlockSwapper(max_blocks=4096)
    skind, dkind = DIRECTIONS[direction]
    src, dst = make(skind, (5000, 80), np.uint8), make(dkind, (4500, 80), np.uint8)
    rand_fill(src, rng)
    poison(dst)
    m = random_mapping(n, 5000, 4500, rng)
    before = to_host(dst).copy()
    ev = sw.swap(src, dst, cp.asarray(m))
    ev.synchronize()
    assert ev.path == "kernel"
    assert np.array_equal(to_host(dst), _expect(src, before, m))


@pytest.mark.parametrize("parts", [3, 16, 17, 64, 65])
def test_gpu_mapping_part_counts(rng, parts):
    sw = cs.BlockSwapper(max_blocks=64)
    host = [cs.empty_pinned((70, 16 * (i % 5 + 1)), np.uint8) for i in range(parts)]
    gpu = [cp.empty((60, 16 * (i % 5 + 1)), cp.uint8) for i in range(parts)]
    for h, g in zip(host, gpu):
        rand_fill(h, rng)
        poison(g)
    m = random_mapping(40, 70, 60, rng)
    op = sw.prepare(host, gpu)
    op(cp.asarray(m)).synchronize()
    for h, g in zip(host, gpu):
        assert np.array_equal(cp.asnumpy(g)[m[:, 1]], h[m[:, 0]])


@pytest.mark.parametrize(
    "bad, error, message",
    [
        ((5, 0, 7000), IndexError, r"source block index 7000 in row 5 is out of range"),
        ((9, 1, -1), IndexError, r"destination block index -1 in row 9 is out of range"),
        (
            (12, 1, None),
            ValueError,
            r"expected distinct destination blocks, got block \d+ again in row 12",
        ),
    ],
    ids=["source", "destination", "duplicate"],
)
def test_bad_gpu_mapping_writes_nothing_and_reports_its_row(rng, bad, error, message):
    sw = cs.BlockSwapper(max_blocks=64)
    host = cs.empty_pinned((100, 256), np.uint8)
    gpu = cp.empty((100, 256), cp.uint8)
    rand_fill(host, rng)
    poison(gpu)
    m = random_mapping(20, 100, 100, rng)
    row, col, value = bad
    m[row, col] = m[3, 1] if value is None else value
    op = sw.prepare(host, gpu)
    ev = op(cp.asarray(m))
    for _ in range(2):  # the event says so every time it is asked
        with pytest.raises(error, match=message):
            ev.synchronize()
    assert (cp.asnumpy(gpu) == 0xA5).all()  # not one byte written
    good = random_mapping(4, 100, 100, rng)
    op(cp.asarray(good)).synchronize()  # the event raised it: the next call does not
    assert np.array_equal(cp.asnumpy(gpu)[good[:, 1]], host[good[:, 0]])
    # Nobody asked the event: the op's next call (host rows too) raises it, once.
    ev = op(cp.asarray(m))
    cp.cuda.Device().synchronize()  # the check has run
    with pytest.raises(error, match=message):
        op(good)
    op(good).synchronize()
    with pytest.raises(error, match=message):
        ev.synchronize()  # and the event still tells its own failure


@pytest.mark.parametrize("kind", ["cupy", "torch"])
def test_gpu_index_pairs(rng, kind):
    """Two 1-D int64 index arrays on the GPU, as SGLang keeps them."""
    sw = cs.BlockSwapper(max_blocks=64)
    host = cs.empty_pinned((64, 256), np.uint8)
    gpu = cp.empty((64, 256), cp.uint8)
    rand_fill(host, rng)
    poison(gpu)
    m = random_mapping(40, 64, 64, rng)
    if kind == "torch":
        torch = pytest.importorskip("torch")
        if not torch.cuda.is_available():
            pytest.skip("needs torch with CUDA")
        pair = (torch.from_numpy(m[:, 0].copy()).cuda(), torch.from_numpy(m[:, 1].copy()).cuda())
    else:
        pair = (cp.asarray(m[:, 0]), cp.asarray(m[:, 1]))
    before = cp.asnumpy(gpu)
    sw.swap_in(host, gpu, pair).synchronize()
    assert np.array_equal(cp.asnumpy(gpu), _expect(host, before, m))
    bad = (cp.asarray(m[:, 0]), cp.asarray(np.r_[m[:-1, 1], m[0, 1]]))  # the last row repeats the first
    poison(gpu)
    with pytest.raises(ValueError, match=f"block {m[0, 1]} again in row 39"):
        sw.swap_in(host, gpu, bad).synchronize()
    assert (cp.asnumpy(gpu) == 0xA5).all()
    with pytest.raises(ValueError, match="two 1-D GPU arrays of one length"):
        sw.swap_in(host, gpu, (cp.asarray(m[:, 0]), cp.asarray(m[:-1, 1])))


def test_gpu_mapping_needs_no_host_synchronization(rng):
    """The call returns while a spin kernel ahead of it on the stream still
    runs: nothing read the mapping back."""
    sw = cs.BlockSwapper(max_blocks=16)
    host = cs.empty_pinned((32, 512), np.uint8)
    gpu = cp.empty((32, 512), cp.uint8)
    rand_fill(host, rng)
    stream = cp.cuda.Stream(non_blocking=True)
    m = cp.asarray(random_mapping(8, 32, 32, rng))
    op = sw.prepare(host, gpu)
    op(m, stream=stream).synchronize()  # compile and build the check state first
    poison(gpu)
    cp.cuda.Device().synchronize()
    gate = Gate(stream)
    ev = op(m, stream=stream)
    assert gate.closed and not ev.done  # queued behind the gate: the host did not wait
    gate.open()
    ev.synchronize()
    mm = cp.asnumpy(m)
    assert np.array_equal(cp.asnumpy(gpu)[mm[:, 1]], host[mm[:, 0]])


def test_status_records_wrap(rng):
    """More swaps than ring slots (each owns a status record): every one
    lands, failures before and after the wrap are reported by their events
    and by the next call."""
    sw = cs.BlockSwapper(max_blocks=8, ring_size=8)
    host = cs.empty_pinned((64, 128), np.uint8)
    gpu = cp.empty((64, 128), cp.uint8)
    rand_fill(host, rng)
    op = sw.prepare(host, gpu)
    bad = cp.asarray([[0, 1], [2, 1]])  # block 1 twice
    failed = op(bad)
    cp.cuda.Device().synchronize()  # the check has run
    with pytest.raises(ValueError, match="again in row 1"):  # the next call reports the failure
        op(cp.asarray([[0, 0]]))
    with pytest.raises(ValueError, match="again in row 1"):
        failed.synchronize()  # and so does its event, while its record stands
    for i in range(8 + 3):
        m = cp.asarray([[i % 64, (i * 7) % 64], [(i + 1) % 64, (i * 7 + 1) % 64]])
        op(m).synchronize()
        assert np.array_equal(cp.asnumpy(gpu)[(i * 7) % 64], host[i % 64])
    failed = op(bad)
    with pytest.raises(ValueError, match="again in row 1"):
        failed.synchronize()


def test_gpu_mapping_refusals(rng):
    sw = cs.BlockSwapper(max_blocks=8)
    host = cs.empty_pinned((16, 64), np.uint8)
    gpu = cp.empty((16, 64), cp.uint8)
    with pytest.raises(TypeError, match="expected int64 block indices on the GPU"):
        sw.swap(host, gpu, cp.zeros((2, 2), cp.int32))
    with pytest.raises(ValueError, match=r"expected shape \(N, 2\)"):
        sw.swap(host, gpu, cp.zeros((2, 3), cp.int64))
    with pytest.raises(ValueError, match="C-contiguous"):
        sw.swap(host, gpu, cp.zeros((4, 2), cp.int64)[::2])
    with pytest.raises(ValueError, match="at most max_blocks=8 rows"):
        sw.swap(host, gpu, cp.zeros((9, 2), cp.int64))
    with pytest.raises(ValueError, match="mode: a mapping on the GPU is swapped by the kernel"):
        sw.swap(host, gpu, cp.zeros((1, 2), cp.int64), mode="dma")
    with pytest.raises(TypeError, match="on the GPU"):  # plan() reads the rows on the host
        sw.plan(host, gpu, cp.zeros((1, 2), cp.int64))
    stream = cp.cuda.Stream(non_blocking=True)
    stream.begin_capture()
    try:
        with pytest.raises(RuntimeError, match="cannot be captured"):
            sw.swap(host, gpu, cp.zeros((1, 2), cp.int64), stream=stream)
    finally:
        stream.end_capture()


def test_torch_cuda_mapping(rng):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs torch with CUDA")
    sw = cs.BlockSwapper(max_blocks=16)
    cpu = torch.zeros((32, 64), dtype=torch.float16).pin_memory()
    cpu.copy_(torch.randn((32, 64), dtype=torch.float16))
    gpu = torch.zeros((32, 64), dtype=torch.float16, device="cuda")
    m = torch.tensor([[3, 0], [7, 5], [31, 9]], dtype=torch.int64, device="cuda")
    sw.swap_in(cpu, gpu, m).synchronize()
    assert torch.equal(gpu[[0, 5, 9]].cpu(), cpu[[3, 7, 31]])
    with pytest.raises(TypeError, match="int64"):
        sw.swap_in(cpu, gpu, m.float())
