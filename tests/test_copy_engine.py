"""The copy-engine path on the CPU, with stand-ins for the driver calls: the
legacy default stream (raw handles 0 and 1) never reaches
``cuMemcpyBatchAsync``, which refuses it; other streams do."""

import numpy as np
import pytest

from cupy_swap.cuda.copy_engine import DmaCopier

H2D = 1


class _Driver:
    """Records the batch call's stream handle and each single copy."""

    def __init__(self, takes_fail: bool):
        self.batches, self.copies, self.takes_fail = [], [], takes_fail

    def batch(self, *args):
        # dsts, srcs, sizes, count, attrs, attr_idxs, num_attrs, [fail_idx,] stream
        assert len(args) == (9 if self.takes_fail else 8)
        self.batches.append((args[3], args[-1]))
        return 0  # CUDA_SUCCESS

    def memcpy(self, dst, src, size, kind, stream):
        self.copies.append((dst, src, size, kind, stream))


def _copier(takes_fail: bool) -> tuple:
    driver = _Driver(takes_fail)
    copier = DmaCopier()
    copier._batch = (driver.batch, takes_fail)  # set before first use: issue() loads neither
    copier._memcpy = driver.memcpy
    return copier, driver


def _copies(count: int, as_list: bool):
    dsts = np.arange(count, dtype=np.uint64) * 4096 + (1 << 40)
    srcs = np.arange(count, dtype=np.uint64) * 4096 + (2 << 40)
    sizes = np.full(count, 4096, dtype=np.uint64)
    return (dsts.tolist(), srcs.tolist(), sizes.tolist()) if as_list else (dsts, srcs, sizes)


@pytest.mark.parametrize("takes_fail", [True, False], ids=["cuda12.8-form", "cuda13-v2-form"])
@pytest.mark.parametrize("as_list", [False, True])
@pytest.mark.parametrize("stream", [0, 1], ids=["null", "cudaStreamLegacy"])
def test_legacy_stream_handles_use_single_copies(takes_fail, as_list, stream):
    copier, driver = _copier(takes_fail)
    dsts, srcs, sizes = _copies(5, as_list)
    assert copier.issue(dsts, srcs, sizes, stream, H2D) == 5
    assert driver.batches == []
    assert driver.copies == [(int(d), int(s), 4096, H2D, stream) for d, s in zip(dsts, srcs)]


@pytest.mark.parametrize("takes_fail", [True, False], ids=["cuda12.8-form", "cuda13-v2-form"])
@pytest.mark.parametrize("stream", [2, 0x7F00_1234_5600], ids=["cudaStreamPerThread", "created-stream"])
def test_other_streams_take_one_batch_call(takes_fail, stream):
    copier, driver = _copier(takes_fail)
    assert copier.issue(*_copies(5, False), stream, H2D) == 5
    assert driver.batches == [(5, stream)] and driver.copies == []


def test_capturing_stream_uses_single_copies():
    copier, driver = _copier(True)
    assert copier.issue(*_copies(3, False), 0x7F00, H2D, capturing=True) == 3
    assert driver.batches == [] and len(driver.copies) == 3


@pytest.mark.gpu
@pytest.mark.parametrize("direction", ["in", "out"])
def test_dma_swap_on_the_legacy_stream_handle(swapper, rng, direction):
    """``stream=1`` (cudaStreamLegacy) with many copies: the driver's batch
    call would refuse the handle; the swap goes copy by copy, bit-exact."""
    cp = pytest.importorskip("cupy")
    import cupy_swap as cs
    from cupy_swap.tools.bench import random_mapping

    host, gpu = cs.empty_pinned((50, 4096), np.uint8), cp.empty((40, 4096), cp.uint8)
    if direction == "in":
        src, dst, src_n, dst_n = host, gpu, 50, 40
        host[...] = rng.integers(0, 256, host.shape, dtype=np.uint8)
        gpu.fill(0xA5)
    else:
        src, dst, src_n, dst_n = gpu, host, 40, 50
        gpu.set(rng.integers(0, 256, gpu.shape, dtype=np.uint8))
        host.fill(0xA5)
    mapping = random_mapping(30, src_n, dst_n, rng)  # scattered: 30 copies, a batch elsewhere
    ref = cp.asnumpy(dst) if direction == "in" else dst.copy()
    ref[mapping[:, 1]] = (cp.asnumpy(src) if direction == "out" else src)[mapping[:, 0]]
    swapper.swap(src, dst, mapping, mode="dma", stream=1).synchronize()
    assert swapper.last_path == "dma"
    assert np.array_equal(cp.asnumpy(dst) if direction == "in" else dst, ref)
