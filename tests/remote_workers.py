"""The peer process of tests/test_remote.py: a RemoteAgent with pools made
from a spec, driven by commands over a pipe, polling its notifications
between commands (so staged writes get scattered and acknowledged).

Spec: ``{name: {"blocks": B, "shape": block_shape, "parts": P, "mem": "host"|"gpu",
"staging": S, "strided": bool}}``; ``strided`` makes part p a view
``cache[:, p]`` of one block-first ``(B, P, *block_shape)`` array (an axis-0
stride of P blocks).
"""

from __future__ import annotations

import os
import time

import numpy as np


def make_parts(spec: dict, mem: str = "host"):
    """The parts of one pool spec, filled with a fixed poison byte (0xA5)."""
    shape = (spec["blocks"], *spec["shape"])
    parts_n = spec.get("parts", 1)
    xp = np
    if mem == "gpu":  # pragma: no cover - GPU tests
        import cupy as xp
    if spec.get("strided"):
        whole = xp.full((shape[0], parts_n, *shape[1:]), 0xA5, dtype=np.uint8)
        return [whole[:, p] for p in range(parts_n)]
    return [xp.full(shape, 0xA5, dtype=np.uint8) for _ in range(parts_n)]


def to_host(parts) -> list:
    out = []
    for p in parts:
        out.append(p.get() if hasattr(p, "get") and not isinstance(p, np.ndarray) else np.array(p))
    return out


def serve(conn, name: str, specs: dict, md_dir: str, agent_kw: dict | None = None) -> None:
    """Run the peer: publish metadata to ``md_dir/<name>``, connect the
    parent's from ``md_dir/parent``, then answer commands until "exit"
    (``agent_kw``: RemoteAgent keywords, e.g. ``peer_timeout``)."""
    os.environ.setdefault("UCX_NET_DEVICES", "lo")
    from cupy_swap.remote import RemoteAgent, fetch, publish, wire

    agent = RemoteAgent(name, **(agent_kw or {}))
    pools = {}
    for pool, spec in specs.items():
        pools[pool] = make_parts(spec, spec.get("mem", "host"))
        agent.register_pool(pool, pools[pool], staging_blocks=spec.get("staging", 0))
    publish(os.path.join(md_dir, name), agent.metadata())
    parent = agent.connect(fetch(os.path.join(md_dir, "parent"), timeout=60))
    conn.send(("ready", os.getpid()))
    arrivals, writes = [], []
    while True:
        arrivals += agent.poll()
        if not conn.poll(0.0005):
            continue
        cmd, arg = conn.recv()
        try:
            if cmd == "write":  # post a write to the parent, answer at once (waited by "wait_writes")
                local, remote, rows, path = arg
                writes.append(agent.write(local, (parent, remote), rows, path=path))
                conn.send(True)
            elif cmd == "wait_writes":
                out = []
                for t in writes:
                    try:
                        t.wait(timeout=arg)
                        out.append(None)
                    except Exception as e:  # the test reads it
                        out.append(f"{type(e).__name__}: {e}")
                writes = []
                conn.send(out)
            elif cmd == "metadata":
                conn.send(agent.metadata())
            elif cmd == "nap":  # answer, then neither poll nor progress for a while (killed meanwhile, say)
                conn.send(True)
                time.sleep(arg)
            elif cmd == "nap_then_reregister":  # a request reaches it asleep; then drop, register anew
                seconds, pool = arg
                conn.send(True)
                time.sleep(seconds)
                agent.drop_pool(pool)
                pools[pool] = make_parts(specs[pool], specs[pool].get("mem", "host"))
                agent.register_pool(pool, pools[pool], staging_blocks=specs[pool].get("staging", 0))
                publish(os.path.join(md_dir, name), agent.metadata())
            elif cmd == "stall_gathers":  # staged writes from this side gather, but never say so
                for pool in agent._pools.values():
                    if pool.stager is not None:
                        pool.stager.gather = stalled(pool.stager.gather)
                conn.send(True)
            elif cmd == "hold_acks":  # scatter staged arrivals, never acknowledge them
                send = agent.nixl.send_notif

                def held(peer, msg, send=send):
                    note = wire.unpack_note(msg)
                    if note is not None and note.kind == wire.SCATTERED:
                        return None
                    return send(peer, msg)

                agent.nixl.send_notif = held
                conn.send(True)
            elif cmd == "state":  # what a pool's receive run holds
                slots = agent._pools[arg].slots
                conn.send((int(slots.free.sum()), len(slots.grants), len(slots.queue)))
            elif cmd == "nap_then_drop":  # answer, then neither poll nor progress for a while, then drop
                seconds, pool = arg
                conn.send(True)
                time.sleep(seconds)
                agent.drop_pool(pool)
            elif cmd == "get":
                conn.send(to_host(pools[arg]))
            elif cmd == "set":
                pool, data = arg
                for p, d in zip(pools[pool], data):
                    p[...] = to_device(p, d)
                conn.send(True)
            elif cmd == "arrivals":
                deadline = time.monotonic() + arg
                while len(arrivals) == 0 and time.monotonic() < deadline:
                    arrivals += agent.poll()
                    time.sleep(0.0005)
                out, arrivals = [(a.peer, a.pool, a.kind, a.blocks.tolist(), a.xfer_id) for a in arrivals], []
                conn.send(out)
            elif cmd == "drop":
                agent.drop_pool(arg)
                conn.send(True)
            elif cmd == "exit":
                agent.close()
                conn.send(True)
                return
        except Exception as e:  # the test reads it
            conn.send(e)


def stalled(gather):
    """A stager's gather whose chunks never report finished (the chunks are never posted)."""

    def run(src, stream=None, chunk=0, offset=0):
        gather(src, stream, chunk, offset) if offset else gather(src, stream, chunk)
        return [(lambda: False) for _ in range(0, src.shape[0], chunk or src.shape[0])]

    return run


def to_device(part, data):
    """``data`` (NumPy) where ``part`` lives."""
    if isinstance(part, np.ndarray):
        return data
    import cupy  # pragma: no cover - GPU tests

    return cupy.asarray(data)
