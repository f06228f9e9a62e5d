"""Short swaps (n <= 16): does spreading them over more SMs help?  Blocking
latency (submit + synchronize, median) of prepared kernel swaps with the
short-swap grid (``SHORT_SWAP_BYTES``) against the CTA budget alone, and
with pairs inline against the descriptor ring.

    PYTHONPATH=$PWD python3 benchmarks/short_swaps.py
"""

from __future__ import annotations

import cupy
import numpy as np

from cupy_swap import BlockSwapper
from cupy_swap.cuda import launcher
from cupy_swap.tools.bench import CaseBuffers, SwapCase, memcpy_ceiling, time_blocking


def main():
    rng = np.random.default_rng(0)
    stream = cupy.cuda.Stream(non_blocking=True)
    print(f"{'case':<22} {'memcpy':>8} {'spread':>8} {'budget':>8} {'ring':>8}   GB/s, blocking")
    for direction in ("in", "out"):
        for block, n in ((4096, 16), (32768, 16), (262144, 16), (4096, 1250)):
            bufs = CaseBuffers(SwapCase(direction, block, n), rng)
            nbytes = bufs.case.total_bytes
            ceil = nbytes / memcpy_ceiling(bufs, stream, 30)["latency_s"] / 1e9
            row = []
            for short, inline in (
                (launcher.SHORT_SWAP_BYTES, None),
                (0, None),
                (launcher.SHORT_SWAP_BYTES, 0),
            ):
                sw = BlockSwapper(max_blocks=n, mode="kernel", max_inline_pairs=inline)
                op = sw.prepare(bufs.src, bufs.dst)
                saved = launcher.SHORT_SWAP_BYTES
                launcher.SHORT_SWAP_BYTES = short
                launcher.launch_shape.__defaults__ = (short,)
                try:
                    t = time_blocking(lambda op=op, m=bufs.mapping: op(m, stream=stream), stream, 40)
                finally:
                    launcher.SHORT_SWAP_BYTES = saved
                    launcher.launch_shape.__defaults__ = (saved,)
                assert bufs.verify()
                row.append(nbytes / t["latency_s"] / 1e9)
            print(
                f"{direction} {block >> 10:>4} KiB x {n:<6} {ceil:8.2f} " + " ".join(f"{g:8.2f}" for g in row)
            )


if __name__ == "__main__":
    main()
