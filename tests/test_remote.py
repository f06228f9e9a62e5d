"""cupy_swap.remote on real NIXL, no mocks: two processes over loopback
(``UCX_NET_DEVICES=lo``), host pools on the CPU, GPU pools on the device
(marked ``gpu``).  The NIXL tests skip at collection, with the reason, where
no NIXL wheel imports; the checks of layouts, mappings and wire bytes run
everywhere."""

from __future__ import annotations

import gc
import multiprocessing as mp
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from cupy_swap.remote import (
    LayoutMismatchError,
    PoolDroppedError,
    RemoteAgent,
    RemoteError,
    TransferError,
    fetch,
    publish,
    unavailable_reason,
    wire,
)
from cupy_swap.remote.layout import pool_layout
from cupy_swap.remote.mapping import descriptor_indices, split_mapping

from .remote_workers import make_parts, serve, to_device, to_host

NIXL_WHY = unavailable_reason()
needs_nixl = pytest.mark.skipif(NIXL_WHY is not None, reason=f"needs NIXL: {NIXL_WHY}")

POISON = 0xA5
# The peer's pools: "kv" is two strided parts of 3 x 40 bytes a block (odd on purpose),
# "big" 1250 blocks of 32 KiB, "gone" and "nack" are dropped by tests.
SPECS = {
    "kv": {"blocks": 97, "shape": (3, 40), "parts": 2, "strided": True, "staging": 32},
    "big": {"blocks": 1250, "shape": (32768,), "parts": 1, "staging": 1250},
    "gone": {"blocks": 8, "shape": (16,), "parts": 1},
    "nack": {"blocks": 8, "shape": (16,), "parts": 1, "staging": 4},
}
LOCAL = {
    "kv": {"blocks": 61, "shape": (3, 40), "parts": 2, "staging": 64},
    "big": {"blocks": 1250, "shape": (32768,), "parts": 1, "staging": 1250},
    "gone": {"blocks": 8, "shape": (16,), "parts": 1},
    "nack": {"blocks": 8, "shape": (16,), "parts": 1, "staging": 4},
}


class Peer:
    """A worker process (tests/remote_workers.py) and the pipe to it."""

    def __init__(self, agent: RemoteAgent, md_dir, specs: dict, name: str, agent_kw: dict | None = None):
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        args = (child, name, specs, str(md_dir), agent_kw)
        self.proc = ctx.Process(target=serve, args=args, daemon=True)
        self.proc.start()
        self.name = agent.connect(fetch(os.path.join(md_dir, name), timeout=60))
        status, self.pid = self.call(None, timeout=60)
        assert status == "ready"

    def call(self, cmd, arg=None, timeout=20):
        if cmd is not None:
            self.conn.send((cmd, arg))
        if not self.conn.poll(timeout):
            raise TimeoutError(f"peer did not answer {cmd!r} in {timeout} s")
        out = self.conn.recv()
        if isinstance(out, Exception):
            raise out
        return out

    def kill(self):
        """SIGKILL the worker and reap it."""
        self.proc.kill()
        self.proc.join(10)

    def stop(self, agent: RemoteAgent):
        """Stop the worker, then close ``agent`` (told nothing of a peer already gone)."""
        for t in list(getattr(agent._peers.get(self.name), "transfers", ())):
            t.close()
        if self.name in agent._peers:
            agent.disconnect(self.name)
        if self.proc.is_alive():
            try:
                self.call("exit", timeout=10)
            except (TimeoutError, EOFError, OSError):
                pass
        self.proc.join(10)
        if self.proc.is_alive():
            self.proc.kill()
        agent.close()


def loopback_agent(name: str, **kw) -> RemoteAgent:
    """An agent whose UCX uses the loopback device only (read when the agent starts)."""
    os.environ.setdefault("UCX_NET_DEVICES", "lo")
    return RemoteAgent(name, **kw)


def start(md_dir, local_specs: dict, peer_specs: dict, name: str, **kw):
    """A parent agent with ``local_specs`` pools and a worker with ``peer_specs``;
    ``kw``: RemoteAgent keywords for both (e.g. ``peer_timeout``)."""
    agent = loopback_agent(f"parent-{name}", **kw)
    pools = {}
    for pool, spec in local_specs.items():
        pools[pool] = make_parts(spec, spec.get("mem", "host"))
        agent.register_pool(pool, pools[pool], staging_blocks=spec.get("staging", 0))
    publish(os.path.join(md_dir, "parent"), agent.metadata())
    return agent, pools, Peer(agent, md_dir, peer_specs, name, kw)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    if NIXL_WHY:
        pytest.skip(NIXL_WHY)
    md_dir = tmp_path_factory.mktemp("md")
    agent, pools, peer = start(md_dir, LOCAL, SPECS, "peer")
    yield agent, pools, peer
    peer.stop(agent)


def random_fill(rng, parts):
    for p in parts:
        p[...] = rng.integers(0, 256, p.shape, dtype=np.uint8)


def random_rows(rng, n, src_blocks, dst_blocks):
    return np.stack([rng.choice(src_blocks, n, replace=False), rng.choice(dst_blocks, n, replace=False)], 1)


def reset(peer, pool):
    peer.call("set", (pool, [np.full(p.shape, POISON, np.uint8) for p in make_parts(SPECS[pool])]))
    peer.call("arrivals", 0)  # forget earlier notifications


def call_progressing(peer, progress, cmd, arg=None, timeout=20):
    """``peer.call(cmd, arg)`` while this side keeps calling ``progress()`` (the
    peer's command may need this side's grants or acknowledgements)."""
    peer.conn.send((cmd, arg))
    end = time.monotonic() + timeout
    while not peer.conn.poll(0.001):
        progress()
        assert time.monotonic() < end, f"peer did not answer {cmd!r} in {timeout} s"
    return peer.call(None)


def poll_until(agent, count, timeout=10, also=()):
    """``agent.poll()`` (and each of ``also``'s ``done()``) until ``count`` arrivals came."""
    got, end = [], time.monotonic() + timeout
    while len(got) < count and time.monotonic() < end:
        got += agent.poll()
        for t in also:
            t.done()
        time.sleep(0.0005)
    return got


# --- NIXL, two processes -------------------------------------------------------------------------------


@needs_nixl
@pytest.mark.parametrize(
    "pool,n,path",
    [
        ("kv", 1, "direct"),
        ("kv", 17, "direct"),
        ("kv", 32, "staged"),
        ("big", 1250, "direct"),
        ("big", 1250, "staged"),
    ],
)
def test_write_is_byte_exact(pair, rng, pool, n, path):
    agent, pools, peer = pair
    reset(peer, pool)
    random_fill(rng, pools[pool])
    rows = random_rows(rng, n, LOCAL[pool]["blocks"], SPECS[pool]["blocks"])
    t = agent.write(pool, (peer.name, pool), rows, path=path)
    t.wait(timeout=15)
    assert t.done() and t.nbytes == n * sum(p[0].nbytes for p in pools[pool])
    arrivals = peer.call("arrivals", 10)
    assert [(a[1], a[2], a[3]) for a in arrivals] == [
        (pool, "staged" if path == "staged" else "write", rows[:, 1].tolist())
    ]
    got = peer.call("get", pool)
    for local, remote in zip(pools[pool], got):
        want = np.full(remote.shape, POISON, np.uint8)
        want[rows[:, 1]] = local[rows[:, 0]]
        np.testing.assert_array_equal(remote, want)


@needs_nixl
@pytest.mark.parametrize("pool,n", [("kv", 3), ("big", 1250)])
def test_read_is_byte_exact(pair, rng, pool, n):
    agent, pools, peer = pair
    remote = [rng.integers(0, 256, p.shape, dtype=np.uint8) for p in make_parts(SPECS[pool])]
    peer.call("set", (pool, remote))
    peer.call("arrivals", 0)
    for p in pools[pool]:
        p[...] = POISON
    rows = random_rows(rng, n, SPECS[pool]["blocks"], LOCAL[pool]["blocks"])
    agent.read(pool, (peer.name, pool), rows).wait(timeout=15)
    for local, data in zip(pools[pool], remote):
        want = np.full(local.shape, POISON, np.uint8)
        want[rows[:, 1]] = data[rows[:, 0]]
        np.testing.assert_array_equal(local, want)
    assert [(a[2], a[3]) for a in peer.call("arrivals", 10)] == [("read", rows[:, 0].tolist())]


@needs_nixl
def test_index_pair_mapping_and_empty_mapping(pair, rng):
    agent, pools, peer = pair
    reset(peer, "kv")
    random_fill(rng, pools["kv"])
    src, dst = np.array([5, 0, 60]), np.array([96, 3, 0])
    agent.write("kv", (peer.name, "kv"), (src, dst)).wait(timeout=10)
    got = peer.call("get", "kv")
    np.testing.assert_array_equal(got[1][dst], pools["kv"][1][src])
    empty = agent.write("kv", (peer.name, "kv"), [])
    assert empty.done() and empty.nbytes == 0


@needs_nixl
@pytest.mark.parametrize(
    "rows,error",
    [
        ([(0, 97)], IndexError),  # destination past the peer's 97 blocks
        ([(61, 0)], IndexError),  # source past the local 61 blocks
        ([(0, -1)], IndexError),
        ([(0, 4), (1, 4)], ValueError),  # one destination twice
        ([(0, 1, 2)], ValueError),  # not (N, 2)
        ([(0.0, 1.0)], TypeError),
    ],
)
@pytest.mark.parametrize("path", ["direct", "staged"])
def test_bad_mappings_write_nothing(pair, rng, rows, error, path):
    agent, pools, peer = pair
    reset(peer, "kv")
    random_fill(rng, pools["kv"])
    good = [(i, i) for i in range(10)]
    with pytest.raises(error):
        agent.write("kv", (peer.name, "kv"), good + rows, path=path)
    with pytest.raises(error):
        agent.read("kv", (peer.name, "kv"), good + [(r[1], r[0]) if len(r) == 2 else r for r in rows])
    assert peer.call("arrivals", 0.2) == []
    for part in peer.call("get", "kv"):
        assert (part == POISON).all()


@needs_nixl
@pytest.mark.parametrize("pool,n,chunk_blocks", [("kv", 32, 7), ("kv", 5, 1), ("big", 1250, 97)])
def test_staged_write_in_chunks_is_byte_exact(pair, rng, pool, n, chunk_blocks):
    """A staged write cut into chunks (the last one short) lands byte-exact,
    reported once, with its blocks in mapping order."""
    agent, pools, peer = pair
    reset(peer, pool)
    random_fill(rng, pools[pool])
    rows = random_rows(rng, n, LOCAL[pool]["blocks"], SPECS[pool]["blocks"])
    agent.staged_chunk_bytes = chunk_blocks * sum(p[0].nbytes for p in pools[pool])
    try:
        agent.write(pool, (peer.name, pool), rows, path="staged").wait(timeout=15)
    finally:
        agent.staged_chunk_bytes = RemoteAgent.__init__.__kwdefaults__["staged_chunk_bytes"]
    assert [(a[2], a[3]) for a in peer.call("arrivals", 10)] == [("staged", rows[:, 1].tolist())]
    for local, remote in zip(pools[pool], peer.call("get", pool)):
        want = np.full(remote.shape, POISON, np.uint8)
        want[rows[:, 1]] = local[rows[:, 0]]
        np.testing.assert_array_equal(remote, want)


def forge_request(agent, peer_name: str, xfer_id: int, pool: str, dst):
    """Ask ``peer_name`` for staging slots as a staged write of ``agent`` would,
    with a ``Sent`` that the test drives by hand."""
    from cupy_swap.remote.staged import Sent

    peer = agent._peers[peer_name]
    uid = peer.pools[pool].uid
    sent = agent._sent[xfer_id] = Sent(peer_name, peer.incarnation, pool, uid, len(dst))
    agent.nixl.send_notif(peer_name, agent._note(wire.REQUEST, xfer_id, pool, uid, dst, peer.incarnation))
    return sent


def forge_chunk(agent, peer_name: str, xfer_id: int, pool: str, start: int, count: int):
    peer = agent._peers[peer_name]
    uid = peer.pools[pool].uid
    agent.nixl.send_notif(
        peer_name, agent._note(wire.STAGED, xfer_id, pool, uid, [start, count], peer.incarnation)
    )


@needs_nixl
def test_staged_chunk_outside_its_grant_is_refused(tmp_path):
    """A chunk that claims slots beyond its grant is refused (NACK), nothing is
    scattered, and its slots stay taken while chunks may still land there."""
    spec = {"kv": {"blocks": 8, "shape": (16,), "parts": 1, "staging": 4}}
    agent, pools, peer = start(tmp_path, spec, spec, "forged")
    try:
        reset_to = [np.full((8, 16), POISON, np.uint8)]
        peer.call("set", ("kv", reset_to))
        sent = forge_request(agent, peer.name, 999, "kv", [3, 4])
        end = time.monotonic() + 10
        while sent.offset is None and time.monotonic() < end:
            agent.poll()
        assert sent.offset is not None
        forge_chunk(agent, peer.name, 999, "kv", 1, 2)  # slots 1..2 of 2
        while sent.error is None and time.monotonic() < end:
            agent.poll()
        assert "destination blocks out of range, repeated, or not the granted count" in sent.error
        arrivals = peer.call("arrivals", 0.2)
        assert [(a[2], a[3]) for a in arrivals] == [("failed", [3, 4])]  # the receiver knows which blocks
        assert (peer.call("get", "kv")[0] == POISON).all()
        t = agent.write("kv", (peer.name, "kv"), [(i, i) for i in range(3)], path="staged")
        with pytest.raises(TimeoutError):  # 2 of the 4 slots are still held for the forged write
            t.wait(timeout=1)
        t.close()
    finally:
        peer.stop(agent)


@pytest.fixture
def local_pair():
    """Two agents in this process (8 staging slots, 16 blocks of 64 bytes each),
    for tests that reach into one side while a staged write is under way."""
    for a, b, pa, pb in connected_pair("chunks"):
        a.staged_chunk_bytes = 64  # one block a chunk
        yield a, b, pa, pb


def connected_pair(prefix: str, **agent_kw):
    """Yield once ``(a, b, pa, pb)``: two loopback agents of this process
    (``prefix-a``, ``prefix-b``), each with pool "kv" of 16 blocks of 64 bytes
    and 8 staging slots (``pa`` counts up, ``pb`` is poisoned), connected both
    ways; closed after (skips where NIXL is missing)."""
    if NIXL_WHY:
        pytest.skip(NIXL_WHY)
    a, b = loopback_agent(f"{prefix}-a", **agent_kw), loopback_agent(f"{prefix}-b", **agent_kw)
    pa = [np.arange(16 * 64, dtype=np.uint8).reshape(16, 64)]
    pb = [np.full((16, 64), POISON, np.uint8)]
    a.register_pool("kv", pa, staging_blocks=8)
    b.register_pool("kv", pb, staging_blocks=8)
    a.connect(b.metadata())
    b.connect(a.metadata())
    try:
        yield a, b, pa, pb
    finally:
        a.close()
        b.close()


def gathered_one_at_a_time(agent, ready: list):
    """Make a host pool's gather report each chunk ready only once ``ready[i]``
    is True, as a GPU pool's does when its gather kernels finish."""
    stager = agent._pools["kv"].stager
    gather = stager.gather

    def chunked(src, stream=None, chunk=0, offset=0):
        gather(src, stream, chunk, offset) if offset else gather(src, stream, chunk)
        return [(lambda i=i: ready[i]) for i in range(len(range(0, src.shape[0], chunk)))]

    stager.gather = chunked


def spin_until(cond, *agents, timeout=5.0):
    end = time.monotonic() + timeout
    while not cond():
        for agent in agents:
            agent.poll()
        assert time.monotonic() < end, "timed out"


def collect_until(cond, receiver, *others, timeout=5.0) -> list:
    """Poll ``receiver`` (keeping its arrivals) and ``others`` until ``cond(arrivals)``."""
    got, end = [], time.monotonic() + timeout
    while not cond(got):
        got += receiver.poll()
        for agent in others:
            agent.poll()
        assert time.monotonic() < end, "timed out"
    return got


def count_calls(obj, name: str) -> list:
    calls, real = [], getattr(obj, name)

    def counted(*args, **kw):
        calls.append(args)
        return real(*args, **kw)

    setattr(obj, name, counted)
    return calls


@needs_nixl
@pytest.mark.parametrize("how", ["disconnect", "drop"])
def test_staged_write_stops_posting_chunks_once_it_failed(local_pair, how):
    """A staged write whose later chunks wait for their gather posts none of
    them after the peer was disconnected or refused it (dropped the pool),
    and fails with that reason, not with a transfer that never ends."""
    a, b, pa, pb = local_pair
    ready = [True, False, False, False]
    gathered_one_at_a_time(a, ready)
    posted = count_calls(a.nixl, "make_prepped_xfer")
    t = a.write("kv", ("chunks-b", "kv"), [(i, i) for i in range(4)], path="staged")
    spin_until(lambda: len(posted) == 1 and not t.done(), a, b)
    if how == "disconnect":
        a.disconnect("chunks-b")
        why = "was disconnected"
    else:
        b.drop_pool("kv")
        spin_until(lambda: a._peers["chunks-b"].dropped, a)
        why = "dropped the pool"
    ready[:] = [True] * 4
    with pytest.raises(TransferError, match=why):
        t.wait(timeout=5)
    assert len(posted) == 1 and t._xfers == []


@needs_nixl
def test_failed_chunk_post_cancels_once_nixl_released_what_was_posted(local_pair):
    """NIXL failing on chunk 1 after chunk 0 was posted: the write fails, NIXL
    cancels (releases) chunk 0, so nothing of it can land and CANCEL frees the
    receiver's slots; the receiver records the blocks as failed."""
    a, b, pa, pb = local_pair
    real = a.nixl.make_prepped_xfer
    made = []

    def make(*args, **kw):
        made.append(1)
        if len(made) == 2:
            raise RuntimeError("injected NIXL failure")
        return real(*args, **kw)

    a.nixl.make_prepped_xfer = make
    notes = count_calls(a.nixl, "send_notif")
    t = a.write("kv", ("chunks-b", "kv"), [(i, i) for i in range(4)], path="staged")
    got = []
    with pytest.raises(TransferError, match="injected NIXL failure"):
        end = time.monotonic() + 5
        while time.monotonic() < end:
            got += b.poll()
            t.done()
    assert [wire.unpack_note(m).kind for _, m in notes] == [wire.REQUEST, wire.CANCEL]
    got += collect_until(lambda more: b._pools["kv"].slots.free.all() and (got or more), b, a)
    assert [(x.kind, x.blocks.tolist()) for x in got if x.kind == "failed"] == [("failed", [0, 1, 2, 3])]


@needs_nixl
def test_closed_staged_write_with_nothing_in_flight_gives_its_slots_back(local_pair):
    """close() after chunk 0 moved and before chunk 1 was gathered: nothing of
    it can still land, so the receiver's slots are freed (CANCEL)."""
    a, b, pa, pb = local_pair
    ready = [True, False]
    gathered_one_at_a_time(a, ready)
    t = a.write("kv", ("chunks-b", "kv"), [(0, 0), (1, 1)], path="staged")
    spin_until(lambda: t._all_posted is False and not t._xfers and t._ready is None, a, b)
    t.close()
    spin_until(lambda: b._pools["kv"].slots.free.all(), b, a)
    with pytest.raises(TransferError, match="closed before it was done"):
        t.wait(timeout=1)


@needs_nixl
def test_overlapping_staged_chunks_are_refused(local_pair):
    """Two chunks of one grant that claim the same slots are refused: the
    second is not scattered, the write is not acknowledged, and the slots
    stay held while the unclaimed ones may still be written."""
    a, b, pa, pb = local_pair
    sent = forge_request(a, "chunks-b", 999, "kv", [3, 4, 5, 6])
    spin_until(lambda: sent.offset is not None, a, b)
    for _ in range(2):
        forge_chunk(a, "chunks-b", 999, "kv", 0, 2)
    with pytest.warns(RuntimeWarning, match="claims slots an earlier chunk claimed"):
        got = collect_until(lambda got: sent.error is not None and got, b, a)
    assert "repeated" in sent.error and not sent.scattered
    assert [x.kind for x in got] == ["failed"] and not b._pools["kv"].slots.free[:4].any()


@needs_nixl
def test_staged_writes_back_to_back(pair, rng):
    """The second staged write waits (bounded) for the first to be scattered
    before it reuses the staging runs; both land byte-exact."""
    agent, pools, peer = pair
    reset(peer, "kv")
    random_fill(rng, pools["kv"])
    first, second = np.arange(0, 32), np.arange(32, 61)
    dst = rng.choice(97, 61, replace=False)
    t1 = agent.write("kv", (peer.name, "kv"), (first, dst[:32]), path="staged")
    t2 = agent.write("kv", (peer.name, "kv"), (second, dst[32:]), path="staged")
    assert agent.write("kv", (peer.name, "kv"), [], path="staged").done()
    t2.wait(timeout=10)
    assert t1.done()
    assert sorted(len(a[3]) for a in peer.call("arrivals", 10)) == [29, 32]
    got = peer.call("get", "kv")
    for local, remote in zip(pools["kv"], got):
        np.testing.assert_array_equal(remote[dst], local[:61])


@needs_nixl
def test_staged_writes_both_ways_at_once(pair, rng):
    """A -> B and B -> A staged at once: each side's send run is not the run
    the other writes into, so both land byte-exact (one shared run mixed them)."""
    agent, pools, peer = pair
    n = 625
    mine = [rng.integers(0, 256, p.shape, dtype=np.uint8) for p in pools["big"]]
    theirs = [rng.integers(0, 256, p.shape, dtype=np.uint8) for p in make_parts(SPECS["big"])]
    for p, d in zip(pools["big"], mine):
        p[...] = d
    peer.call("set", ("big", theirs))
    peer.call("arrivals", 0)
    agent.poll()
    to_peer = (np.arange(n), n + rng.permutation(n))  # sources and destinations disjoint on both sides
    to_me = (np.arange(n), n + rng.permutation(n))
    t = agent.write("big", (peer.name, "big"), to_peer, path="staged")
    got = []
    assert call_progressing(peer, lambda: got.extend(agent.poll()), "write", ("big", "big", to_me, "staged"))
    got += poll_until(agent, 1 - len(got), timeout=15, also=[t])
    assert call_progressing(peer, lambda: got.extend(agent.poll()), "wait_writes", 15) == [None]
    t.wait(timeout=15)
    assert [(a.kind, a.blocks.tolist()) for a in got] == [("staged", to_me[1].tolist())]
    assert [(a[2], a[3]) for a in peer.call("arrivals", 10)] == [("staged", to_peer[1].tolist())]
    np.testing.assert_array_equal(pools["big"][0][to_me[1]], theirs[0][to_me[0]])
    np.testing.assert_array_equal(peer.call("get", "big")[0][to_peer[1]], mine[0][to_peer[0]])


@needs_nixl
def test_staged_writes_from_two_senders_into_one_pool(pair, rng):
    """Two peers write staged into one pool before it polls: each gets its own
    granted slots of the receive run, so neither overwrites the other."""
    agent, pools, peer = pair
    other = loopback_agent("parent-second-sender")
    try:
        mine = make_parts({"blocks": 16, "shape": (3, 40), "parts": 2})
        for p in mine:
            p[...] = rng.integers(0, 256, p.shape, dtype=np.uint8)
        other.register_pool("kv", mine, staging_blocks=16)
        other.connect(agent.metadata())
        agent.connect(other.metadata())
        theirs = [rng.integers(0, 256, p.shape, dtype=np.uint8) for p in make_parts(SPECS["kv"])]
        peer.call("set", ("kv", theirs))
        for p in pools["kv"]:
            p[...] = POISON
        agent.poll()
        from_peer, from_other = (np.arange(8), np.arange(8)), (np.arange(8), np.arange(8, 16))
        got = []
        assert peer.call("write", ("kv", "kv", from_peer, "staged"))  # the receiver does not poll yet
        t = other.write("kv", (agent.name, "kv"), from_other, path="staged")
        end = time.monotonic() + 0.3  # both senders make progress while the receiver does not poll
        while time.monotonic() < end:
            t.done()
        got += poll_until(agent, 2 - len(got), also=[t])
        t.wait(timeout=10)
        assert call_progressing(peer, lambda: got.extend(agent.poll()), "wait_writes", 10) == [None]
        assert sorted((a.peer, a.blocks.tolist()) for a in got) == [
            (other.name, list(range(8, 16))),
            (peer.name, list(range(8))),
        ]
        for local, p_data, o_data in zip(pools["kv"], theirs, mine):
            np.testing.assert_array_equal(local[:8], p_data[:8])
            np.testing.assert_array_equal(local[8:16], o_data[:8])
    finally:
        other.close()
        agent.disconnect(other.name)


@needs_nixl
@pytest.mark.parametrize("path", ["direct", "staged"])
def test_internal_progress_keeps_arrivals(pair, rng, path):
    """Calls that make progress inside (remote_pools, write, read) handle
    notifications but leave the Arrivals for poll()."""
    agent, pools, peer = pair
    theirs = [rng.integers(0, 256, p.shape, dtype=np.uint8) for p in make_parts(SPECS["kv"])]
    peer.call("set", ("kv", theirs))
    agent.poll()
    rows = (np.arange(5), np.array([7, 3, 50, 0, 60]))

    def progress():
        assert "kv" in agent.remote_pools(peer.name)

    assert peer.call("write", ("kv", "kv", rows, path))
    assert call_progressing(peer, progress, "wait_writes", 10) == [None]
    end = time.monotonic() + 0.3  # the notification lands during these calls, not during poll()
    while time.monotonic() < end:
        progress()
    got = poll_until(agent, 1, timeout=3)
    assert [(a.peer, a.kind, a.blocks.tolist()) for a in got] == [
        (peer.name, "staged" if path == "staged" else "write", rows[1].tolist())
    ]
    for local, data in zip(pools["kv"], theirs):
        np.testing.assert_array_equal(local[rows[1]], data[rows[0]])


@needs_nixl
def test_unanswerable_peer_costs_no_arrival(pair):
    """A sender this agent never connected: the grant it asks for cannot be
    sent (a warning, in the peer process), and poll() still reports the
    sender's other writes instead of raising NIXL's error."""
    agent, pools, peer = pair
    peer.call("arrivals", 0)
    stranger = loopback_agent("parent-stranger")
    try:
        stranger.register_pool(
            "kv", make_parts({"blocks": 8, "shape": (3, 40), "parts": 2}), staging_blocks=8
        )
        name = stranger.connect(peer.call("metadata"))
        staged = stranger.write("kv", (name, "kv"), [(0, 1)], path="staged")
        direct = stranger.write("kv", (name, "kv"), [(2, 3)])
        direct.wait(timeout=10)
        got = peer.call("arrivals", 10)
        got += peer.call("arrivals", 0.2)
        # the grant could not be sent: the receiver records those blocks as failed
        assert sorted((a[0], a[2], a[3]) for a in got) == [
            (stranger.name, "failed", [1]),
            (stranger.name, "write", [3]),
        ]
        end = time.monotonic() + 0.3
        while time.monotonic() < end:
            staged.done()
        assert not staged.done()  # never granted: it waits (wait(timeout) bounds it)
        agent.write("kv", (peer.name, "kv"), [(0, 0)], path="staged").wait(
            timeout=10
        )  # the peer still serves
        assert [a[0] for a in peer.call("arrivals", 10)] == [agent.name]
        staged.close()  # given up
        with pytest.raises(TransferError, match="closed before it was done"):
            staged.done()
    finally:
        stranger.close()


@needs_nixl
def test_refused_staged_write_fails_the_sender(pair):
    """The receiver dropped the pool before it granted slots: the sender's
    Transfer raises TransferError promptly and keeps no state for it."""
    agent, pools, peer = pair
    assert peer.call("nap_then_drop", (1.0, "nack"))  # the request below reaches it asleep
    t = agent.write("nack", (peer.name, "nack"), [(0, 1), (2, 3)], path="staged")
    started = time.monotonic()
    with pytest.raises(TransferError, match="refused it: the receiver (dropped the pool|has no such pool)"):
        t.wait(timeout=5)
    assert time.monotonic() - started < 5
    assert not agent._sent
    agent.write("kv", (peer.name, "kv"), [(0, 0)], path="staged").wait(timeout=10)


@needs_nixl
def test_abandoned_transfers_are_released(pair):
    """close() releases a transfer's NIXL handle and fails it; a staged write
    dropped before it was posted gives its granted slots back (the next write
    needs all of them)."""
    agent, pools, peer = pair
    rows = np.stack([np.arange(1250), np.arange(1250)], 1)
    t = agent.write("big", (peer.name, "big"), rows)
    moved = t.moved  # NIXL may have finished it inside the post already
    t.close()
    assert t._xfers == []
    if moved:
        assert t.done()
    else:
        with pytest.raises(TransferError, match="closed before it was done"):
            t.wait(timeout=1)
    t = agent.write("kv", (peer.name, "kv"), [(0, 0)], path="staged")  # asks for 1 of the peer's 32 slots
    del t
    gc.collect()
    full = [(i, i) for i in range(32)]
    agent.write("kv", (peer.name, "kv"), full, path="staged").wait(timeout=10)
    peer.call("arrivals", 0.2)


@needs_nixl
def test_staged_beyond_staging_refused(pair):
    agent, pools, peer = pair
    with pytest.raises(ValueError, match=r"33 blocks exceed the staging runs \(32 slots\)"):
        agent.write("kv", (peer.name, "kv"), [(i, i) for i in range(33)], path="staged")
    with pytest.raises(RemoteError, match="has no staging run"):
        agent.write("gone", (peer.name, "gone"), [(0, 0)], path="staged")


@needs_nixl
def test_dropped_and_unknown_pools_are_refused(pair):
    agent, pools, peer = pair
    agent.write("gone", (peer.name, "gone"), [(0, 1)]).wait(timeout=10)
    peer.call("drop", "gone")
    deadline = time.monotonic() + 10
    while "gone" in agent.remote_pools(peer.name):
        assert time.monotonic() < deadline, "the drop notification did not arrive"
        time.sleep(0.001)
    with pytest.raises(PoolDroppedError, match="dropped pool 'gone'"):
        agent.write("gone", (peer.name, "gone"), [(0, 1)])
    with pytest.raises(PoolDroppedError, match="does not have pool 'nope'"):
        agent.read("gone", (peer.name, "nope"), [(0, 1)])


@needs_nixl
@pytest.mark.parametrize("op", ["write", "read"])
def test_peer_killed_mid_transfer_raises_in_bounded_time(tmp_path, op):
    spec = {"big": {"blocks": 2500, "shape": (32768,), "parts": 1}}
    agent, pools, peer = start(tmp_path, spec, spec, f"victim-{op}")
    try:
        rows = np.stack([np.arange(2500), np.arange(2500)], 1)
        getattr(agent, op)("big", (peer.name, "big"), rows).wait(timeout=15)  # connected and warm
        # The kill comes from another process, so it lands whether or not a post holds the GIL.
        subprocess.Popen(["sh", "-c", f"sleep 0.05; kill -9 {peer.pid}"])
        killed_by = time.monotonic() + 0.05
        with pytest.raises(TransferError, match="peer may have died"):
            while True:
                getattr(agent, op)("big", (peer.name, "big"), rows).wait(timeout=15)
                assert time.monotonic() < killed_by + 15, "no error 15 s after the kill"
        assert time.monotonic() < killed_by + 15
    finally:
        peer.stop(agent)


@needs_nixl
def test_connect_refuses_mismatched_layouts():
    a, b = loopback_agent("layout-a"), loopback_agent("layout-b")
    try:
        a.register_pool("kv", make_parts({"blocks": 4, "shape": (32,), "parts": 2}))
        b.register_pool("kv", make_parts({"blocks": 4, "shape": (48,), "parts": 2}))
        with pytest.raises(LayoutMismatchError, match="part 0 has 32-byte blocks here, 48-byte blocks there"):
            a.connect(b.metadata())
        b.drop_pool("kv")
        b.register_pool("kv", make_parts({"blocks": 4, "shape": (32,), "parts": 3}))
        with pytest.raises(LayoutMismatchError, match="2 parts here, 3 there"):
            a.connect(b.metadata())
        b.drop_pool("kv")
        b.register_pool("other", make_parts({"blocks": 9, "shape": (16,), "parts": 2}))
        peer = a.connect(b.metadata())  # differently named pools are checked when first paired
        with pytest.raises(LayoutMismatchError, match="part 0 has 32-byte blocks here, 16-byte"):
            a.write("kv", (peer, "other"), [(0, 0)])
    finally:
        a.close()
        b.close()


@needs_nixl
@pytest.mark.parametrize("fail_at", [1, 2])
def test_register_pool_failure_frees_what_it_registered(fail_at):
    """A failed step of register_pool (here: preparing the blocks' or the send
    run's descriptor list) deregisters the memory it had registered by then;
    the name stays free."""
    agent = loopback_agent("register-cleanup")
    try:
        parts = make_parts({"blocks": 4, "shape": (32,), "parts": 2})
        calls, freed = [], []
        prep, dereg = agent.nixl.prep_xfer_dlist, agent.nixl.deregister_memory

        def failing_prep(*args, **kwargs):
            calls.append(args[0])
            if len(calls) == fail_at:
                raise RuntimeError("prep failed on purpose")
            return prep(*args, **kwargs)

        def counting_dereg(reg):
            freed.append(reg)
            return dereg(reg)

        agent.nixl.prep_xfer_dlist = failing_prep
        agent.nixl.deregister_memory = counting_dereg
        with pytest.raises(RuntimeError, match="on purpose"):
            agent.register_pool("kv", parts, staging_blocks=4)
        assert len(freed) == fail_at and "kv" not in agent.pools()
        agent.nixl.prep_xfer_dlist = prep
        agent.register_pool("kv", parts, staging_blocks=4)
        assert "kv" in agent.pools()
    finally:
        agent.close()


# --- no NIXL needed ------------------------------------------------------------------------------------


def test_layout_of_strided_parts():
    parts = make_parts({"blocks": 5, "shape": (3, 8), "parts": 2, "strided": True})
    layout = pool_layout("kv", parts)
    assert layout.mem == "DRAM" and layout.num_blocks == 5 and layout.block_bytes == (24, 24)
    assert layout.parts[1].stride == 48 and layout.parts[1].address == parts[0].ctypes.data + 24
    descs = layout.block_descs()
    assert descs.shape == (10, 3) and int(descs[6, 0]) == parts[1].ctypes.data + 48
    with pytest.raises(ValueError, match="C-contiguous"):
        pool_layout("t", np.zeros((4, 3, 8))[:, :, ::2])
    with pytest.raises(ValueError, match="one memory"):
        pool_layout("t", [np.zeros((4, 8)), FakeGpuPart()])


@pytest.mark.parametrize(
    "mine,theirs,staging,path",
    [
        ("VRAM", "DRAM", True, "staged"),
        ("DRAM", "VRAM", True, "staged"),
        ("VRAM", "VRAM", True, "direct"),
        ("DRAM", "DRAM", True, "direct"),
        ("VRAM", "DRAM", False, "direct"),
    ],
)
def test_default_path_stages_between_gpu_and_host(mine, theirs, staging, path):
    """Measured on the H200 host (NOTES item 45): staging wins where one side
    is GPU memory and the other host memory; GPU -> GPU and host -> host go direct."""
    import dataclasses

    from cupy_swap.remote.agent import default_path

    base = pool_layout("kv", make_parts({"blocks": 4, "shape": (8,), "parts": 1}))
    run = base.parts if staging else ()
    local = dataclasses.replace(base, mem=mine, staging=run)
    remote = dataclasses.replace(base, mem=theirs, staging=base.parts)
    assert default_path(local, remote) == path


class FakeGpuPart:
    """Only what describe_part reads of a CuPy array."""

    __cuda_array_interface__ = {"data": (1 << 40, False), "shape": (4, 8), "typestr": "<f8", "version": 3}

    class device:
        id = 0


def test_split_mapping_forms_and_errors():
    s, d = split_mapping([(1, 2), (3, 0)], 4, 3, "a", "b")
    assert s.tolist() == [1, 3] and d.tolist() == [2, 0]
    s, d = split_mapping((np.array([1, 3]), np.array([2, 0])), 4, 3, "a", "b")
    assert s.tolist() == [1, 3] and d.tolist() == [2, 0]
    s, d = split_mapping([(0, 1), (2, 0)], 4, 3, "a", "b")  # rows go in a list (a tuple is (src, dst))
    assert s.tolist() == [0, 2]
    with pytest.raises(ValueError, match="one length"):
        split_mapping((np.array([1]), np.array([2, 0])), 4, 3, "a", "b")
    with pytest.raises(ValueError, match="distinct destination"):
        split_mapping([(0, 1), (1, 1)], 4, 3, "a", "b")
    with pytest.raises(IndexError):
        split_mapping([(4, 0)], 4, 3, "a", "b")
    assert descriptor_indices(np.array([2, 0]), 3, 10).tolist() == [2, 0, 12, 10, 22, 20]


def test_wire_round_trip():
    layout = pool_layout("kv", make_parts({"blocks": 3, "shape": (8,), "parts": 2}))
    name, pools, md, inc = wire.unpack_metadata(wire.pack_metadata("a", {"kv": layout}, b"\x00nixl", 7))
    assert (name, pools, md, inc) == ("a", {"kv": layout}, b"\x00nixl", 7)
    note = wire.unpack_note(wire.pack_note(wire.STAGED, 7, "kv", [3, 1], src=11, dst=2**64 - 1, uid=5))
    assert (note.kind, note.xfer_id, note.pool, note.blocks.tolist()) == (wire.STAGED, 7, "kv", [3, 1])
    assert (note.src, note.dst, note.uid) == (11, 2**64 - 1, 5)
    assert wire.unpack_note(b"someone else's message") is None
    with pytest.raises(ValueError, match="metadata exported by this version of cupy_swap.remote"):
        wire.unpack_metadata(b"raw nixl metadata")


def test_exchange_file(tmp_path):
    publish(tmp_path / "md", b"blob")
    assert fetch(tmp_path / "md") == b"blob"
    assert oct((tmp_path / "md").stat().st_mode & 0o777) == "0o600"
    with pytest.raises(TimeoutError):
        fetch(tmp_path / "none", timeout=0.05)


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o620, 0o666])
def test_exchange_refuses_files_others_may_touch(tmp_path, mode):
    publish(tmp_path / "md", b"blob")
    os.chmod(tmp_path / "md", mode)
    with pytest.raises(PermissionError, match="no group or other access"):
        fetch(tmp_path / "md", timeout=0.05)


def test_exchange_refuses_another_users_file(tmp_path, monkeypatch):
    publish(tmp_path / "md", b"blob")
    uid = os.getuid()
    monkeypatch.setattr(os, "getuid", lambda: uid + 1)
    with pytest.raises(PermissionError, match="owned by this user"):
        fetch(tmp_path / "md", timeout=0.05)


# --- GPU (run on the device) ---------------------------------------------------------------------------

GPU_CASES = [("gpu", "host"), ("host", "gpu"), ("gpu", "gpu")]


@needs_nixl
@pytest.mark.gpu
@pytest.mark.parametrize("path", ["direct", "staged"])
@pytest.mark.parametrize("mine,theirs", GPU_CASES)
def test_gpu_write_is_byte_exact(tmp_path, rng, mine, theirs, path):  # pragma: no cover - device
    n, blocks = 1250, 1300
    local = {"kv": {"blocks": blocks, "shape": (16, 8, 128, 2), "parts": 2, "mem": mine, "staging": n}}
    remote = {"kv": dict(local["kv"], mem=theirs, strided=True)}
    agent, pools, peer = start(tmp_path, local, remote, f"gpu-{mine}-{theirs}-{path}")
    try:
        data = [rng.integers(0, 256, p.shape, dtype=np.uint8) for p in to_host(pools["kv"])]
        for p, d in zip(pools["kv"], data):
            p[...] = to_device(p, d)
        rows = random_rows(rng, n, blocks, blocks)
        agent.write("kv", (peer.name, "kv"), rows, path=path).wait(timeout=30)
        assert len(peer.call("arrivals", 10)) == 1
        for d, got in zip(data, peer.call("get", "kv")):
            want = np.full(got.shape, POISON, np.uint8)
            want[rows[:, 1]] = d[rows[:, 0]]
            np.testing.assert_array_equal(got, want)
    finally:
        peer.stop(agent)


@needs_nixl
@pytest.mark.gpu
@pytest.mark.parametrize("mine,theirs", GPU_CASES)
def test_gpu_read_is_byte_exact(tmp_path, rng, mine, theirs):  # pragma: no cover - device
    n, blocks = 300, 400
    local = {"kv": {"blocks": blocks, "shape": (32768,), "parts": 1, "mem": mine}}
    remote = {"kv": dict(local["kv"], mem=theirs)}
    agent, pools, peer = start(tmp_path, local, remote, f"gpu-read-{mine}-{theirs}")
    try:
        data = [rng.integers(0, 256, (blocks, 32768), dtype=np.uint8)]
        peer.call("set", ("kv", data))
        rows = random_rows(rng, n, blocks, blocks)
        agent.read("kv", (peer.name, "kv"), rows).wait(timeout=30)
        got = to_host(pools["kv"])[0]
        want = np.full(got.shape, POISON, np.uint8)
        want[rows[:, 1]] = data[0][rows[:, 0]]
        np.testing.assert_array_equal(got, want)
    finally:
        peer.stop(agent)


# --- the benchmark and the example, host-only ----------------------------------------------------------


@needs_nixl
def test_remote_bench_rows_are_exact():
    from cupy_swap.tools import remote_bench

    rows = remote_bench.run("host", "host", 4096, 5, reps=3)
    assert [r["contender"] for r in rows] == ["direct", "staged", "raw", "raw-nonote", "raw-1desc"]
    assert all(r["exact"] in (None, True) and r["gbps"] > 0 for r in rows)


@needs_nixl
def test_disagg_prefill_example_host_only():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run(
        [
            sys.executable,
            os.path.join(root, "examples", "disagg_prefill.py"),
            "--host-only",
            "--layers",
            "2",
            "--blocks",
            "16",
            "--gpu-blocks",
            "64",
            "--host-blocks",
            "64",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, UCX_NET_DEVICES="lo"),
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "decode: 16 blocks arrived from prefill" in out.stdout and "every byte checked" in out.stdout


@pytest.mark.parametrize("on_error", [None, "told"])
def test_a_request_nixl_cannot_let_go_keeps_its_transfer_busy(on_error):
    """A closed transfer whose NIXL request refuses release stays busy (its
    pool and peer cannot be dropped under it) until the agent, having
    seen the request end, calls back; reads and writes without a receiver
    to tell (no on_error) linger too."""
    from cupy_swap.remote.handle import Transfer

    class Stuck:
        def release(self):
            raise RuntimeError("NIXL_ERR_BUSY")

    told, kept = [], []
    t = Transfer(
        None,
        "write kv -> b/kv (1 block, direct)",
        8,
        1,
        lambda track: track(Stuck()) or False,  # posted, not all posted yet
        on_error=(lambda: told.append(1)) if on_error else None,
        linger=lambda xfers, then: kept.append((xfers, then)),
    )
    assert t._busy()
    t.close()
    assert len(kept) == 1 and t._busy() and told == []  # failed, but NIXL still holds the request
    kept[0][1]()  # the agent saw it end and released it
    assert not t._busy() and told == ([1] if on_error else [])
