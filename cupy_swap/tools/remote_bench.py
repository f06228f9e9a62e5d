"""``bench --remote``: GB/s of cupy_swap.remote between two processes on one
host, direct and staged, beside NIXL's own prepared transfer on the same
buffers (per-block descriptors, and the same bytes in one descriptor), and
the local swap where the pool is on a GPU.

Usage::

    UCX_NET_DEVICES=lo python -m cupy_swap bench --remote [--from host|gpu] [--to host|gpu]
        [--rows 32Kx1250,2Mx16 | --sizes 32K,2M --counts 16,1250] [--reps 30]
        [--staged-chunks 2M,0] [--max-memory 8G] [--json FILE]

Defaults: the rows 32 KiB x 1250 and 2 MiB x 16 (about 0.3 GB of host
memory for both processes together); a run whose pools would need more than
``--max-memory`` (8 GiB) is refused before anything is allocated.  Exit
status: 0, 1 a copy did not match, 2 a bad command line (or no NIXL), 3 no
usable GPU for ``--from gpu`` / ``--to gpu``.

Each row: one process (this one) writes ``n`` random distinct blocks of its
pool into random distinct blocks of the peer's pool (a spawned process that
polls for notifications and scatters staged arrivals).  Times are blocking
(submit + wait, host clock), median of ``reps`` taken in turns with the
other contenders (after two warm-up rounds); a staged write counts until
the peer acknowledged its scatter.  After timing, every contender's copy is
checked bit-exactly against the peer's blocks.

Contenders:
- ``direct``: ``RemoteAgent.write(path="direct")``, one descriptor per block;
- ``staged``: ``RemoteAgent.write(path="staged")``, gathered, moved and
  scattered in chunks of ``staged_chunk_bytes``; ``staged-2M`` etc. with
  other chunk sizes (``--staged-chunks``; ``staged-one``: one chunk);
- ``raw``: NIXL ``make_prepped_xfer`` + ``transfer`` + ``check_xfer_state``
  on the same prepared per-block descriptors and indices (no checks, same
  notification bytes): the wrapper-overhead reference;
- ``raw-nonote``: the same without the notification (on loopback TCP a
  notified transfer completes only after the receiver's next poll);
- ``raw-1desc``: NIXL moving the same bytes as one descriptor per part
  between the two staging runs (the ceiling the staged path aims at);
- ``local``: ``BlockSwapper.swap_out`` of the same blocks into local pinned
  memory (GPU pools only).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time

import numpy as np

__all__ = ["main", "run"]

ROWS = "32Kx1250,2Mx16"
MAX_MEMORY = "8G"
EXIT_MISMATCH, EXIT_USAGE, EXIT_NO_GPU = 1, 2, 3


def memory_needed(block_bytes: int, n: int) -> int:
    """Host (and GPU) bytes one row's two processes allocate: each a pool of
    ``n + max(8, n // 8)`` blocks and two staging runs of ``n`` slots."""
    blocks = n + max(8, n // 8)
    return 2 * (blocks + 2 * n) * block_bytes


def _gpu_reason() -> str | None:
    """Why no GPU can be used here, or None."""
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() > 0:
            return None
        return "CUDA answered but found no GPU"
    except Exception as e:  # ImportError, CUDARuntimeError
        try:
            from cupy_swap.cuda.availability import no_gpu_message

            return no_gpu_message(f"{type(e).__name__}: {e}")
        except Exception:
            return f"{type(e).__name__}: {e}"


def _parts(blocks: int, block_bytes: int, mem: str, fill: int | None, rng=None):
    a = np.full((blocks, block_bytes), 0 if fill is None else fill, dtype=np.uint8)
    if rng is not None:
        a[...] = rng.integers(0, 256, a.shape, dtype=np.uint8)
    if mem == "gpu":  # pragma: no cover - device
        import cupy

        return [cupy.asarray(a)]
    return [a]


def _peer(conn, mem: str, blocks: int, block_bytes: int, staging: int, md_in: bytes) -> None:
    """The receiving process: one pool "kv", polls notifications between commands."""
    from cupy_swap.remote import RemoteAgent

    agent = RemoteAgent("bench-peer")
    parts = _parts(blocks, block_bytes, mem, 0xA5)
    agent.register_pool("kv", parts, staging_blocks=staging)
    conn.send(agent.metadata())
    agent.connect(md_in)
    while True:
        agent.poll()  # a receiver's loop: it drives its notifications (and staged scatters)
        if not conn.poll(0):  # no wait: a poll(timeout) sleeps at least 1 ms
            continue
        cmd, arg = conn.recv()
        if cmd == "take":
            p = parts[0][np.asarray(arg)]
            conn.send(p.get() if mem == "gpu" else p)
        elif cmd == "poison":
            parts[0][...] = 0xA5
            conn.send(True)
        elif cmd == "exit":
            agent.close()
            conn.send(True)
            return


def _interleaved_times(calls: dict, reps: int) -> dict:
    """Blocking seconds of each call, ``reps`` times, taken in turns (one
    call of each per round: loopback TCP drifts by more than the contenders
    differ), after two warm-up rounds; returns name -> (median, best)."""
    for _ in range(2):
        for call in calls.values():
            call()
    times: dict = {name: [] for name in calls}
    for _ in range(reps):
        for name, call in calls.items():
            t0 = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - t0)
    return {name: (statistics.median(t), min(t)) for name, t in times.items()}


def _staged(agent, remote, m, chunk_bytes: int):
    def call():
        agent.staged_chunk_bytes = chunk_bytes
        agent.write("kv", remote, m, path="staged").wait(60)

    return call


def _parse_size(text: str) -> int:
    """``"2M"`` -> 2097152, ``"512K"`` -> 524288, ``"0"`` -> 0."""
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:].upper(), 1)
    return int(text[:-1] if scale > 1 else text) * scale


def _size_name(nbytes: int) -> str:
    for unit, scale in (("M", 1 << 20), ("K", 1 << 10)):
        if nbytes % scale == 0:
            return f"{nbytes // scale}{unit}"
    return str(nbytes)


def run(
    src_mem: str, dst_mem: str, block_bytes: int, n: int, reps: int, seed: int = 0, chunks: tuple = ()
) -> list[dict]:
    """Time every contender for one (block size, n) row; returns one dict per
    contender.  ``chunks``: staged chunk sizes in bytes to time beside the
    default (0: the whole write in one chunk)."""
    from cupy_swap.remote import RemoteAgent, wire

    rng = np.random.default_rng(seed)
    blocks = n + max(8, n // 8)  # random distinct blocks of a pool a little larger than n
    agent = RemoteAgent("bench-main")
    local = _parts(blocks, block_bytes, src_mem, None, rng)
    agent.register_pool("kv", local, staging_blocks=n)
    ctx = mp.get_context("spawn")
    conn, child = ctx.Pipe()
    proc = ctx.Process(
        target=_peer, args=(child, dst_mem, blocks, block_bytes, n, agent.metadata()), daemon=True
    )
    proc.start()
    rows = []
    peer = agent.connect(conn.recv())
    try:
        remote = (peer, "kv")
        m = np.stack([rng.choice(blocks, n, replace=False), rng.choice(blocks, n, replace=False)], 1)
        nbytes = n * block_bytes
        nixl = agent.nixl
        ldl, rdl, layout, rlayout = agent.prepared("kv", remote)  # the descriptors write() posts
        lidx, ridx = m[:, 0].astype(np.int32), m[:, 1].astype(np.int32)
        # the same notification bytes write() sends (from this incarnation, for the peer's)
        note = wire.pack_note(wire.WRITE, 0, "kv", m[:, 1], agent.incarnation, agent._peers[peer].incarnation)
        lrun, rrun = layout.staging[0], rlayout.staging[0]
        one_l = nixl.prep_xfer_dlist("NIXL_INIT_AGENT", [(lrun.address, nbytes, 0)], "DRAM")
        one_r = nixl.prep_xfer_dlist(peer, [(rrun.address, nbytes, 0)], "DRAM")

        def raw(ld, li, rd, ri, msg=b""):
            x = nixl.make_prepped_xfer("WRITE", ld, li, rd, ri, msg)
            state = nixl.transfer(x)
            while state == "PROC":
                state = nixl.check_xfer_state(x)
            x.release()
            if state != "DONE":
                raise RuntimeError(f"raw NIXL transfer: {state}")

        contenders = {
            "direct": lambda: agent.write("kv", remote, m, path="direct").wait(60),
            "staged": _staged(agent, remote, m, agent.staged_chunk_bytes),
            **{
                f"staged-{_size_name(c) if c else 'one'}": _staged(agent, remote, m, c or nbytes)
                for c in chunks
            },
            "raw": lambda: raw(ldl, lidx, rdl, ridx, note),
            "raw-nonote": lambda: raw(ldl, lidx, rdl, ridx),
            "raw-1desc": lambda: raw(one_l, [0], one_r, [0]),
        }
        if src_mem == "gpu":  # pragma: no cover - device
            import cupy_swap as cs

            host = cs.empty_pinned((blocks, block_bytes), "uint8")
            sw = cs.BlockSwapper(max_blocks=n)
            contenders["local"] = lambda: sw.swap_out(local[0], host, m).synchronize()
        timed = _interleaved_times(contenders, reps)
        for name, call in contenders.items():
            med, best = timed[name]
            exact = None
            if name in ("direct", "raw") or name.startswith("staged"):
                conn.send(("poison", None))
                conn.recv()
                call()
                conn.send(("take", m[:, 1]))
                got = conn.recv()
                want = local[0][m[:, 0]]
                exact = bool(np.array_equal(got, want.get() if hasattr(want, "get") else want))
            rows.append(
                {
                    "from": src_mem,
                    "to": dst_mem,
                    "block_bytes": block_bytes,
                    "n": n,
                    "contender": name,
                    "median_s": med,
                    "gbps": nbytes / med / 1e9,
                    "best_gbps": nbytes / best / 1e9,
                    "reps": reps,
                    "exact": exact,
                }
            )
        one_l.release()
        one_r.release()
    finally:
        agent.disconnect(peer)
        conn.send(("exit", None))
        if conn.poll(30):
            conn.recv()
        proc.join(10)
        agent.close()
    return rows


def _positive_size(text: str) -> int:
    try:
        value = _parse_size(text.strip())
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a block size such as 4K, 32K, 2M or 4096, got {text!r}")
    return value


def _rows(args, ap) -> list:
    """``[(block_bytes, n), ...]`` from ``--rows`` or from ``--sizes`` x ``--counts``."""
    try:
        if args.sizes or args.counts:
            sizes = [_positive_size(t) for t in (args.sizes or "32K,2M").split(",") if t]
            counts = [int(c) for c in (args.counts or "16,1250").split(",") if c]
            rows = [(b, n) for b in sizes for n in counts]
        else:
            rows = []
            for item in args.rows.split(","):
                size, _, n = item.strip().lower().partition("x")
                rows.append((_positive_size(size), int(n)))
    except (ValueError, argparse.ArgumentTypeError) as e:
        ap.error(f"--rows/--sizes/--counts: {e}")
    if not rows or any(n < 1 for _, n in rows):
        ap.error("--rows/--counts: expected positive block counts")
    return rows


def main(argv=None) -> int:
    """``bench --remote``; returns the exit status (0, 1 a mismatch, 2 a bad
    command line or no NIXL, 3 no usable GPU)."""
    ap = argparse.ArgumentParser(prog="cupy_swap bench --remote", description=__doc__.split("\n\n")[0])
    ap.add_argument("--from", dest="src", choices=("host", "gpu"), default="host")
    ap.add_argument("--to", dest="dst", choices=("host", "gpu"), default="host")
    ap.add_argument(
        "--rows",
        default=ROWS,
        help=f"block size x count pairs (default {ROWS}); sizes like 4K, 32K, 2M, 4096",
    )
    ap.add_argument("--sizes", help="block sizes, crossed with --counts (instead of --rows)")
    ap.add_argument("--counts", help="block counts, crossed with --sizes (instead of --rows)")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument(
        "--staged-chunks",
        default="",
        help="staged chunk sizes to time beside the default, e.g. 2M,32M (0: one chunk)",
    )
    ap.add_argument(
        "--max-memory",
        default=MAX_MEMORY,
        type=_positive_size,
        help=f"refuse rows whose pools need more host memory than this (default {MAX_MEMORY})",
    )
    ap.add_argument("--json", help="write the rows to this file")
    try:
        args = ap.parse_args(argv)
        rows_wanted = _rows(args, ap)
        chunks = tuple(_parse_size(c) for c in args.staged_chunks.split(",") if c)
        if args.reps < 1:
            ap.error("--reps: expected a positive count")
        for block_bytes, n in rows_wanted:
            need = memory_needed(block_bytes, n)
            if need > args.max_memory:
                ap.error(
                    f"{_size_name(block_bytes)} x {n} needs about {need / 2**30:.1f} GiB of memory for its two "
                    f"processes, more than --max-memory {args.max_memory / 2**30:.1f} GiB; raise --max-memory "
                    "or ask for fewer blocks"
                )
    except SystemExit as e:  # argparse: --help (0) or a bad command line (2)
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    except ValueError as e:
        print(f"cupy_swap bench --remote: {e}", file=sys.stderr)
        return EXIT_USAGE
    os.environ.setdefault("UCX_NET_DEVICES", "lo")
    from cupy_swap.remote import unavailable_reason

    why = unavailable_reason()
    if why:
        print(why, file=sys.stderr)
        return EXIT_USAGE
    if "gpu" in (args.src, args.dst):
        why = _gpu_reason()
        if why:
            print(f"cupy_swap bench --remote: --from/--to gpu needs a usable GPU: {why}", file=sys.stderr)
            return EXIT_NO_GPU
    rows = []
    print(f"{'from':>4} {'to':>4} {'block':>6} {'n':>5} {'contender':>10} {'GB/s':>7} {'best':>7} exact")
    for block_bytes, n in rows_wanted:
        size = _size_name(block_bytes)
        for r in run(args.src, args.dst, block_bytes, n, args.reps, chunks=chunks):
            rows.append(r)
            print(
                f"{r['from']:>4} {r['to']:>4} {size:>6} {n:>5} {r['contender']:>10} "
                f"{r['gbps']:7.2f} {r['best_gbps']:7.2f} {'' if r['exact'] is None else r['exact']}",
                flush=True,
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0 if all(r["exact"] in (None, True) for r in rows) else EXIT_MISMATCH


if __name__ == "__main__":
    sys.exit(main())
