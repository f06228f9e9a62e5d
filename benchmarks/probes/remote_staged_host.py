"""Why does a staged write between two host pools run below a direct one?

Two processes over loopback (``UCX_NET_DEVICES=lo``): this one writes, a
receiver polls continuously.  For each row it times, in turns, a direct and
a staged write (median of ``--reps``), and splits the staged one into its
steps as the sender sees them: ``write()`` returning (the gather, the
request), the grant, every chunk moved, the receiver's acknowledgement
(its scatter included).  Beside them, the copies of one row alone in this
process: a plain memcpy of the bytes, the host gather and the host scatter.

    UCX_NET_DEVICES=lo python benchmarks/probes/remote_staged_host.py [--reps 9]

No GPU; host pools only.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import time

import numpy as np

ROWS = [(4096, 1024), (32768, 1250), (262144, 128), (2 << 20, 16)]


def receiver(conn, blocks: int, block_bytes: int, n: int, md_in: bytes) -> None:
    from cupy_swap.remote import RemoteAgent

    agent = RemoteAgent("probe-recv")
    agent.register_pool("kv", [np.zeros((blocks, block_bytes), np.uint8)], staging_blocks=n)
    conn.send(agent.metadata())
    agent.connect(md_in)
    while True:
        agent.poll()
        if conn.poll(0):
            conn.recv()
            agent.close()
            conn.send(True)
            return


def staged_steps(agent, remote, m) -> list:
    """Milliseconds from the call to: write() returned, the grant handled,
    the first chunk posted, the last chunk posted (``nixl.transfer``
    returned), every chunk moved, done (the acknowledgement handled)."""
    marks: dict = {}
    on_answer, transfer = agent._on_answer, agent.nixl.transfer

    def answer(peer, note):
        marks.setdefault(note.kind, time.perf_counter())
        on_answer(peer, note)

    def posted(xfer):
        state = transfer(xfer)
        marks.setdefault("first", time.perf_counter())
        marks["last"] = time.perf_counter()
        return state

    agent._on_answer, agent.nixl.transfer = answer, posted
    try:
        t0 = time.perf_counter()
        t = agent.write("kv", remote, m, path="staged")
        returned = time.perf_counter()
        moved = None
        while not t.done():
            if moved is None and t.moved:
                moved = time.perf_counter()
        done = time.perf_counter()
    finally:
        del agent._on_answer, agent.nixl.transfer
    from cupy_swap.remote import wire

    moved = done if moved is None else moved
    at = [returned, marks[wire.GRANT], marks["first"], marks["last"], moved, done]
    return [(x - t0) * 1e3 for x in at]


def copies(block_bytes: int, n: int, reps: int) -> dict:
    """GB/s of a memcpy of n blocks, the host gather and the host scatter."""
    from cupy_swap.remote.staging import HostStager

    rng = np.random.default_rng(0)
    blocks = n + max(8, n // 8)
    part = rng.integers(0, 256, (blocks, block_bytes), dtype=np.uint8)
    send, recv = np.zeros((n, block_bytes), np.uint8), np.ones((n, block_bytes), np.uint8)
    stager = HostStager([part], [send], [recv])
    src, dst = rng.choice(blocks, n, replace=False), rng.choice(blocks, n, replace=False)
    calls = {
        "memcpy": lambda: np.copyto(send, recv),
        "gather": lambda: stager.gather(src),
        "scatter": lambda: stager.scatter(dst),
    }
    out = {}
    for name, call in calls.items():
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            call()
            times.append(time.perf_counter() - t0)
        out[name] = n * block_bytes / statistics.median(times) / 1e9
    return out


def row(block_bytes: int, n: int, reps: int) -> None:
    from cupy_swap.remote import RemoteAgent

    rng = np.random.default_rng(0)
    blocks = n + max(8, n // 8)
    agent = RemoteAgent("probe-send")
    agent.register_pool("kv", [rng.integers(0, 256, (blocks, block_bytes), dtype=np.uint8)], staging_blocks=n)
    conn, child = mp.Pipe()
    proc = mp.get_context("spawn").Process(
        target=receiver, args=(child, blocks, block_bytes, n, agent.metadata()), daemon=True
    )
    proc.start()
    peer = agent.connect(conn.recv())
    remote = (peer, "kv")
    m = np.stack([rng.choice(blocks, n, replace=False), rng.choice(blocks, n, replace=False)], 1)
    direct, staged = [], []
    for i in range(reps + 2):  # two warm-up rounds
        t0 = time.perf_counter()
        agent.write("kv", remote, m, path="direct").wait(60)
        d = time.perf_counter() - t0
        s = staged_steps(agent, remote, m)
        if i >= 2:
            direct.append(d)
            staged.append(s)
    nbytes = n * block_bytes
    d = statistics.median(direct)
    steps = [statistics.median(s[k] for s in staged) for k in range(6)]
    c = copies(block_bytes, n, reps)
    print(
        f"{block_bytes >> 10:>5}K x {n:<5} direct {nbytes / d / 1e9:5.2f} GB/s  staged {nbytes / steps[-1] * 1e-6:5.2f}"
        f" ({d * 1e3 / steps[-1]:.2f} of direct); ms: direct {d * 1e3:.2f}; staged: write() {steps[0]:.2f},"
        f" grant {steps[1]:.2f}, posted {steps[2]:.2f}-{steps[3]:.2f}, moved {steps[4]:.2f}, done {steps[5]:.2f}"
        f"  |  copies GB/s: memcpy {c['memcpy']:.1f}, gather {c['gather']:.1f}, scatter {c['scatter']:.1f}"
    )
    agent.disconnect(peer)
    conn.send("exit")
    conn.recv()
    proc.join(10)
    agent.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=9)
    args = ap.parse_args()
    os.environ.setdefault("UCX_NET_DEVICES", "lo")
    for block_bytes, n in ROWS:
        row(block_bytes, n, args.reps)


if __name__ == "__main__":
    main()
