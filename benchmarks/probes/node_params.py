"""Can a graph carry a swap's pairs in its kernel node's parameters for less
host time than a kernel launch?  For the inline kernel of a prepared op
(pairs in the launch parameters, no dependent read of host memory), one
swap is issued three ways, host time per call (median, stream synchronized
between calls) and blocking latency:

* ``launch``: ``cuLaunchKernel`` with the parameter struct (today's path);
* ``set+graph``: ``cuGraphExecKernelNodeSetParams`` of an instantiated
  one-node graph with the same struct, then ``cuGraphLaunch``;
* ``graph``: ``cuGraphLaunch`` alone (the floor; it moves stale pairs).

    PYTHONPATH=$PWD python3 benchmarks/probes/node_params.py
"""

import ctypes

import cupy as cp
import numpy as np

import cupy_swap as cs
from cupy_swap.cuda.driver import KernelNodeParams, libcuda
from cupy_swap.tools.bench import host_time, random_mapping, time_blocking


def driver_calls():
    lib = libcuda()
    get_nodes = lib.cuGraphGetNodes
    get_nodes.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)]
    set_params = lib.cuGraphExecKernelNodeSetParams
    set_params.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(KernelNodeParams)]
    graph_launch = lib.cuGraphLaunch
    graph_launch.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    return get_nodes, set_params, graph_launch


def probe_case(direction, block, n, stream, rng, calls):
    """One row: host and blocking figures of the three forms."""
    get_nodes, set_params, graph_launch = calls
    host = cs.empty_pinned((2 * n + 64, block), np.uint8)
    host[...] = rng.integers(0, 256, host.shape, dtype=np.uint8)
    gpu = cp.zeros((2 * n + 64, block), cp.uint8)
    sw = cs.BlockSwapper(max_blocks=2048, mode="kernel")
    src, dst = (host, gpu) if direction == "in" else (gpu, host)
    op = sw.prepare(src, dst)
    m = random_mapping(n, host.shape[0], gpu.shape[0], rng)
    op(m, stream=stream).synchronize()  # compiles, binds the tier
    bound = op._decided.kernel
    tier, args = next((t, a) for t, a in bound._tiers if a is not None)
    grid, threads, _ = bound._shapes[n]
    lau = sw._launcher

    def write_and_launch():
        args.words[0] = n
        args.pairs[: 2 * n] = m.reshape(-1)
        lau.launch_kernel(args.fn, grid, threads, stream.ptr, args.ptr)

    stream.begin_capture()
    write_and_launch()
    graph = stream.end_capture()
    count = ctypes.c_size_t(1)
    node = ctypes.c_void_p()
    assert get_nodes(graph.graph, ctypes.byref(node), ctypes.byref(count)) == 0 and count.value == 1
    params = KernelNodeParams(args.fn, grid, 1, 1, threads, 1, 1, 0, args.ptr, None)

    def set_and_launch():
        args.words[0] = n
        args.pairs[: 2 * n] = m.reshape(-1)
        status = set_params(graph.graphExec, node, ctypes.byref(params))
        if status:
            raise RuntimeError(f"cuGraphExecKernelNodeSetParams: CUresult {status}")
        graph_launch(graph.graphExec, stream.ptr)

    def graph_only():
        graph_launch(graph.graphExec, stream.ptr)

    host_figures = [host_time(f, stream) * 1e6 for f in (write_and_launch, set_and_launch, graph_only)]
    block_figures = [
        time_blocking(f, stream, 100)["latency_s"] * 1e6 for f in (write_and_launch, set_and_launch)
    ]
    for f in (write_and_launch, set_and_launch):  # both forms move the right bytes
        dst[...] = 0
        cp.cuda.Device().synchronize()
        f()
        stream.synchronize()
        got = cp.asnumpy(gpu) if direction == "in" else host
        want = host if direction == "in" else cp.asnumpy(gpu)
        assert np.array_equal(got[m[:, 1]], want[m[:, 0]]), f.__name__
    print(
        f"{direction} {block >> 10:>3} KiB x {n:<5} tier {tier.parts}x{tier.pairs:<5}"
        + "".join(f"{x:9.1f}" for x in host_figures)
        + " | "
        + "".join(f"{x:9.1f}" for x in block_figures),
        flush=True,
    )


def main():
    calls = driver_calls()
    rng = np.random.default_rng(0)
    stream = cp.cuda.Stream(non_blocking=True)
    print(f"{'case':<30} {'launch':>8} {'set+graph':>9} {'graph':>8} | blocking: launch, set+graph (us)")
    for direction, block, n in (
        ("in", 32768, 16),
        ("out", 32768, 16),
        ("in", 4096, 1250),
        ("in", 32768, 1250),
    ):
        probe_case(direction, block, n, stream, rng, calls)


if __name__ == "__main__":
    main()
