"""Capture a swap into a CUDA graph once, then replay it with a new mapping every step.

A captured ``sw.swap()`` keeps the mapping it was captured with. ``sw.graph_swap(src, dst)``
reads its mapping from a buffer at a fixed address instead: capture ``gs.launch()`` once,
and before each replay stage that step's mapping with ``gs.set_mapping(m, stream=...)`` on
the stream the graph replays on. With CuPy's stream capture, and with ``torch.cuda.graph``
when PyTorch with CUDA is installed.

    python examples/cuda_graph_swap.py [--steps 5] [--blocks 64]
"""

import argparse
import importlib.util
import sys

import numpy as np

import cupy_swap

HOST_BLOCKS, GPU_BLOCKS, BLOCK = 512, 256, (16, 8, 128)  # blocks of 32 KiB in fp16


def replay_checked(what, gs, stream, replay, read_gpu, host, mappings) -> None:
    """Stage each mapping on the replay stream, replay, and check the GPU cache bit for bit."""
    for mapping in mappings:
        expected = read_gpu()  # blocks the mapping does not name stay as they are
        expected[mapping[:, 1]] = host.view(np.uint16)[mapping[:, 0]]
        gs.set_mapping(mapping, stream=stream)  # queued on the replay stream, before the replay
        replay()
        assert np.array_equal(read_gpu(), expected)
    print(f"ok: {what} captured once, replayed with {len(mappings)} new mappings: bit-exact")


def with_cupy(sw, host, mappings) -> None:
    import cupy  # here, not at the top: --help works without CuPy

    gpu = cupy.zeros((GPU_BLOCKS, *BLOCK), cupy.float16)
    gs = sw.graph_swap(host, gpu)  # fixed arrays; the mapping changes per replay
    stream = cupy.cuda.Stream()  # a blocking stream: cupy.asnumpy() on the default stream waits for it
    gs.set_mapping([], stream=stream)  # nothing staged while capturing
    stream.begin_capture()
    gs.launch(stream=stream)  # the one call captured
    graph = stream.end_capture()
    read = lambda: cupy.asnumpy(gpu).view(np.uint16)  # noqa: E731
    replay_checked("CuPy graph", gs, stream, lambda: graph.launch(stream), read, host, mappings)


def with_torch(sw, host, mappings) -> None:
    import torch

    if not torch.cuda.is_available():
        print("skipped: torch.cuda.graph (needs PyTorch with CUDA)")
        return
    gpu = torch.zeros((GPU_BLOCKS, *BLOCK), dtype=torch.float16, device="cuda")
    gs, graph, side = sw.graph_swap(host, gpu), torch.cuda.CUDAGraph(), torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        gs.set_mapping([], stream=side)
        side.synchronize()
        with torch.cuda.graph(graph, stream=side):
            gs.launch(stream=torch.cuda.current_stream())  # captured into `graph`
    read = lambda: gpu.view(torch.int16).cpu().numpy()  # noqa: E731  (.cpu() waits for torch's stream)
    replay_checked("torch.cuda.graph", gs, torch.cuda.current_stream(), graph.replay, read, host, mappings)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description="Replay one captured swap with new mappings.")
    p.add_argument("--steps", type=int, default=5, help="replays, each with a new mapping")
    p.add_argument("--blocks", type=int, default=64, help="blocks per mapping (at most 256)")
    args = p.parse_args(argv)
    rng = np.random.default_rng(0)
    host = cupy_swap.empty_pinned((HOST_BLOCKS, *BLOCK), np.float16)  # pinned host cache
    host.view(np.uint16)[...] = rng.integers(0, 1 << 16, host.shape, dtype=np.uint16)
    mappings = [  # distinct host blocks -> distinct GPU blocks, new every step
        np.stack([rng.permutation(HOST_BLOCKS)[: args.blocks], rng.permutation(GPU_BLOCKS)[: args.blocks]], 1)
        for _ in range(args.steps)
    ]
    sw = cupy_swap.BlockSwapper(max_blocks=GPU_BLOCKS)  # a replay may carry up to max_blocks rows
    with_cupy(sw, host, mappings)
    if importlib.util.find_spec("torch") is None:
        print("skipped: torch.cuda.graph (needs PyTorch with CUDA)")
    else:
        with_torch(sw, host, mappings)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except cupy_swap.CudaUnavailableError as e:  # no GPU, driver or CuPy here: one line, exit 3
        print(f"{sys.argv[0]}: {e}", file=sys.stderr)
        sys.exit(3)
