"""cupy_swap.remote when peers misbehave, restart, die or leave, and when
callers reuse what they passed (issue 33, "Remote 2"): real NIXL over
loopback, host pools, two processes where a peer must die, on the CPU.

Every test uses short deadlines (``peer_timeout`` of 1-1.5 s) and waits on
conditions with generous bounds, never on sleeps."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

from cupy_swap.remote import RemoteAgent, RemoteError, TransferError, fetch, fetch_from

from .remote_workers import make_parts
from .test_remote import (
    NIXL_WHY,
    POISON,
    Peer,
    collect_until,
    connected_pair,
    gathered_one_at_a_time,
    loopback_agent,
    needs_nixl,
    spin_until,
    start,
)

DEADLINE = 1.5  # peer_timeout of these tests' agents
SPEC = {"kv": {"blocks": 16, "shape": (64,), "parts": 1, "staging": 8}}
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def two():
    """Two agents in this process (16 blocks of 64 bytes, 8 staging slots), short deadlines."""
    yield from connected_pair("two", peer_timeout=DEADLINE)


def run_script(body: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run ``body`` in a fresh interpreter (a crash there must not take the test run down)."""
    code = "import os\nos.environ.setdefault('UCX_NET_DEVICES', 'lo')\n" + textwrap.dedent(body)
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")),
    )


def drive(*agents, until, timeout=10.0):
    spin_until(until, *agents, timeout=timeout)


# --- 1: the mapping is the caller's --------------------------------------------------------------------


@needs_nixl
def test_staged_write_owns_its_mapping(two):
    """Finding 1: the caller reuses its mapping buffer right after write()
    returned and before the grant came; the blocks land where the first
    contents said, and the receiver's Arrival names those."""
    a, b, pa, pb = two
    rows = np.array([[0, 3], [1, 4], [2, 5]], dtype=np.int64)
    t = a.write("kv", ("two-b", "kv"), rows, path="staged")
    rows[:] = [[7, 10], [8, 11], [9, 12]]  # the caller's next batch, written into the same buffer
    got = collect_until(lambda got: got, b, a)
    t.wait(timeout=10)
    assert [(x.kind, x.blocks.tolist()) for x in got] == [("staged", [3, 4, 5])]
    np.testing.assert_array_equal(pb[0][[3, 4, 5]], pa[0][[0, 1, 2]])
    assert (pb[0][[10, 11, 12]] == POISON).all()


# --- 2 and 7: restarts under the same name -------------------------------------------------------------


class HeldScatter:
    """A GPU scatter's event, held unfinished until the test says."""

    def __init__(self):
        self.done = False


@needs_nixl
def test_restarted_sender_gets_no_credit_for_its_predecessor(two):
    """Finding 2: the receiver (its scatter asynchronous, as a GPU pool's)
    still scatters a staged write of the sender's dead incarnation when a
    new process of the same name, numbering its transfers from 1 again,
    writes; the old scatter's completion is not counted against the new
    write, which is done only once its own bytes landed; the old slots are
    freed once that scatter finished."""
    a, b, pa, pb = two
    held = []
    scatter = b._pools["kv"].stager.scatter

    def async_scatter(dst, offset=0):
        scatter(dst, offset)
        held.append(HeldScatter())
        return held[-1]

    b._pools["kv"].stager.scatter = async_scatter
    old = a.write("kv", ("two-b", "kv"), [(0, 0), (1, 1)], path="staged")
    drive(a, b, until=lambda: held and old.moved)
    # "two-a" restarts: a new process (here a new agent) of the same name.
    a2 = loopback_agent("two-a", peer_timeout=DEADLINE)
    try:
        p2 = [np.full((16, 64), 7, np.uint8)]
        a2.register_pool("kv", p2, staging_blocks=8)
        a2.connect(b.metadata())
        b.connect(a2.metadata())
        got = b.poll()  # the old incarnation's write, failed at connect (its scatter still runs)
        ready = [False]
        gathered_one_at_a_time(a2, ready)
        new = a2.write("kv", ("two-b", "kv"), [(0, 8), (1, 9)], path="staged")
        drive(a2, b, until=lambda: new._ready is None)  # granted; its chunk waits for its gather
        held[0].done = True  # the old incarnation's scatter finishes now
        spins = 0
        while b._scattering:  # until the receiver has handled it (no time window)
            got += b.poll()
            spins += 1
            assert spins < 100_000, "the old scatter was never handled"
        for _ in range(50):  # then its slots may be taken again, and the new write has no bytes yet
            got += b.poll()
            assert not new.done(), "done without its bytes"
        assert (pb[0][[8, 9]] == POISON).all()
        ready[0] = True

        def landed(more):
            for h in held:
                h.done = True
            return new.done() and b._pools["kv"].slots.free.all()

        got += collect_until(landed, b, a2)
        np.testing.assert_array_equal(pb[0][[8, 9]], p2[0][[0, 1]])
        assert [x.blocks.tolist() for x in got if x.kind == "staged"] == [[8, 9]]
        assert [x.blocks.tolist() for x in got if x.kind == "failed"] == [[0, 1]]  # the old one's
    finally:
        old.close()
        a2.close()


HOST16 = {"kv": {"blocks": 32, "shape": (64,), "parts": 1, "staging": 16}}


@needs_nixl
def test_restarted_sender_host_pools_frees_the_old_grant(tmp_path):
    """Finding 7: a sender SIGKILLed holding a grant of 8 of the receiver's 16
    slots restarts under the same name; once connected, the old grant is
    freed (its blocks recorded as failed), the new write lands byte-exact,
    and after disconnect() every slot is free."""
    agent, pools, peer = start(tmp_path, HOST16, HOST16, "restart", peer_timeout=30.0)
    try:
        assert peer.call("stall_gathers")
        assert peer.call("write", ("kv", "kv", [(i, i) for i in range(8)], "staged"))
        drive(agent, until=lambda: len(agent._pools["kv"].slots.grants) == 1)
        peer.kill()
        os.unlink(os.path.join(tmp_path, "restart"))
        again = Peer(agent, tmp_path, HOST16, "restart", {"peer_timeout": 30.0})  # connect() happens here
        assert agent._pools["kv"].slots.free.all()  # freed at connect, long before any deadline
        data = [np.random.default_rng(1).integers(0, 256, (32, 64), dtype=np.uint8)]
        again.call("set", ("kv", data))
        rows = [(i, 16 + i) for i in range(8)]
        assert again.call("write", ("kv", "kv", rows, "staged"))
        got = collect_until(lambda got: any(x.kind == "staged" for x in got), agent)
        assert again.call("wait_writes", 10) == [None]
        np.testing.assert_array_equal(pools["kv"][0][16:24], data[0][:8])
        assert [(x.kind, x.blocks.tolist()) for x in got] == [
            ("failed", list(range(8))),
            ("staged", list(range(16, 24))),
        ]
        agent.disconnect(again.name)
        assert agent._pools["kv"].slots.free.all()
        again.stop(agent)
    finally:
        if peer.proc.is_alive():
            peer.kill()


# --- 3: aliasing and read-only pools ---------------------------------------------------------------------


@needs_nixl
def test_register_pool_refuses_shared_and_read_only_memory():
    """Finding 3, in a fresh process (NIXL crashed deregistering a pool
    registered twice): parts sharing bytes and read-only memory are refused
    with swap()'s words; views cache[:, i] of one cache are accepted and the
    agent closes cleanly."""
    out = run_script("""
        import numpy as np
        from cupy_swap.remote import RemoteAgent
        agent = RemoteAgent("alias")
        x = np.zeros((8, 64), np.uint8)
        cache = np.zeros((8, 2, 64), np.uint8)
        for name, parts in [("same", [x, x]), ("overlap", [x[:4], x[2:6]]), ("ro", [np.frombuffer(bytes(512), np.uint8).reshape(8, 64)])]:
            try:
                agent.register_pool(name, parts)
                print(name, "registered")
            except ValueError as e:
                print(name, "refused:", e)
        agent.register_pool("ok", [cache[:, 0], cache[:, 1]], staging_blocks=2)
        agent.drop_pool("ok")
        agent.close()
        print("closed")
    """)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert any(line.startswith("same refused:") and "share bytes" in line for line in lines), out.stdout
    assert any(line.startswith("overlap refused:") and "share bytes" in line for line in lines), out.stdout
    assert any(
        line.startswith("ro refused:") and "expected a writeable destination, got a read-only array" in line
        for line in lines
    ), out.stdout
    assert lines[-1] == "closed"


# --- 4: threads --------------------------------------------------------------------------------------


@needs_nixl
def test_two_threads_share_an_agent():
    """Finding 4, in a fresh process (it died with SIGSEGV): one thread polls
    while another writes and waits, 10,000 one-block writes, all done."""
    out = run_script(
        """
        import threading, numpy as np
        from cupy_swap.remote import RemoteAgent
        a, b = RemoteAgent("threads-a"), RemoteAgent("threads-b")
        a.register_pool("kv", [np.ones((16, 64), np.uint8)])
        b.register_pool("kv", [np.zeros((16, 64), np.uint8)])
        a.connect(b.metadata()); b.connect(a.metadata())
        stop, polled, errors = threading.Event(), [0], []
        def poller():
            while not stop.is_set():
                try:
                    a.poll(); b.poll()
                except Exception as e:
                    errors.append(e); return
                polled[0] += 1
        t = threading.Thread(target=poller); t.start()
        try:
            for i in range(10000):
                a.write("kv", ("threads-b", "kv"), [(i % 16, (i * 7) % 16)]).wait(timeout=30)
        finally:
            stop.set(); t.join()
        assert not errors, errors
        assert (b._pools["kv"].keep[0] == 1).all()
        a.close(); b.close()
        print("ok", polled[0] > 0)
        """,
        timeout=240,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    assert out.stdout.splitlines()[-1] == "ok True"


# --- 5: a receiver killed at each step of a staged write --------------------------------------------------


RECV = {"kv": {"blocks": 16, "shape": (64,), "parts": 1, "staging": 8}}
SEND = {"kv": {"blocks": 16, "shape": (64,), "parts": 1, "staging": 16}}


@needs_nixl
@pytest.mark.parametrize(
    "step", ["before-request", "after-request", "after-grant", "mid-chunk", "before-scattered"]
)
def test_receiver_killed_fails_the_write_within_the_deadline(tmp_path, step):
    """Finding 5 and the goal: the receiver is SIGKILLed at each step of a
    staged write; the sender's write raises TransferError within the
    deadline (not TimeoutError, not never), its send slots come back, and a
    staged write from the same pool to a healthy peer meanwhile is not held up."""
    agent, pools, peer = start(tmp_path, SEND, RECV, f"victim-{step}", peer_timeout=DEADLINE)
    healthy = Peer(agent, tmp_path, RECV, f"healthy-{step}", {"peer_timeout": DEADLINE})
    try:
        ready = [True]
        if step in ("after-grant", "mid-chunk"):
            ready = [False]
            gathered_one_at_a_time(agent, ready)
        if step == "before-scattered":
            assert peer.call("hold_acks")
        if step == "after-request":
            assert peer.call("nap", 60)  # the request reaches it asleep
        if step == "before-request":
            peer.kill()
        killed = time.monotonic()
        try:
            t = agent.write("kv", (peer.name, "kv"), [(i, i) for i in range(4)], path="staged")
        except RemoteError:  # the request could not even be sent: refused at once, nothing held
            t = None
        if step in ("after-grant", "mid-chunk"):
            drive(agent, until=lambda: t._ready is None)  # granted
            if step == "mid-chunk":
                assert peer.call("nap", 60)  # not progressing: the chunk stays in flight
                ready[0] = True
                drive(agent, until=lambda: t._xfers or t.moved or t._error is not None)
        if step == "before-scattered":
            drive(agent, until=lambda: t.moved)
        if step != "before-request":
            peer.kill()
            killed = time.monotonic()
        ready[0] = True
        # Meanwhile a staged write from the same pool to a live peer goes through.
        agent.write("kv", (healthy.name, "kv"), [(8, 0), (9, 1)], path="staged").wait(timeout=10)
        if t is not None:
            with pytest.raises(TransferError):
                t.wait(timeout=10 * DEADLINE)
        assert time.monotonic() - killed < 2 * DEADLINE + 3
        drive(agent, until=lambda: agent._pools["kv"].send.free.all())
        assert not agent._sent
    finally:
        if peer.proc.is_alive():
            peer.kill()
        healthy.stop(agent)


# --- a sender killed at each step: the receiver fails it and frees its slots ------------------------------


@needs_nixl
@pytest.mark.parametrize("step", ["after-request", "after-grant", "before-scattered"])
def test_sender_killed_frees_the_receivers_slots(tmp_path, step):
    """The sender is SIGKILLed after its request (the receiver cannot grant
    yet: its run is full), after its grant, or after its chunks landed; the
    receiver records the blocks as failed (or as arrived when every byte
    landed) within the deadline, and its slots are all free afterwards."""
    agent, pools, peer = start(tmp_path, RECV, SEND, f"sender-{step}", peer_timeout=DEADLINE)
    try:
        blocker = None
        if step == "after-request":  # the run is full: the request waits for room
            other = loopback_agent(f"blocker-{step}", peer_timeout=DEADLINE)
            other.register_pool("kv", make_parts(RECV["kv"]), staging_blocks=8)
            other.connect(agent.metadata())
            agent.connect(other.metadata())
            gathered_one_at_a_time(other, [False])
            blocker = other.write("kv", (agent.name, "kv"), [(i, i) for i in range(8)], path="staged")
            drive(agent, other, until=lambda: blocker._ready is None)
        if step != "before-scattered":
            assert peer.call("stall_gathers")
        assert peer.call("write", ("kv", "kv", [(i, 8 + i) for i in range(4)], "staged"))
        slots = agent._pools["kv"].slots
        if step == "after-request":
            drive(agent, until=lambda: len(slots.queue) == 1)
        elif step == "after-grant":
            drive(agent, until=lambda: any(k[0] == peer.name for k in slots.grants))
        else:
            got = collect_until(lambda got: got, agent)
            assert [x.kind for x in got] == ["staged"]
        peer.kill()
        killed = time.monotonic()
        if blocker is not None:
            blocker.close()

        def settled(got):
            if not slots.free.all() or slots.queue or slots.grants:
                return False
            return step == "before-scattered" or any(x.peer == peer.name for x in got)

        got = collect_until(settled, agent, timeout=4 * DEADLINE + 5)
        assert time.monotonic() - killed < 4 * DEADLINE + 5
        if step != "before-scattered":
            assert [(x.peer, x.kind, x.blocks.tolist()) for x in got if x.peer == peer.name] == [
                (peer.name, "failed", [8, 9, 10, 11])
            ]
        assert not slots.grants and not slots.queue
        if blocker is not None:
            other.close()
    finally:
        if peer.proc.is_alive():
            peer.kill()
        agent.close()


# --- 6: fetch() of a FIFO -------------------------------------------------------------------------------


def test_fetch_refuses_a_fifo_without_blocking(tmp_path):
    """Finding 6: a FIFO at the path is refused at once (PermissionError),
    never waited on: the open cannot block."""
    path = os.path.join(tmp_path, "md")
    os.mkfifo(path, 0o600)
    out = []
    worker = threading.Thread(target=lambda: out.append(_try(fetch, path, timeout=1.0)), daemon=True)
    worker.start()
    worker.join(10)
    if worker.is_alive():  # unblock the open so the thread ends, then fail
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
        worker.join(5)
        pytest.fail("fetch() blocked on a FIFO")
    assert isinstance(out[0], PermissionError) and "a FIFO" in str(out[0])


def test_fetch_refuses_a_symlink(tmp_path):
    target = os.path.join(tmp_path, "real")
    with open(target, "wb") as f:
        f.write(b"x")
    os.chmod(target, 0o600)
    os.symlink(target, os.path.join(tmp_path, "link"))
    with pytest.raises(PermissionError, match="symbolic link"):
        fetch(os.path.join(tmp_path, "link"), timeout=1.0)


def _try(fn, *args, **kw):
    try:
        return fn(*args, **kw)
    except Exception as e:
        return e


# --- 8: a request for a pool dropped and registered again ----------------------------------------------


@needs_nixl
def test_request_for_a_dropped_pool_is_not_granted_by_its_successor(tmp_path):
    """Finding 8: the request reaches the receiver after it dropped "kv" and
    registered a new "kv"; the new pool refuses it (the request names the
    old registration), so no slot is held for it, and once reconnected a
    staged write needing every slot of the new pool goes through."""
    agent, pools, peer = start(tmp_path, SEND, RECV, "reregister", peer_timeout=30.0)
    try:
        assert peer.call("nap_then_reregister", (1.0, "kv"))
        t = agent.write("kv", (peer.name, "kv"), [(0, 1), (2, 3)], path="staged")
        with pytest.raises(TransferError, match="dropped the pool"):
            t.wait(timeout=10)
        assert peer.call("state", "kv") == (8, 0, 0)  # nothing granted nor waiting in the new pool
        agent.connect(fetch(os.path.join(tmp_path, "reregister"), timeout=10))
        full = agent.write("kv", (peer.name, "kv"), [(i, i) for i in range(8)], path="staged")
        full.wait(timeout=10)
    finally:
        peer.stop(agent)


# --- 9: close() of a timed-out staged write with its chunk in flight ------------------------------------


@needs_nixl
def test_close_after_a_timed_out_wait_gives_the_slots_back(tmp_path):
    """Finding 9: wait() timed out on a staged write whose chunk is in flight
    (the receiver is not progressing); close() releases it (NIXL cancels it)
    and sends CANCEL, so four such timeouts do not fill the receiver's run:
    a write needing all its slots goes through at once after."""
    big = {"kv": {"blocks": 64, "shape": (65536,), "parts": 1, "staging": 32}}
    agent, pools, peer = start(tmp_path, big, big, "closer", peer_timeout=30.0)
    try:
        for _ in range(4):
            ready = [False]
            gathered_one_at_a_time(agent, ready)
            t = agent.write("kv", (peer.name, "kv"), [(i, i) for i in range(8)], path="staged")
            drive(agent, until=lambda t=t: t._ready is None)  # granted
            assert peer.call("nap", 1.0)
            ready[0] = True
            with pytest.raises(TimeoutError):
                t.wait(timeout=0.2)
            t.close()
        gathered_one_at_a_time(agent, [True])
        full = agent.write("kv", (peer.name, "kv"), [(i, i) for i in range(32)], path="staged")
        full.wait(timeout=10)  # far within the 30 s deadline: the slots came back by CANCEL
    finally:
        peer.stop(agent)


# --- 10: a sender that never polls ---------------------------------------------------------------------


@needs_nixl
def test_a_sender_that_never_polls_keeps_no_dead_references(two):
    """Finding 10: 3,000 writes waited on and dropped, no poll(): the agent
    keeps a bounded list, not one reference per transfer."""
    a, b, pa, pb = two
    for i in range(3000):
        t = a.write("kv", ("two-b", "kv"), [(i % 16, i % 16)], notify=False)
        while not t.done():  # the receiver polls (over TCP its progress moves the bytes)
            b.poll()
    assert len(a._pending) < 200


# --- 11: connect() with transfers in flight -------------------------------------------------------------


@needs_nixl
def test_connect_with_transfers_in_flight_is_refused_and_they_finish(two):
    """Finding 11: refreshed metadata of a peer (it registered a pool) while
    a direct write to it is in flight and a staged write waits for its
    grant: connect() refuses, nothing is released under them, both finish
    byte-exact with their Arrivals; once they are done connect() takes the
    new view.  (Metadata that did not change is no refresh: issue 39.)"""
    a, b, pa, pb = two
    real, hold = a.nixl.check_xfer_state, [True]
    a.nixl.check_xfer_state = lambda x: "PROC" if hold[0] else real(x)
    direct = a.write("kv", ("two-b", "kv"), [(i, i) for i in range(8)])
    staged = a.write("kv", ("two-b", "kv"), [(8, 8), (9, 9)], path="staged")
    b.register_pool("more", [np.zeros((4, 64), np.uint8)])
    with pytest.raises(RemoteError, match="still in flight"):
        a.connect(b.metadata())
    hold[0] = False
    got = collect_until(lambda got: len(got) == 2, b, a)
    direct.wait(timeout=10)
    staged.wait(timeout=10)
    assert sorted((x.kind, x.blocks.tolist()) for x in got) == [
        ("staged", [8, 9]),
        ("write", list(range(8))),
    ]
    np.testing.assert_array_equal(pb[0][:10], pa[0][:10])
    a.connect(b.metadata())
    t = a.write("kv", ("two-b", "kv"), [(10, 10)])
    drive(a, b, until=t.done)


# --- 12: where the listener binds ------------------------------------------------------------------------


def _listeners(port: int) -> list:
    """Local addresses of TCP sockets listening on ``port`` (from /proc/net/tcp)."""
    out = []
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            addr, p = local.split(":")
            if state == "0A" and int(p, 16) == port:
                out.append(socket.inet_ntoa(bytes.fromhex(addr)[::-1]))
    return out


@needs_nixl
def test_listener_binds_loopback_unless_asked():
    """Finding 12: RemoteAgent(listen_port=P) listens on 127.0.0.1:P only,
    and what it serves is its metadata, which a peer can connect()."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    a = RemoteAgent("listener", listen_port=port)
    b = loopback_agent("listener-client")
    try:
        assert _listeners(port) == ["127.0.0.1"]
        assert b.connect(fetch_from("127.0.0.1", port, timeout=5)) == "listener"
    finally:
        b.close()
        a.close()
    assert _listeners(port) == []


# --- deadlines on the receiver's side, in one process ----------------------------------------------------


@needs_nixl
def test_granted_write_whose_chunks_never_come_expires_on_both_sides(two):
    """A grant whose chunk never comes (the sender's gather never finishes)
    fails on the sender with TransferError within the deadline and on the
    receiver as a failed Arrival; the receiver's slots are free after."""
    a, b, pa, pb = two
    ready = [False]
    gathered_one_at_a_time(a, ready)
    t = a.write("kv", ("two-b", "kv"), [(0, 0), (1, 1)], path="staged")
    start_t = time.monotonic()
    got = []
    with pytest.raises(TransferError, match="peer_timeout"):
        while True:
            got += b.poll()
            t.done()
            assert time.monotonic() - start_t < 3 * DEADLINE + 5
    got += collect_until(lambda more: b._pools["kv"].slots.free.all() and (got or more), b, a)
    assert [(x.kind, x.blocks.tolist()) for x in got] == [("failed", [0, 1])]
    assert not a._pools["kv"].send.free.all()  # its gather (a GPU kernel, say) may still write them
    ready[0] = True
    spin_until(lambda: a._pools["kv"].send.free.all(), a, b)


# --- the README's snippet, bench --remote's command line -------------------------------------------------


@needs_nixl
def test_remote_readme_snippet_runs_as_written():
    """The first Python block of cupy_swap/remote/README.md, run as it is."""
    with open(os.path.join(ROOT, "cupy_swap", "remote", "README.md")) as f:
        text = f.read()
    snippet = text.split("```python\n", 1)[1].split("```", 1)[0]
    out = run_script(snippet, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.strip().splitlines()[-1] == "write [5 9]"


def test_remote_bench_command_line_exit_codes(capsys):
    """bench --remote: 2 for a bad command line (a size it cannot read, a
    count of 0, rows that need more memory than --max-memory), 3 without a
    GPU for --from gpu; its default rows fit in 8 GiB for both processes."""
    from cupy_swap.tools import remote_bench

    assert remote_bench.main(["--sizes", "5Q"]) == 2
    assert remote_bench.main(["--rows", "32Kx0"]) == 2
    assert remote_bench.main(["--rows", "2Mx1250"]) == 2
    assert "more than --max-memory" in capsys.readouterr().err
    default_rows = [(32768, 1250), (2 << 20, 16)]
    assert sum(remote_bench.memory_needed(b, n) for b, n in default_rows) < 1 << 30
    if NIXL_WHY is None and remote_bench._gpu_reason() is not None:
        assert remote_bench.main(["--from", "gpu", "--reps", "1"]) == 3
        assert "needs a usable GPU" in capsys.readouterr().err


# --- GPU (run on the device) ---------------------------------------------------------------------------


@needs_nixl
@pytest.mark.gpu
@pytest.mark.parametrize("mine,theirs", [("gpu", "host"), ("host", "gpu"), ("gpu", "gpu")])
def test_gpu_staged_writes_in_flight_together(tmp_path, rng, mine, theirs):  # pragma: no cover - device
    """Two staged writes from one pool in flight at once take distinct slots
    of its send run (a GPU gather into the second's slots while the first's
    leave) and of the receiver's run (a GPU scatter each); both byte-exact,
    two Arrivals, every slot free after."""
    from .remote_workers import to_device, to_host

    spec = {"kv": {"blocks": 256, "shape": (32768,), "parts": 2, "mem": mine, "staging": 128}}
    remote = {"kv": dict(spec["kv"], mem=theirs)}
    agent, pools, peer = start(tmp_path, spec, remote, f"gpu-two-{mine}-{theirs}", peer_timeout=30.0)
    try:
        data = [rng.integers(0, 256, p.shape, dtype=np.uint8) for p in to_host(pools["kv"])]
        for p, d in zip(pools["kv"], data):
            p[...] = to_device(p, d)
        src, dst = rng.choice(256, 128, replace=False), rng.choice(256, 128, replace=False)
        t1 = agent.write("kv", (peer.name, "kv"), (src[:60], dst[:60]), path="staged")
        t2 = agent.write("kv", (peer.name, "kv"), (src[60:], dst[60:]), path="staged")
        t1.wait(timeout=30)
        t2.wait(timeout=30)
        got = []
        end = time.monotonic() + 10
        while len(got) < 2 and time.monotonic() < end:
            got += peer.call("arrivals", 1)
        assert sorted(a[2] for a in got) == ["staged", "staged"]
        for d, g in zip(data, peer.call("get", "kv")):
            want = np.full(g.shape, POISON, np.uint8)
            want[dst] = d[src]
            np.testing.assert_array_equal(g, want)
        drive(agent, until=lambda: agent._pools["kv"].send.free.all())
        assert peer.call("state", "kv") == (128, 0, 0)
    finally:
        peer.stop(agent)


def test_disagg_prefill_example_without_a_gpu_exits_3():
    """Like every example, without a GPU it says so in one line and exits with status 3."""
    from cupy_swap.tools.remote_bench import _gpu_reason

    if _gpu_reason() is None:
        pytest.skip("a GPU answers here")
    out = subprocess.run(
        [sys.executable, os.path.join(ROOT, "examples", "disagg_prefill.py")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 3, out.stdout + out.stderr
    assert out.stdout.startswith("disagg_prefill: needs a GPU") and "--host-only" in out.stdout
