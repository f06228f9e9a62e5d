"""Every dtype torch has, swapped on a GPU: host (pinned CPU tensors) -> GPU,
GPU -> host and GPU -> GPU, random bytes into poisoned destinations, every
destination byte compared with a NumPy reference ``dst[d] = src[s]``.  The
dtypes are enumerated from torch, so a dtype a new torch adds is covered.
Then vLLM's ``swap_blocks`` test with ``kv_cache_dtype="fp8"``: float8_e4m3fn
key and value caches in vLLM's shapes, swapped per layer."""

import numpy as np
import pytest

import cupy_swap as cs
from cupy_swap.tools.bench import random_mapping

from .gpu_helpers import DIRECTIONS, POISON, require_gpu, require_torch_cuda

pytestmark = [pytest.mark.gpu, pytest.mark.torch]

require_gpu()
torch = require_torch_cuda()

DTYPES = sorted({v for v in vars(torch).values() if isinstance(v, torch.dtype)}, key=str)


def _raw(where: str, shape) -> "torch.Tensor":
    """uint8 memory: pinned on the host, or on the GPU."""
    if where == "host":
        return torch.empty(shape, dtype=torch.uint8, pin_memory=True)
    return torch.empty(shape, dtype=torch.uint8, device="cuda")


def _as(raw, dtype):
    """``raw`` (bytes, last axis a multiple of 16) viewed as ``dtype``; a
    dtype torch cannot put on that device skips: there is nothing to swap."""
    try:
        return raw.view(dtype)
    except (RuntimeError, NotImplementedError) as e:  # pragma: no cover - depends on the torch build
        pytest.skip(f"torch cannot view {raw.device.type} uint8 memory as {dtype}: {e}")


def _random_bytes(shape, seed: int):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, shape, dtype=torch.uint8, generator=g)


def _swap_and_check(sw, src_raw, dst_raw, src, dst, mapping, **kw):
    """One swap of the typed views; every byte of ``dst`` against the NumPy
    reference built from the byte views."""
    before = dst_raw.cpu().numpy().copy()  # .cpu() of a CPU tensor is the tensor itself
    src_bytes = src_raw.cpu().numpy().copy()
    sw.swap(src, dst, mapping, **kw).synchronize()
    ref = before.copy()
    ref[mapping[:, 1]] = src_bytes[mapping[:, 0]]
    got = dst_raw.cpu().numpy()
    assert np.array_equal(got, ref)
    untouched = np.setdiff1d(np.arange(dst_raw.shape[0]), mapping[:, 1])
    assert (got[untouched] == POISON).all()


@pytest.mark.parametrize("direction", list(DIRECTIONS))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_torch_dtype_bit_exact(swapper, rng, direction, dtype):
    skind, dkind = DIRECTIONS[direction]
    src_blocks, dst_blocks, n = 90, 70, 48
    block = (16, 128)  # bytes: the last axis divides by every itemsize (complex128: 16)
    src_raw, dst_raw = _raw(skind, (src_blocks, *block)), _raw(dkind, (dst_blocks, *block))
    src_raw.copy_(_random_bytes(src_raw.shape, seed=3))
    dst_raw.fill_(POISON)
    src, dst = _as(src_raw, dtype), _as(dst_raw, dtype)
    assert src.dtype == dtype and src.data_ptr() == src_raw.data_ptr()
    mapping = random_mapping(n, src_blocks, dst_blocks, rng)
    plan = swapper.plan(src, dst, mapping)
    assert plan.src[0].ptr == src.data_ptr() and plan.dst[0].ptr == dst.data_ptr()  # views, no copies
    _swap_and_check(swapper, src_raw, dst_raw, src, dst, mapping, stream=torch.cuda.current_stream())
    # And as a list of per-layer parts (views of one block-first tensor).
    dst_raw.fill_(POISON)
    src_parts = [src[:, 4 * i : 4 * i + 4] for i in range(4)]
    dst_parts = [dst[:, 4 * i : 4 * i + 4] for i in range(4)]
    _swap_and_check(swapper, src_raw, dst_raw, src_parts, dst_parts, mapping)


@pytest.mark.parametrize("mode", ["kernel", "dma"])
@pytest.mark.parametrize("direction", ["in", "out"])
def test_float8_cache_with_uint8_host_storage(swapper, rng, mode, direction):
    """A float8_e4m3fn GPU cache pairs with uint8 pinned storage (NumPy has
    no float8; older vLLM keeps fp8 caches as uint8): bytes move as they are."""
    gpu_raw, host = _raw("gpu", (64, 16, 64)), cs.empty_pinned((80, 16, 64), np.uint8)
    gpu = gpu_raw.view(torch.float8_e4m3fn)
    host_raw = torch.from_numpy(host)
    if direction == "out":
        gpu_raw.copy_(_random_bytes(gpu_raw.shape, seed=11))
        host.fill(POISON)
        _swap_and_check(swapper, gpu_raw, host_raw, gpu, host, random_mapping(40, 64, 80, rng), mode=mode)
    else:
        host[...] = _random_bytes(host.shape, seed=12).numpy()
        gpu_raw.fill_(POISON)
        _swap_and_check(swapper, host_raw, gpu_raw, host, gpu, random_mapping(40, 80, 64, rng), mode=mode)


def test_float8_types_do_not_pair(swapper):
    a = torch.zeros((8, 64), dtype=torch.float8_e4m3fn, device="cuda")
    b = torch.zeros((8, 64), dtype=torch.float8_e5m2, device="cuda")
    with pytest.raises(
        TypeError, match=r"^dst: expected dtype torch.float8_e4m3fn like src, got torch.float8_e5m2$"
    ):
        swapper.swap(a, b, [(0, 1)])
    host = torch.zeros((8, 64), dtype=torch.bfloat16).pin_memory()
    with pytest.raises(TypeError, match=r"^dst: expected dtype float16 like src, got torch.bfloat16$"):
        swapper.swap(torch.zeros((8, 64), dtype=torch.float16, device="cuda"), host, [(0, 1)])


# --- vLLM's test_swap_blocks, kv_cache_dtype="fp8" ---------------------------
# vLLM (tests/kernels/test_cache.py) makes per-layer caches with
# create_kv_caches_with_random: key [num_blocks, heads, head_size // x,
# block_size, x] with x = 16 // itemsize, value [num_blocks, heads, head_size,
# block_size]; fp8 values drawn uniformly in [-scale, scale] and converted;
# block_mapping an (N, 2) int64 CPU tensor, swap_blocks(src, dst, mapping)
# once for the key and once for the value cache of each layer; src and dst
# blocks distinct when both caches are on one device.  vLLM skips fp8 with a
# CPU side (its fp8 conversion is a CUDA op) and head sizes not a multiple of
# 16 (the key shape would drop elements); here fp8 runs in every direction.

VLLM_DIRECTIONS = [("cuda", "cpu"), ("cuda", "cuda"), ("cpu", "cuda")]
NUM_LAYERS, NUM_HEADS, NUM_BLOCKS, NUM_MAPPINGS = 2, 8, 1024, 256


def _fp8_kv_caches(block_size: int, head_size: int, device: str, seed: int):
    """Per-layer float8_e4m3fn key and value caches of random values, as
    vLLM's create_kv_caches_with_random makes them (scale 1.0)."""
    fp8 = torch.float8_e4m3fn
    x = 16 // torch.tensor([], dtype=fp8).element_size()
    g = torch.Generator().manual_seed(seed)
    shapes = (
        (NUM_BLOCKS, NUM_HEADS, head_size // x, block_size, x),
        (NUM_BLOCKS, NUM_HEADS, head_size, block_size),
    )
    caches = []
    for shape in shapes:
        layers = []
        for _ in range(NUM_LAYERS):
            values = torch.empty(shape, dtype=torch.float16).uniform_(-1.0, 1.0, generator=g).to(fp8)
            layers.append(values.pin_memory() if device == "cpu" else values.to(device))
        caches.append(layers)
    return caches  # [key_caches, value_caches]


def _poison_caches(caches):
    for layers in caches:
        for c in layers:
            c.view(torch.uint8).fill_(POISON)


@pytest.mark.parametrize("direction", VLLM_DIRECTIONS, ids=lambda d: f"{d[0]}->{d[1]}")
@pytest.mark.parametrize("head_size", [64, 80, 256])
@pytest.mark.parametrize("block_size", [8, 16, 32])
def test_vllm_swap_blocks_fp8(swapper, direction, head_size, block_size):
    import random

    random.seed(0)
    src_device, dst_device = direction
    src_blocks = random.sample(range(NUM_BLOCKS), NUM_MAPPINGS)
    if src_device == dst_device:  # vLLM: the mapping must not overlap on one device
        dst_blocks = random.sample(sorted(set(range(NUM_BLOCKS)) - set(src_blocks)), NUM_MAPPINGS)
    else:
        dst_blocks = random.sample(range(NUM_BLOCKS), NUM_MAPPINGS)
    block_mapping = torch.tensor(list(zip(src_blocks, dst_blocks)), dtype=torch.int64).view(
        -1, 2
    )  # on the CPU

    src_key_caches, src_value_caches = _fp8_kv_caches(block_size, head_size, src_device, seed=1)
    dst_key_caches, dst_value_caches = _fp8_kv_caches(block_size, head_size, dst_device, seed=2)
    _poison_caches([dst_key_caches, dst_value_caches])
    src_clones = [c.clone() for c in src_key_caches + src_value_caches]

    stream = torch.cuda.current_stream()
    for layer in range(NUM_LAYERS):  # vLLM's swap_blocks: one call per cache per layer
        swapper.swap(src_key_caches[layer], dst_key_caches[layer], block_mapping, stream=stream)
        swapper.swap(src_value_caches[layer], dst_value_caches[layer], block_mapping, stream=stream)
    torch.cuda.synchronize()

    untouched = sorted(set(range(NUM_BLOCKS)) - set(dst_blocks))
    for src, dst in zip(src_clones, dst_key_caches + dst_value_caches):
        assert dst.dtype == torch.float8_e4m3fn
        got, want = dst.view(torch.uint8).cpu(), src.view(torch.uint8).cpu()
        assert torch.equal(got[dst_blocks], want[src_blocks])  # bit-exact, NaN bytes included
        assert (got[untouched] == POISON).all()


def test_vllm_fp8_all_layers_k_and_v_in_one_call(swapper):
    """The same caches, every layer's K and V as parts of one swap out and
    back in (block-first pinned host cache, per-layer GPU caches)."""
    head_size, block_size, n = 128, 16, 300
    gpu_key, gpu_value = _fp8_kv_caches(block_size, head_size, "cuda", seed=5)
    host = torch.empty(
        (NUM_BLOCKS + 100, NUM_LAYERS, 2, NUM_HEADS * head_size * block_size), dtype=torch.uint8
    )
    host = host.pin_memory().view(torch.float8_e4m3fn)
    host.view(torch.uint8).fill_(POISON)
    gpu_parts = [
        c.view(NUM_BLOCKS, -1) for layer in range(NUM_LAYERS) for c in (gpu_key[layer], gpu_value[layer])
    ]
    host_parts = [host[:, layer, kv] for layer in range(NUM_LAYERS) for kv in range(2)]
    g = torch.Generator().manual_seed(9)
    out_map = torch.stack(
        [torch.randperm(NUM_BLOCKS, generator=g)[:n], torch.randperm(NUM_BLOCKS + 100, generator=g)[:n]], 1
    )
    swapper.swap_out(gpu_parts, host_parts, out_map, stream=torch.cuda.current_stream()).synchronize()
    for gp, hp in zip(gpu_parts, host_parts):  # compared as bytes: indexing float8 is not everywhere
        assert torch.equal(hp.view(torch.uint8)[out_map[:, 1]], gp.view(torch.uint8)[out_map[:, 0]].cpu())
    fresh = [torch.full_like(gp.view(torch.uint8), POISON).view(torch.float8_e4m3fn) for gp in gpu_parts]
    swapper.swap_in(host_parts, fresh, out_map[:, [1, 0]].contiguous()).synchronize()
    for gp, fp in zip(gpu_parts, fresh):
        got, want = fp.view(torch.uint8), gp.view(torch.uint8)
        assert torch.equal(got[out_map[:, 0]], want[out_map[:, 0]])
        rest = torch.ones(NUM_BLOCKS, dtype=torch.bool, device="cuda")
        rest[out_map[:, 0].cuda()] = False
        assert bool((got[rest] == POISON).all())
