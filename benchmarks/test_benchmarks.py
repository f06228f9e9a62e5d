"""pytest-benchmark suite over the performance goals (GPU only).

    PYTHONPATH=$PWD python -m pytest benchmarks/ --benchmark-json out.json

Each timed call is one blocking swap (submit + stream synchronize).  The
contiguous-memcpy ceiling of the same bytes is measured once per case and
``extra_info`` carries GB/s, the ceiling and the ratio.
"""

import pytest

from cupy_swap.tools.bench import CaseBuffers, SwapCase, gpu_status, memcpy_ceiling

GPU_OK, GPU_WHY = gpu_status()
pytestmark = pytest.mark.skipif(not GPU_OK, reason=f"needs a CUDA GPU: {GPU_WHY}")

KIB, MIB = 1 << 10, 1 << 20
CASES = [
    SwapCase(d, b, n, parts=p)
    for d in ("in", "out")
    for b, n, p in [
        (4 * KIB, 1250, 1),
        (32 * KIB, 1250, 1),
        (256 * KIB, 1250, 1),
        (2 * MIB, 1250, 1),
        (4 * KIB, 10000, 1),
        (32 * KIB, 10000, 1),
        (32 * KIB, 16, 1),
        (32 * KIB, 1, 1),
        (2 * MIB, 1, 1),
        (32 * KIB, 1250, 64),
    ]
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.label().replace(" ", ""))
def test_swap(benchmark, case):
    import cupy
    import numpy as np

    from cupy_swap import BlockSwapper

    bufs = CaseBuffers(case, np.random.default_rng(0), spare=2 if case.total_bytes < (1 << 30) else 1)
    stream = cupy.cuda.Stream(non_blocking=True)
    sw = BlockSwapper(max_blocks=case.num_blocks)
    src, dst, m = bufs.src, bufs.dst, bufs.mapping

    def one_swap():
        sw.swap(src, dst, m, stream=stream)
        stream.synchronize()

    rounds = 30 if case.total_bytes < (256 << 20) else 8
    benchmark.pedantic(one_swap, rounds=rounds, warmup_rounds=3)
    assert bufs.verify()
    ceiling = memcpy_ceiling(bufs, stream, rounds)
    median = benchmark.stats.stats.median
    benchmark.extra_info.update(
        path=sw.last_path,
        bytes=case.total_bytes,
        gbps=case.total_bytes / median / 1e9,
        ceiling_gbps=case.total_bytes / ceiling["latency_s"] / 1e9,
        ratio=ceiling["latency_s"] / median,
    )


PEER_BENCH_CASES = [
    SwapCase("in", 4 * KIB, 16),
    SwapCase("in", 32 * KIB, 1250),
    SwapCase("out", 32 * KIB, 1250),
]


@pytest.mark.parametrize("case", PEER_BENCH_CASES, ids=lambda c: c.label().replace(" ", ""))
@pytest.mark.parametrize(
    "contender",
    ["seed_upload", "seed_resident", "graph_memcpy", "batch_memcpy", "cupy_swap", "cupy_swap_prepared"],
)
def test_peer(benchmark, case, contender):
    """The contenders of ``bench --peers`` (cupy_swap/peers.py), one blocking
    call per round."""
    import cupy
    import numpy as np

    from cupy_swap import BlockSwapper
    from cupy_swap.tools.peers import contender_calls

    bufs = CaseBuffers(case, np.random.default_rng(0))
    stream = cupy.cuda.Stream(non_blocking=True)
    call = contender_calls(bufs, stream, BlockSwapper(max_blocks=case.num_blocks))[contender]

    def one_call():
        call()
        stream.synchronize()

    benchmark.pedantic(one_call, rounds=30, warmup_rounds=3)
    assert bufs.verify()
    benchmark.extra_info.update(
        bytes=case.total_bytes, gbps=case.total_bytes / benchmark.stats.stats.median / 1e9
    )
