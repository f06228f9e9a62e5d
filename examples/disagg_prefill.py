"""Disaggregated prefill -> decode on one host, through cupy_swap.remote (NIXL).

Process A (prefill) fills KV blocks of every layer in its GPU cache (the
stand-in for attention's output) and writes them, by a block mapping, into
process B's pinned host cache.  Process B (decode) learns from the arrival
notification which blocks came, swaps them into its own GPU cache with
cupy_swap, checks every byte and reports GB/s for both steps.

    UCX_NET_DEVICES=lo python examples/disagg_prefill.py [--layers 4] [--blocks 128]
    UCX_NET_DEVICES=lo python examples/disagg_prefill.py --host-only   # no GPU: NumPy caches

A write that fails (the prefill process dies, a deadline of ``peer_timeout``
passes) reaches decode as an Arrival of kind ``"failed"`` naming the blocks,
so a scheduler can recompute them (``cupy_swap/remote/README.md``).

Needs NIXL (``pip install --no-deps "nixl-cu12>=1.5.1,<1.6"``) and, without
``--host-only``, a GPU.  Exit status: 0 every byte checked; 1 a block
differs, or the write failed or never arrived; 2 a bad argument (not a
positive number, more blocks than a cache holds, caches larger than this
host's memory), said in one line before anything starts; 3 this machine
cannot run it (no usable GPU without ``--host-only``, or no NIXL), said in
one line.

Geometry: Llama-3-8B's, 16 tokens x 8 KV heads x 128 dims x fp16 = 32 KiB per
block, a K and a V part per layer.  Metadata travels through files in a
private temporary directory (cupy_swap.remote.publish/fetch).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import tempfile
import time

import numpy as np

from cupy_swap.tools.cli_common import positive_int  # imports no CuPy: --help works without it

BLOCK = (16, 8, 128)
BLOCK_BYTES = 2 * 16 * 8 * 128
EXIT_FAILED, EXIT_USAGE, EXIT_CANNOT_RUN = 1, 2, 3


def expected_block(part: int, block: int) -> np.ndarray:
    """What prefill writes into block ``block`` of part ``part`` (both sides can make it)."""
    return np.random.default_rng([part, block]).standard_normal(BLOCK).astype(np.float16)


def prefill(args, md_dir: str, ready, done) -> None:
    os.environ.setdefault("UCX_NET_DEVICES", "lo")
    from cupy_swap.remote import RemoteAgent, fetch, publish

    rng = np.random.default_rng(0)
    parts = 2 * args.layers
    src = np.sort(rng.choice(args.gpu_blocks, args.blocks, replace=False))
    host = [np.zeros((args.gpu_blocks, *BLOCK), np.float16) for _ in range(parts)]
    for p in range(parts):  # "compute": fill the prefilled blocks of every layer
        for b in src:
            host[p][b] = expected_block(p, int(b))
    if args.host_only:
        cache = host
    else:
        import cupy

        cache = [cupy.asarray(h) for h in host]
        cupy.cuda.get_current_stream().synchronize()
    agent = RemoteAgent("prefill")
    agent.register_pool("kv", cache, staging_blocks=args.blocks)
    publish(os.path.join(md_dir, "prefill"), agent.metadata())
    peer = agent.connect(fetch(os.path.join(md_dir, "decode"), timeout=60))
    dst = rng.choice(args.host_blocks, args.blocks, replace=False)
    ready.wait(60)  # decode is polling: a notified write completes at the receiver's next poll
    # Block b of the prompt lands in the decode side's host block dst[i]; the
    # decode side learns dst from the notification.
    t0 = time.perf_counter()
    transfer = agent.write("kv", (peer, "kv"), (src, dst))
    transfer.wait(timeout=60)
    dt = time.perf_counter() - t0
    print(
        f"prefill: wrote {args.blocks} blocks x {parts} parts ({transfer.nbytes / 1e6:.1f} MB) "
        f"in {dt * 1e3:.2f} ms: {transfer.nbytes / dt / 1e9:.2f} GB/s ({transfer.what})",
        flush=True,
    )
    done.wait(60)  # keep the agent (and its memory) until decode has checked
    agent.disconnect(peer)
    agent.close()


def decode(args, md_dir: str, ready, done) -> int:
    os.environ.setdefault("UCX_NET_DEVICES", "lo")
    import cupy_swap as cs
    from cupy_swap.remote import RemoteAgent, fetch, publish

    parts = 2 * args.layers
    make = np.empty if args.host_only else cs.empty_pinned
    host = [make((args.host_blocks, *BLOCK), "float16") for _ in range(parts)]
    for h in host:  # resident (pinned memory always is); a first write into untouched pages pays faults
        h.fill(0)
    agent = RemoteAgent("decode")
    agent.register_pool("kv", host, staging_blocks=args.blocks)
    publish(os.path.join(md_dir, "decode"), agent.metadata())
    peer = agent.connect(fetch(os.path.join(md_dir, "prefill"), timeout=60))
    arrivals = []
    ready.set()
    deadline = time.monotonic() + 60
    while not arrivals and time.monotonic() < deadline:  # a decode loop would poll once a step
        arrivals = agent.poll()
        time.sleep(1e-4)
    if not arrivals:  # prefill died before its write reached this agent
        print("decode: nothing arrived within 60 s", flush=True)
        done.set()
        agent.close()
        return EXIT_FAILED
    (arrival,) = arrivals
    if arrival.kind == "failed":  # the write failed or its sender died: a scheduler recomputes these
        print(f"decode: {arrival.blocks.size} blocks failed ({arrival.reason}); recompute them", flush=True)
        done.set()
        agent.close()
        return EXIT_FAILED
    blocks = arrival.blocks.astype(np.int64)
    print(f"decode: {len(blocks)} blocks arrived from {arrival.peer} ({arrival.kind})", flush=True)
    if args.host_only:
        got = host
        mapping_back = np.arange(len(blocks))
    else:
        import cupy

        gpu = [cupy.zeros((args.blocks, *BLOCK), cupy.float16) for _ in range(parts)]
        mapping_back = np.arange(len(blocks))
        sw = cs.BlockSwapper(max_blocks=len(blocks))
        rows = np.stack([blocks, mapping_back], 1)
        sw.swap_in(host, gpu, rows).synchronize()  # warm-up (kernel compile, op made)
        t0 = time.perf_counter()
        sw.swap_in(host, gpu, rows).synchronize()
        dt = time.perf_counter() - t0
        nbytes = len(blocks) * parts * host[0][0].nbytes
        print(f"decode: swapped them into the GPU cache in {dt * 1e3:.2f} ms: {nbytes / dt / 1e9:.2f} GB/s")
        got = [g.get() for g in gpu]
    # Which prefill block went where is the application's bookkeeping; here the
    # sorted source blocks went to the arrival's blocks in order.
    src = np.sort(np.random.default_rng(0).choice(args.gpu_blocks, args.blocks, replace=False))
    bad = 0
    for p in range(parts):
        for i, b in enumerate(blocks):
            row = got[p][b] if args.host_only else got[p][mapping_back[i]]
            bad += not np.array_equal(row.view(np.uint16), expected_block(p, int(src[i])).view(np.uint16))
    print("decode: every byte checked" if not bad else f"decode: {bad} blocks differ", flush=True)
    done.set()
    agent.disconnect(peer)
    agent.close()
    return EXIT_FAILED if bad else 0


def _no_gpu() -> str | None:
    """Why no GPU can be used here (the cause and the fix, as the library
    words it: no CuPy, no driver, no device, a driver too old), or None."""
    try:
        import cupy

        return None if cupy.cuda.runtime.getDeviceCount() > 0 else "CUDA found no GPU"
    except Exception as e:  # ImportError, CUDARuntimeError
        from cupy_swap.cuda.availability import cuda_unavailable_error

        err = cuda_unavailable_error(e)
        return str(err) if err is not None else f"{type(e).__name__}: {e}"


class OneLineParser(argparse.ArgumentParser):
    """argparse whose errors are one line, exit status 2 (as ``cupy_swap bench --remote``)."""

    def error(self, message):
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")


def parse_args(argv=None) -> argparse.Namespace:
    """The command line, every number checked before any CUDA or NIXL work."""
    ap = OneLineParser(
        description=__doc__.split("\n\n")[0],
        epilog="exit status: 0 every byte checked; 1 a block differs, or the write failed or never "
        "arrived; 2 a bad argument; 3 no usable GPU (without --host-only) or no NIXL",
    )
    ap.add_argument("--layers", type=positive_int, default=4, help="layers, a K and a V part each")
    ap.add_argument("--blocks", type=positive_int, default=128, help="blocks of the prompt")
    ap.add_argument("--gpu-blocks", type=positive_int, default=512, help="prefill's GPU cache")
    ap.add_argument("--host-blocks", type=positive_int, default=1024, help="decode's host cache")
    ap.add_argument("--host-only", action="store_true", help="NumPy caches on both sides (no GPU)")
    args = ap.parse_args(argv)
    for option, cache in (("--gpu-blocks", args.gpu_blocks), ("--host-blocks", args.host_blocks)):
        if args.blocks > cache:
            ap.error(f"argument --blocks: {args.blocks} blocks do not fit in {option} {cache}")
    need = 2 * args.layers * (args.gpu_blocks + args.host_blocks) * BLOCK_BYTES  # both processes' caches
    have = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if need > have:
        ap.error(
            f"--layers {args.layers} x (--gpu-blocks {args.gpu_blocks} + --host-blocks {args.host_blocks}) "
            f"needs {need / 2**30:.1f} GiB of host memory, more than this host's {have / 2**30:.1f} GiB"
        )
    return args


def main() -> int:
    args = parse_args()
    if not args.host_only:
        why = _no_gpu()
        if why:
            print(f"disagg_prefill: needs a GPU ({why}); --host-only runs it on NumPy caches")
            return EXIT_CANNOT_RUN
    from cupy_swap.remote import unavailable_reason

    why = unavailable_reason()  # says how to install NIXL
    if why:
        print(f"disagg_prefill: {why}")
        return EXIT_CANNOT_RUN
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory() as md_dir:  # mode 0700: the metadata is a capability
        ready, done = ctx.Event(), ctx.Event()
        a = ctx.Process(target=prefill, args=(args, md_dir, ready, done))
        a.start()
        status = decode(args, md_dir, ready, done)
        a.join(60)
    return status or (EXIT_FAILED if a.exitcode else 0)


if __name__ == "__main__":
    raise SystemExit(main())
