"""``demo``: swap 1250 random 32 KiB blocks out and in, print GB/s against
the contiguous-memcpy ceiling, check every byte."""

from __future__ import annotations

from .. import __version__
from . import bench
from . import cli_common as common

__all__ = ["BLOCK_BYTES", "BLOCK_TEXT", "DEMO_BLOCKS", "demo_footprint", "add_arguments", "cmd_demo"]

BLOCK_BYTES = 16 * 8 * 128 * 2  # 16 tokens x 8 KV heads x 128 dims x fp16 = 32 KiB
BLOCK_TEXT = (
    "block = one layer's K or V cache for 16 tokens: "
    "16 tokens x 8 KV heads x 128 dims x fp16 = 32 KiB (vLLM, Llama-3-8B)"
)
DEMO_BLOCKS = 1250


def demo_footprint(blocks: int = DEMO_BLOCKS, block_bytes: int = BLOCK_BYTES) -> int:
    """Bytes the demo allocates on each side (pinned host memory, and GPU
    memory) for one direction: :class:`cupy_swap.tools.bench.CaseBuffers`' cache of
    ``max(2 * blocks, blocks + 1)`` blocks plus one contiguous ``blocks``-block
    buffer for the memcpy ceiling.  The two directions run one after the
    other."""
    return (max(2 * blocks, blocks + 1) + blocks) * block_bytes


def cmd_demo(args) -> int:
    what = common.require_gpu()
    print(f"cupy_swap {__version__} demo on {what}")
    print(BLOCK_TEXT)
    mb = demo_footprint() / 1e6
    print(f"allocates {mb:.0f} MB of pinned host memory and {mb:.0f} MB of GPU memory per direction")
    ok_all = True
    for direction in ("out", "in"):
        r = bench.run_case(
            bench.SwapCase(direction, BLOCK_BYTES, DEMO_BLOCKS), reps=args.reps, baseline=False
        )
        ok_all &= r["verified"]
        print(
            f"swap {direction:>3} {DEMO_BLOCKS} random blocks ({r['bytes'] / 1e6:.1f} MB): {r['gbps']:.1f} GB/s, "
            f"{r['ratio']:.2f} of a contiguous cudaMemcpyAsync ({r['ceiling_gbps']:.1f} GB/s); "
            f"bit-exact: {'yes' if r['verified'] else 'NO'}"
        )
    return common.EXIT_OK if ok_all else common.EXIT_MISMATCH


def add_arguments(parser) -> None:
    """The demo's options on its parser."""
    parser.add_argument(
        "--reps", type=common.positive_int, default=30, help="timed repetitions per direction"
    )
