"""The sender's side of staged writes.  Invariant: a staged write is done
only once the receiver's ``SCATTERED`` came for this very transfer, from
the incarnation it was posted to (a grant, a refusal or an
acknowledgement counts only for the ``_sent`` entry whose id, peer and
incarnation it names); the send slots it gathered into are its own from
its gather until its bytes left (or, failed, until its gather finished);
and once nothing of a failed, refused or closed one can land any more, its
receiver is told (``CANCEL``) unless it acknowledged, so its slots there
come back before the receiver's deadline.

A staged write gathers the mapping's source blocks into free slots of the
pool's *send* run (waiting, bounded by ``staged_timeout``, for room, with
the lock held only for each try), asks the receiver for slots of its
receive run (``REQUEST``), and once they are granted posts each chunk of
about ``staged_chunk_bytes`` as soon as its own gather finished.
Deadlines (``peer_timeout``): the wait for the grant and for the
acknowledgement; NIXL requests that move nothing have theirs in
:class:`Transfer`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from . import wire
from .errors import PoolDroppedError, RemoteError, TransferError
from .handle import Transfer
from .lock import Pauses
from .mapping import descriptor_indices

__all__ = ["Sent", "StagedMixin", "StagedWrite"]


@dataclass(eq=False)
class Sent:
    """A staged write of this agent, from its request to the receiver's answer."""

    peer: str
    peer_incarnation: int
    pool: str
    pool_uid: int
    n: int
    deadline: float | None = None  # of the wait for the grant, then for the acknowledgement
    offset: int | None = None  # granted slots of the receiver's receive run
    scattered: bool = False
    final: bool = False  # acknowledged: the receiver forgot it, no CANCEL needed (a refusal still is
    # followed by CANCEL once nothing can land: the receiver may hold the slots until then)
    error: str | None = None


class StagedMixin:
    """The sender's side of staged writes (part of :class:`RemoteAgent`).

    Owns ``_sent``: this agent's staged writes not yet answered, by transfer id.
    """

    def _init_staged(self) -> None:
        self._sent: dict[int, Sent] = {}

    def _write_staged(self, pool, peer, rpool, src, dst, stream, timeout) -> Transfer:
        """Wait (bounded by ``timeout``, holding the lock only for each try) for
        n free slots of the pool's send run, then start the staged write."""
        n = src.size
        room = min(pool.layout.staging_blocks, rpool.staging_blocks)
        if pool.stager is None or not rpool.staging_blocks:
            side = "local pool" if pool.stager is None else f"peer {peer.name!r}'s pool"
            raise RemoteError(
                f"write(path='staged'): {side} has no staging run; register it with staging_blocks=N"
            )
        if n > room:
            raise ValueError(
                f"write(path='staged'): {n} blocks exceed the staging runs ({room} slots); split the mapping"
            )
        what = f"write {pool.layout.name} -> {peer.name}/{rpool.name} ({n} blocks, staged)"
        if not n:
            return Transfer(self.nixl, what, 0, 0, None)
        pauses = Pauses()
        while True:
            with self._lock:
                self._check_still(pool, peer, rpool, what)
                remote_dlist = self._remote_dlist(peer, rpool, True)
                send_at = pool.send.take(n)
                if send_at is not None:
                    return self._start_staged(
                        pool, peer, rpool, src, dst, stream, send_at, remote_dlist, what
                    )
                self._drive()  # earlier staged writes from this pool leave, or fail
            if pauses.elapsed() > timeout:
                raise TransferError(
                    f"write(path='staged'): no {n} free slots in the send run of {pool.layout.name!r} after "
                    f"{timeout} s: earlier staged writes from it have not left (are their receivers alive "
                    "and calling poll()?)"
                )
            pauses.sleep()  # without the lock: other threads poll, wait and write meanwhile

    def _check_still(self, pool, peer, rpool, what: str) -> None:
        """Refuse to start a write whose pool was dropped, or whose peer was
        disconnected or refreshed, while it waited without the lock."""
        if self._pools.get(pool.layout.name) is not pool:
            raise RemoteError(f"{what}: the local pool was dropped while it waited for send slots")
        if self._peers.get(peer.name) is not peer:
            raise RemoteError(
                f"{what}: peer {peer.name!r} was disconnected or connected again while it waited for send "
                "slots; nothing was posted"
            )
        if rpool.name in peer.dropped:
            raise PoolDroppedError(f"{what}: peer {peer.name!r} dropped pool {rpool.name!r}")

    def _start_staged(self, pool, peer, rpool, src, dst, stream, send_at, remote_dlist, what) -> Transfer:
        """Ask the receiver for slots, gather into send slots ``send_at..``
        (taken) while the request travels, and return the Transfer that posts
        each chunk once granted."""
        n = src.size
        block_bytes = sum(pool.layout.block_bytes)
        chunk = max(1, self.staged_chunk_bytes // block_bytes)
        xfer_id = next(self._ids)
        sent = Sent(
            peer.name, peer.incarnation, rpool.name, rpool.uid, n, time.monotonic() + self.peer_timeout
        )
        try:  # first: a host gather takes as long as a copy of the bytes, the grant's round trip meanwhile
            self.nixl.send_notif(
                peer.name, self._note(wire.REQUEST, xfer_id, rpool.name, rpool.uid, dst, peer.incarnation)
            )
        except Exception as e:
            pool.send.give(send_at, n)  # nothing was gathered into them
            raise RemoteError(
                f"{what}: could not ask peer {peer.name!r} for staging slots ({type(e).__name__}: {e}); "
                "nothing was posted"
            ) from e
        try:
            # Send slots send_at.. are this write's until it moved; chunk i is ready once gathered[i]() says so.
            gathered = pool.stager.gather(src, stream, chunk, send_at)
        except BaseException:
            try:  # the receiver may hold slots for it: nothing of it will come
                self.nixl.send_notif(
                    peer.name, self._note(wire.CANCEL, xfer_id, rpool.name, rpool.uid, (), peer.incarnation)
                )
            except Exception:  # the receiver frees them by its deadline
                pass
            if pool.layout.mem == "DRAM":  # a host gather ran in this call: nothing writes the slots now
                pool.send.give(send_at, n)
            raise
        write = StagedWrite(self, pool, peer, rpool, xfer_id, sent, send_at, gathered, chunk, remote_dlist)
        self._sent[xfer_id] = sent
        transfer = Transfer(
            self.nixl,
            what,
            n * block_bytes,
            n,
            write.post,
            write.ready,
            write.settled,
            write.forget,
            lock=self._lock,
            check=write.answered,
            timeout=self.peer_timeout,
            on_moved=write.moved,
            linger=self._linger,
        )
        return self._track(transfer, pool, peer)

    def _on_answer(self, peer_name: str, note: wire.Note) -> None:
        """``GRANT``, ``SCATTERED`` or ``NACK`` for one of this agent's staged writes."""
        kind = note.kind
        sent = self._sent.get(note.xfer_id)
        if sent is None or sent.peer != peer_name or sent.peer_incarnation != note.src:
            return
        if kind == wire.GRANT:
            if sent.offset is None:
                sent.offset = int(note.blocks[0])
                sent.deadline = None  # the chunks' own NIXL deadlines run now
            return
        del self._sent[note.xfer_id]  # answered: its Transfer holds the verdict
        if kind == wire.SCATTERED:
            sent.final = sent.scattered = True
        else:
            reason = int(note.blocks[0]) if note.blocks.size else 0
            why = wire.NACK_REASONS.get(reason, f"reason {reason}")
            sent.error = f"peer {peer_name!r} refused it: {why}"

    def _fail_sent_into(self, peer_name: str, pool: str, uid: int) -> None:
        """The peer dropped registration ``uid`` of ``pool``: its receive run is
        gone, so the staged writes into it fail, granted or not."""
        for sent in self._sent.values():
            if sent.peer == peer_name and sent.pool_uid == uid and sent.pool == pool and not sent.scattered:
                sent.error = sent.error or f"peer {peer_name!r} refused it: {wire.NACK_REASONS[wire.DROPPED]}"

    def _fail_sent_to(self, peer_name: str) -> None:
        """The peer was disconnected or restarted: its answers will not come."""
        for sent in self._sent.values():
            if sent.peer == peer_name and sent.error is None and not sent.scattered:
                sent.error = f"peer {peer_name!r} was disconnected (or restarted) before it answered"


class StagedWrite:
    """The steps of one staged write that its :class:`Transfer` calls:
    ``ready`` (granted), ``post`` (each chunk whose gather finished),
    ``settled`` (acknowledged), ``answered`` (refused, or past a deadline:
    raises), ``moved`` and ``forget`` (nothing of it can land any more)."""

    def __init__(self, agent, pool, peer, rpool, xfer_id, sent, send_at, gathered, chunk, remote_dlist):
        self.agent, self.pool, self.peer, self.rpool = agent, pool, peer, rpool
        self.xfer_id, self.sent, self.send_at, self.gathered = xfer_id, sent, send_at, gathered
        self.n, self.chunk, self.remote_dlist = sent.n, chunk, remote_dlist
        self.starts = list(range(0, sent.n, chunk))
        self.next_chunk = 0
        self.send_given = False
        self.timeout = agent.peer_timeout

    def give_send(self) -> None:
        """Give the send slots back once the gather finished (a GPU gather may still write them)."""
        if self.send_given:
            return
        self.send_given = True
        run, at, n, gathered = self.pool.send, self.send_at, self.n, self.gathered
        if gathered is None or all(g() for g in gathered):
            run.give(at, n)
        else:  # pragma: no cover - GPU gathers
            self.agent._later.append((lambda: all(g() for g in gathered), lambda: run.give(at, n)))

    def answered(self) -> None:
        """Drive progress; raise RemoteError once refused, disconnected, or past a deadline."""
        sent = self.sent
        if sent.error is None and not sent.scattered:
            if sent.offset is None:  # its grant may wait for this agent's earlier writes to move
                self.agent._drive()
            else:
                self.agent._progress()
        if sent.error is None and not sent.scattered and sent.deadline is not None:
            if time.monotonic() > sent.deadline:
                step = "grant its slots" if sent.offset is None else "acknowledge the scatter"
                sent.error = (
                    f"peer {self.peer.name!r} did not {step} within {self.timeout} s (peer_timeout): it may "
                    "have died, hung, or stopped calling poll()"
                )
        if sent.error is not None:
            raise RemoteError(sent.error)

    def ready(self) -> bool:
        self.answered()
        return self.sent.offset is not None

    def post(self, track) -> bool:
        """Post the chunks whose gather finished, in order (each note says
        where it starts); True once all are posted."""
        agent, pool, rpool, sent = self.agent, self.pool, self.rpool, self.sent
        parts = len(pool.layout.parts)
        while self.next_chunk < len(self.starts) and (
            self.gathered is None or self.gathered[self.next_chunk]()
        ):
            self.answered()  # refused or disconnected meanwhile: post no more
            a = self.starts[self.next_chunk]
            b = min(a + self.chunk, self.n)
            sends = np.arange(self.send_at + a, self.send_at + b, dtype=np.int64)
            lidx = descriptor_indices(sends, parts, pool.layout.staging_blocks)
            slots = np.arange(sent.offset + a, sent.offset + b, dtype=np.int64)
            ridx = descriptor_indices(slots, parts, rpool.staging_blocks)
            note = agent._note(
                wire.STAGED, self.xfer_id, rpool.name, rpool.uid, [a, b - a], self.peer.incarnation
            )
            xfer = agent.nixl.make_prepped_xfer("WRITE", pool.send_dlist, lidx, self.remote_dlist, ridx, note)
            track(xfer)
            self.next_chunk += 1
            agent.nixl.transfer(xfer)
        if self.next_chunk < len(self.starts):
            self.answered()  # a refusal may come while chunks wait for their gather
        return self.next_chunk == len(self.starts)

    def settled(self) -> bool:
        sent = self.sent
        if sent.deadline is None and not sent.scattered and sent.error is None:
            sent.deadline = time.monotonic() + self.timeout  # the wait for the acknowledgement starts
        self.answered()
        return sent.scattered

    def moved(self) -> None:
        self.sent.deadline = None  # settled() starts the acknowledgement's clock
        self.give_send()

    def forget(self) -> None:
        """Failed, refused or closed, and nothing of it can land any more."""
        agent, sent = self.agent, self.sent
        agent._sent.pop(self.xfer_id, None)
        if not sent.final:  # the receiver may still hold its request or grant: let it go
            note = agent._note(
                wire.CANCEL, self.xfer_id, self.rpool.name, self.rpool.uid, (), self.peer.incarnation
            )
            try:
                agent.nixl.send_notif(self.peer.name, note)
            except Exception:  # a dead peer frees them by its deadline, or when it is disconnected
                pass
        self.give_send()
