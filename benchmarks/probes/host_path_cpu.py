"""The Python of a prepared call, on any machine (this tree's launcher; an
older tree needs the probe of its own commit): ``PreparedSwap`` over
stand-in GPU parts (``tests/fakes.py``) with every CUDA call replaced by a
no-op, so what is timed is the library's own host code.  Development CPUs
are steadier than the device's host, so changes of a fraction of a
microsecond show here that the device's noise hides; run the old and new
trees alternately and compare minima:

    for i in 1 2 3 4; do
        ROOT=/path/to/old python benchmarks/probes/host_path_cpu.py
        python benchmarks/probes/host_path_cpu.py
    done

``ROOT`` (default: this checkout) is the tree whose ``cupy_swap`` is timed.
"""

import collections
import contextlib
import os
import sys
import timeit
import types
from pathlib import Path

HERE = Path(__file__).resolve().parents[2]
ROOT = os.environ.get("ROOT", str(HERE))
sys.path.insert(0, str(Path(ROOT) / "tests"))
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402
from fakes import FakeGpu  # noqa: E402

from cupy_swap import prepared  # noqa: E402
from cupy_swap.core.layout import layout_from_parts  # noqa: E402
from cupy_swap.core.route import Policy  # noqa: E402
from cupy_swap.cuda import abi, launcher, streams  # noqa: E402
from cupy_swap.cuda.copy_engine import DmaCopier  # noqa: E402
from cupy_swap.cuda.resolve import resolve_layout  # noqa: E402

# (parts, block bytes, pairs): the host-time goal rows, and the copy-engine row.
CASES = [(1, 32768, 1), (1, 32768, 16), (1, 4096, 1250), (64, 4096, 16), (1, 2 << 20, 16)]


def _no_op(*_args):
    return 0


class _Event:
    __slots__ = ("ptr", "path", "nbytes", "start", "check", "seq", "slot")
    done = True  # a ring slot's last swap has completed

    def __init__(self, disable_timing=True):
        self.ptr, self.start, self.check, self.seq = 1, None, None, None


class _Launcher:
    """What a call reads of the launcher: a slot ring over NumPy words whose
    launches complete at once (the stand-in writes each slot's verdict and
    done word as the kernel would), launches that launch nothing."""

    def __init__(self):
        from cupy_swap.cuda.slots import DONE, SEQ, STATUS, SlotRing

        self.device, self.max_ctas, self.check_rows_max, self.slots_ok = 0, 8, 8192, True
        words = np.zeros((17, SlotRing.row_words(4096)), np.int64)
        ring = self.slots = SlotRing(0, 16, 4096, words=words, base=0x7000)

        def launch(*args):  # the kernel's part, at once: a good verdict, then the done word
            i = ring._next - 1 if ring._next else ring.size - 1  # the slot the call just took
            seq = ring.controls[i][SEQ]
            if ring.controls[i][STATUS]:
                words[i, ring._status] = seq
            ring.controls[i][DONE] = seq

        self._launch = launch

    def bind(self, layout):
        return launcher.BoundKernel(self, layout)

    def on_own_device(self):
        return contextlib.nullcontext()

    def byref_args(self, layout):
        return abi.ByRefArgs(16 if len(layout.src) <= 16 else 256, layout, 1234)

    def function(self, name):
        return 1234


def _swapper():
    """What ``PreparedSwap`` reads of its swapper, CUDA calls as no-ops."""
    events = streams.EventPool.__new__(streams.EventPool)
    events._cls, events._issued, events._size = _Event, collections.deque([_Event()]), 64
    events._refs, events._free_refs = sys.getrefcount, streams._unshared_refcount()
    dma = DmaCopier()
    dma._memcpy, dma._batch = _no_op, (_no_op, False)
    current = types.SimpleNamespace(ptr=7)
    return types.SimpleNamespace(
        device=0,
        _closed=False,
        max_blocks=4096,
        mode="auto",
        timing=False,
        policy=Policy(),
        last_path=None,
        _get_device=lambda: 0,
        _current_stream=lambda: current,
        _events=events,
        _record=_no_op,
        _launcher=_Launcher(),
        _dma=dma,
    )


def time_case(parts: int, block: int, n: int, rng) -> tuple[str, float]:
    """(path, microseconds): the fastest of four timings of the call."""
    gpu = FakeGpu()
    blocks = 2 * n + 2

    def side(name):
        return [
            gpu.part(np.zeros((blocks, block // 4096, 4096), np.uint8), f"{name}{i}") for i in range(parts)
        ]

    layout = resolve_layout(layout_from_parts(side("s"), side("d")), 0)
    layout.serial = 1
    op = prepared.PreparedSwap(_swapper(), layout, None)
    m = np.column_stack([rng.choice(blocks, n, replace=False) for _ in range(2)]).astype(np.int64)
    op(m, stream=7)
    k = 5000 if n < 100 else 1000
    best = min(timeit.repeat(lambda: op(m, stream=7), number=k, repeat=4)) / k
    return op._swapper.last_path, best * 1e6


def main() -> None:
    prepared.stream_is_capturing = lambda handle: False  # a CUDA call
    rng = np.random.default_rng(0)
    for parts, block, n in CASES:
        path, us = time_case(parts, block, n, rng)
        print(f"{parts} x {block >> 10} KiB x {n} ({path}): {us:.2f} us")


if __name__ == "__main__":
    main()
