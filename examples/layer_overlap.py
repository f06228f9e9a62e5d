"""Swap a request's blocks in layer by layer while the layers before compute.

Engines hide transfers behind compute: every layer's swap-in is queued at once on a
side stream, each returning an event, and the compute stream waits for layer l's
event only just before layer l reads its blocks, so later layers copy while earlier
ones compute. Going out is the mirror image: a swap-out on the side stream waits
(``wait_for=``) for the compute that wrote its blocks. Nothing blocks the host
until the end, where every block is checked bit for bit.

    python examples/layer_overlap.py [--layers 8] [--blocks 128]
"""

import argparse
import sys

import numpy as np

import cupy_swap

BLOCK = (16, 8, 128)  # tokens x KV heads x head dim: 32 KiB of fp16


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description="Overlap per-layer swaps with compute.")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--blocks", type=int, default=128, help="blocks swapped in per layer")
    args = p.parse_args(argv)
    try:  # CuPy imported once the arguments are parsed: --help works without it
        import cupy
    except ImportError as e:  # CuPy comes with the cuda12 or cuda13 extra: one line, exit 3 (below)
        msg = f"needs CuPy ({e}); install cupy_swap with its cuda12 or cuda13 extra"
        raise cupy_swap.CudaUnavailableError(msg) from e
    rng, n, layers = np.random.default_rng(0), args.blocks, range(args.layers)
    host = [cupy_swap.empty_pinned((2 * n, *BLOCK), np.float16) for _ in layers]  # one host pool per layer
    for h in host:
        h.view(np.uint16)[...] = rng.integers(0, 1 << 16, h.shape, dtype=np.uint16)
    gpu = [cupy.zeros((2 * n, *BLOCK), cupy.float16) for _ in layers]
    src, dst = rng.permutation(2 * n)[:n], rng.permutation(2 * n)[:n]  # host blocks -> free GPU blocks
    new_block = int(np.setdiff1d(np.arange(2 * n), dst)[0])  # a GPU block the step writes
    out_block = int(np.setdiff1d(np.arange(2 * n), src)[0])  # a free host block it goes to
    sw = cupy_swap.BlockSwapper(max_blocks=n)
    swap_in = [sw.prepare(host[i], gpu[i]) for i in layers]  # checked once, when the caches exist
    swap_out = [sw.prepare(gpu[i], host[i]) for i in layers]
    compute, side = cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)
    cupy.cuda.Device().synchronize()  # the zeros above are written before either stream runs

    arrived = [op(np.stack([src, dst], 1), stream=side) for op in swap_in]  # all queued, none waited on
    seen, saved = [], []
    with compute:
        x, dst_gpu = cupy.ones((2048, 2048), cupy.float32), cupy.asarray(dst)
        for i in layers:
            compute.wait_event(arrived[i])  # layer i's blocks are in; later layers may still be copying
            seen.append(gpu[i][dst_gpu])  # attention reads the blocks ...
            x = x @ x / 2048  # ... and the layer computes (a stand-in)
            gpu[i][new_block] = i  # the step writes new KV into one block
            saved.append(swap_out[i]([(new_block, out_block)], stream=side, wait_for=compute))
    saved[-1].synchronize()  # the side stream ran in order: every swap is done
    compute.synchronize()

    for i in layers:
        assert np.array_equal(cupy.asnumpy(seen[i]).view(np.uint16), host[i][src].view(np.uint16))
        assert np.array_equal(host[i][out_block], np.full(BLOCK, i, np.float16))
    print(
        f"ok: {args.layers} layers x {n} blocks swapped in on a side stream, each read after its event: bit-exact"
    )
    print("ok: each layer's new block swapped out after the compute that wrote it (wait_for=): bit-exact")


if __name__ == "__main__":
    try:
        sys.exit(main())
    except cupy_swap.CudaUnavailableError as e:  # no GPU, driver or CuPy here: one line, exit 3
        print(f"{sys.argv[0]}: {e}", file=sys.stderr)
        sys.exit(3)
