"""``bench --remote``: GB/s of cupy_swap.remote between two processes on one
host, direct and staged, beside NIXL's own prepared transfer on the same
buffers (per-block descriptors, and the same bytes in one descriptor), and
the local swap where the pool is on a GPU.

``python -m cupy_swap bench --remote --help`` lists the options, the
contenders (:data:`CONTENDERS_TEXT`) and the exit status (:data:`EXIT_TEXT`).
Every argument is checked, the ``--json`` file's folder included, before
NIXL is looked for or anything is measured: a bad one is one line on stderr
and exit status 2.

Each row: one process (this one) writes ``n`` random distinct blocks of its
pool into random distinct blocks of the peer's pool (a spawned process that
polls for notifications and scatters staged arrivals).  Times are blocking
(submit + wait, host clock), median of ``reps`` taken in turns with the
other contenders (after two warm-up rounds); a staged write counts until
the peer acknowledged its scatter.  After timing, every contender's copy is
checked bit-exactly against the peer's blocks.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import re
import statistics
import sys
import textwrap
import time

import numpy as np

__all__ = ["main", "run"]

ROWS = "32Kx1250,2Mx16"
SIZES, COUNTS = "32K,2M", "16,1250"  # --sizes and --counts, when only the other one is given
MAX_MEMORY = "8G"
EXIT_OK, EXIT_MISMATCH, EXIT_USAGE, EXIT_NO_GPU = 0, 1, 2, 3

CONTENDERS_TEXT = """\
contenders (one line each per row):
  direct      RemoteAgent.write(path="direct"): one NIXL descriptor per block
  staged      RemoteAgent.write(path="staged"): blocks gathered into one pinned run, moved in
              chunks of the agent's staged_chunk_bytes, scattered by the peer; staged-2M etc.:
              other chunk sizes (--staged-chunks), staged-one: the whole write in one chunk
  raw         NIXL's own prepared transfer on the same per-block descriptors and the same
              notification bytes, with no checks (direct against raw: what the wrapper costs)
  raw-nonote  the same without the notification (on loopback TCP a notified transfer ends
              only at the receiver's next poll)
  raw-1desc   the same bytes as one descriptor (the ceiling the staged path aims at)
  local       BlockSwapper.swap_out of the same blocks into local pinned memory (--from gpu)
GB/s: bytes / blocking time (submit + wait), median and best of --reps, the contenders
taken in turns; exact: the peer's blocks compared bit for bit after timing."""

EXIT_TEXT = f"""\
exit status:
  {EXIT_OK}  success
  {EXIT_MISMATCH}  a transfer's bytes did not match
  {EXIT_USAGE}  bad command line (every option, the --json file's folder included, is checked
     before anything is measured), or no NIXL (pip install --no-deps "nixl-cu12>=1.5.1,<1.6")
  {EXIT_NO_GPU}  no usable NVIDIA GPU for --from gpu or --to gpu"""


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


_SIZE = re.compile(r"(\d+)([kmg](?:ib)?)?", re.IGNORECASE)
_SCALE = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def _parse_size(text: str) -> int:
    """``"2M"`` -> 2097152, ``"512K"`` (or ``"512KiB"``) -> 524288,
    ``"4096"`` -> 4096, ``"0"`` -> 0.

    Raises
    ------
    ValueError
        For anything else (a sign, a fraction, another suffix).
    """
    m = _SIZE.fullmatch(text.strip())
    if not m:
        raise ValueError(f"{text.strip()!r} is not a size such as 4096, 4K, 32K, 2M or 1G")
    return int(m.group(1)) * _SCALE[(m.group(2) or "")[:1].lower()]


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
        note = wire.pack_note(
            wire.WRITE, 0, "kv", m[:, 1], agent.incarnation, agent._peers[peer].incarnation, uid=rlayout.uid
        )
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


def _size_list(text: str, form: str, *, zero: bool = False) -> list:
    """A comma list of sizes (``0`` allowed when ``zero``), for argparse;
    ``form`` says what one should look like."""
    out = []
    for item in text.split(","):
        try:
            value = _parse_size(item)
        except ValueError:
            value = -1
        if value < (0 if zero else 1):
            raise argparse.ArgumentTypeError(f"{item.strip()!r} is not {form}")
        out.append(value)
    return out


def _sizes_arg(text: str) -> list:
    return _size_list(text, "a block size such as 4096, 4K, 32K or 2M")


def _chunks_arg(text: str) -> list:
    return _size_list(text, "a chunk size such as 2M or 32M, or 0 (one chunk)", zero=True)


def _memory_arg(text: str) -> int:
    try:
        value = _parse_size(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size such as 512M or 8G")
    return value


def _rows_arg(text: str) -> list:
    """``"32Kx1250,2Mx16"`` -> ``[(32768, 1250), (2097152, 16)]``, for argparse."""
    rows = []
    for item in text.split(","):
        size, _, n = item.strip().lower().partition("x")
        try:
            block_bytes = _parse_size(size)
        except ValueError:
            block_bytes = 0
        count = int(n) if n.strip().isdigit() else 0
        if block_bytes < 1 or count < 1:
            raise argparse.ArgumentTypeError(
                f"{item.strip()!r} is not a SIZExCOUNT pair such as 32Kx1250 or 2Mx16 "
                "(a block size: 4096, 4K, 32K, 2M; a positive block count)"
            )
        rows.append((block_bytes, count))
    return rows


class _Parser(argparse.ArgumentParser):
    """argparse whose errors are one line: ``PROG: error: MESSAGE (...)``, exit 2."""

    def error(self, message):
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")


def build_parser(prog: str = "cupy-swap bench --remote") -> argparse.ArgumentParser:
    """``bench --remote``'s command line; every option is checked while
    parsing, the combinations and the memory a run needs by :func:`parse_args`."""
    from .cli_common import counts_arg, output_file_arg, positive_int

    ap = _Parser(
        prog=prog,
        description=textwrap.fill(
            "GB/s of cupy_swap.remote (NIXL, UCX) between this process and a spawned peer on this host: "
            "direct and staged writes beside NIXL's own prepared transfer on the same buffers; every "
            "transfer checked bit for bit. Host pools need no GPU; UCX_NET_DEVICES defaults to lo "
            "(loopback).",
            width=92,
        ),
        epilog=f"{CONTENDERS_TEXT}\n\nexamples:\n"
        f"  {prog} --json remote.json\n"
        f"  {prog} --rows 4Kx1250,256Kx64 --staged-chunks 2M,0\n"
        f"  {prog} --from gpu --to host --sizes 32K --counts 16,1250\n\n{EXIT_TEXT}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--from",
        dest="src",
        choices=("host", "gpu"),
        default="host",
        help="memory of the sending pool, in this process (default host)",
    )
    ap.add_argument(
        "--to",
        dest="dst",
        choices=("host", "gpu"),
        default="host",
        help="memory of the receiving pool, in the spawned peer (default host)",
    )
    ap.add_argument(
        "--rows",
        type=_rows_arg,
        metavar="ROWS",
        help=f"SIZExCOUNT pairs, comma list (default {ROWS}): block size (4096, 4K, 32K, 2M) x blocks "
        "per write; not with --sizes or --counts",
    )
    ap.add_argument(
        "--sizes",
        type=_sizes_arg,
        metavar="SIZES",
        help=f"block sizes, comma list, each timed at every --counts (default {SIZES}); instead of --rows",
    )
    ap.add_argument(
        "--counts",
        type=counts_arg,
        metavar="COUNTS",
        help=f"blocks per write, comma list, each timed at every --sizes (default {COUNTS}); instead of "
        "--rows",
    )
    ap.add_argument(
        "--reps",
        type=positive_int,
        default=30,
        metavar="N",
        help="timed writes per contender and row, taken in turns (default 30)",
    )
    ap.add_argument(
        "--staged-chunks",
        type=_chunks_arg,
        default=[],
        metavar="SIZES",
        help="chunk sizes of staged writes to time beside the agent's default, comma list, e.g. 2M,32M; "
        "0: the whole write in one chunk",
    )
    ap.add_argument(
        "--max-memory",
        type=_memory_arg,
        default=_parse_size(MAX_MEMORY),
        metavar="SIZE",
        help=f"refuse rows whose two processes would need more host memory than SIZE (default {MAX_MEMORY})",
    )
    ap.add_argument(
        "--json",
        type=output_file_arg,
        metavar="FILE",
        help="also write every row to FILE, after each row (its directory must exist and be writable)",
    )
    return ap


def parse_args(argv=None, prog: str = "cupy-swap bench --remote"):
    """``(args, rows)``: the parsed command line and its ``[(block_bytes,
    n), ...]``, every option and combination checked; nothing is measured
    and NIXL is not looked for.

    Raises
    ------
    SystemExit
        Code 2 after one line on stderr for a bad command line, 0 after ``--help``.
    """
    ap = build_parser(prog)
    args = ap.parse_args(argv)
    if args.rows is not None and (args.sizes is not None or args.counts is not None):
        given = " and ".join(
            o for o, v in (("--sizes", args.sizes), ("--counts", args.counts)) if v is not None
        )
        ap.error(
            f"argument --rows: not allowed with {given} (give SIZExCOUNT pairs, or --sizes and --counts)"
        )
    if args.rows is not None:
        rows = args.rows
    elif args.sizes is not None or args.counts is not None:
        sizes = args.sizes if args.sizes is not None else _sizes_arg(SIZES)
        counts = args.counts if args.counts is not None else [int(c) for c in COUNTS.split(",")]
        rows = [(b, n) for b in sizes for n in counts]
    else:
        rows = _rows_arg(ROWS)
    for block_bytes, n in rows:
        need = memory_needed(block_bytes, n)
        if need > args.max_memory:
            ap.error(
                f"{_size_name(block_bytes)} x {n} needs about {need / 2**30:.1f} GiB of memory for its two "
                f"processes, more than --max-memory {args.max_memory / 2**30:.1f} GiB; raise --max-memory "
                "or ask for fewer blocks"
            )
    return args, rows


def _write_rows(path: str, rows: list) -> None:
    from .cli_common import write_report

    write_report(path, rows)


def main(argv=None) -> int:
    """``bench --remote``; returns the exit status (0, 1 a mismatch, 2 a bad
    command line or no NIXL, 3 no usable GPU)."""
    from .cli_common import default_prog

    prog = f"{default_prog()} bench --remote"
    try:
        args, rows_wanted = parse_args(argv, prog)
    except SystemExit as e:  # --help (0) or a bad command line (2), said in one line
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    os.environ.setdefault("UCX_NET_DEVICES", "lo")
    from cupy_swap.remote import unavailable_reason

    why = unavailable_reason()
    if why:
        print(f"{prog}: {why}", file=sys.stderr)
        return EXIT_USAGE
    if "gpu" in (args.src, args.dst):
        why = _gpu_reason()
        if why:
            print(f"{prog}: --from/--to gpu needs a usable GPU: {why}", file=sys.stderr)
            return EXIT_NO_GPU
    rows = []
    print(f"{'from':>4} {'to':>4} {'block':>6} {'n':>5} {'contender':>10} {'GB/s':>7} {'best':>7} exact")
    for block_bytes, n in rows_wanted:
        size = _size_name(block_bytes)
        for r in run(args.src, args.dst, block_bytes, n, args.reps, chunks=tuple(args.staged_chunks)):
            rows.append(r)
            print(
                f"{r['from']:>4} {r['to']:>4} {size:>6} {n:>5} {r['contender']:>10} "
                f"{r['gbps']:7.2f} {r['best_gbps']:7.2f} {'' if r['exact'] is None else r['exact']}",
                flush=True,
            )
        if args.json:  # after each row: a run cut short keeps what it measured
            _write_rows(args.json, rows)
    return EXIT_OK if all(r["exact"] in (None, True) for r in rows) else EXIT_MISMATCH


if __name__ == "__main__":
    sys.exit(main())
