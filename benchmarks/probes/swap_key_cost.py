"""What ``swap()`` on lists of parts pays before it reaches its prepared op:
the op cache's key (``OpCache.key``) over every part of both sides, on the
CPU (NumPy parts stand in for both sides: the key's cost per array is the
same look at owner, address, shape, strides, dtype).

Issue 34 measured ``swap()`` on 64 parts at 70-250 µs of host time against
9-30 µs for the prepared op; the key alone accounts for most of it:

    python benchmarks/probes/swap_key_cost.py
"""

import sys
import timeit
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from cupy_swap import op_cache  # noqa: E402


def best(fn, number: int) -> float:
    return min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e6


def row(parts: int) -> str:
    pool = np.zeros((64, parts, 4096), np.uint8)
    views = [pool[:, p] for p in range(parts)]
    separate = [np.zeros((64, 4096), np.uint8) for _ in range(parts)]

    def fresh():
        return [pool[:, p] for p in range(parts)]

    same = best(lambda: op_cache.OpCache.key(views, views), 2000)
    sep = best(lambda: op_cache.OpCache.key(separate, separate), 2000)
    made = best(lambda: (fresh(), fresh()), 500)
    new = best(lambda: op_cache.OpCache.key(fresh(), fresh()), 500) - made
    return (
        f"{parts:>3} parts a side: key of the same arrays {same:6.1f} us (separate arrays {sep:6.1f}); "
        f"of fresh views {new:6.1f} us ({new / (2 * parts):.2f} per array; making them {made:.1f})"
    )


def main() -> None:
    for parts in (1, 2, 16, 61, 64):
        print(row(parts), flush=True)


if __name__ == "__main__":
    main()
