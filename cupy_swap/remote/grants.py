"""The receiver's side of staged writes: grants of its receive runs.
Invariant: a slot of a receive run belongs to at most one grant at a time,
and a grant's slots go back to the run only once nothing of its sender can
land in them any more: every chunk scattered (the write completed), or,
for a failed grant, no scatter of it running and either its sender
confirmed (``CANCEL``), its sender's process is gone (a new incarnation
connected), or its release deadline passed.  Every request ends in exactly
one :class:`Arrival` (``"staged"`` or ``"failed"``) and one answer to its
sender (``SCATTERED`` or ``NACK``, or nothing when the sender itself gave
it up).

A pool registered with ``staging_blocks=S`` gets a *receive* run of S slots
that every sender shares through receiver-granted credits: a staged write
first asks for slots for its destination blocks (``REQUEST``, naming the
pool's registration), the receiver grants a free range (``GRANT``, first
fit, in arrival order), the sender writes that range in chunks, the
receiver scatters each chunk as it lands and, once all are in place, frees
the range (``SCATTERED``).  Deadlines (``peer_timeout``): a request waits
that long for room, a grant that long for each next chunk; past it the
grant fails (``NACK``, an Arrival of kind ``"failed"``) and its slots are
freed one more ``peer_timeout`` later, or on the sender's ``CANCEL``.

A dropped pool (``drop_pool``, ``close()``) is held to the same rule: its
receive run stays registered and alive (in ``_dropped``) while a grant of
it is live, since a granted sender's chunks may still be on the wire (over
UCX's TCP transport they land only when this agent progresses); its
grants fail as a disconnect's do, and the run is deregistered once the
last one ended.
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass

import numpy as np

from ..cuda import release
from . import wire
from .notes import Arrival

__all__ = ["Run", "Grant", "ReceiveRun", "GrantsMixin"]


class Run:
    """Free slots of a staging run (first fit over contiguous ranges)."""

    def __init__(self, count: int):
        self.free = np.ones(count, dtype=bool)

    def take(self, n: int) -> int | None:
        edges = np.diff(np.concatenate(([0], self.free.view(np.int8), [0])))
        starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
        fits = np.flatnonzero(ends - starts >= n)
        if not fits.size:
            return None
        offset = int(starts[fits[0]])
        self.free[offset : offset + n] = False
        return offset

    def give(self, offset: int, n: int) -> None:
        self.free[offset : offset + n] = True


@dataclass(eq=False)
class Grant:
    """A staged write into this agent's pool, from its request to its end.

    ``offset`` is None while it waits for room.  ``deadline``: when the next
    chunk (or the grant) must have come; None once every chunk landed.
    ``failed``: refused, expired, cancelled or its peer gone; its slots are
    freed once ``release_at`` passed and no scatter of it runs."""

    key: tuple  # (peer, incarnation, xfer_id)
    pool: str
    uid: int  # the pool's registration
    dst: np.ndarray  # the destination blocks the request named
    deadline: float | None
    offset: int | None = None
    noted: int = 0
    scattered: int = 0
    inflight: int = 0  # GPU scatters of it still running
    covered: np.ndarray | None = None
    failed: bool = False
    release_at: float | None = None

    @property
    def n(self) -> int:
        return int(self.dst.size)


class ReceiveRun:
    """The receive run of a pool: its free slots, grants and waiting requests."""

    def __init__(self, count: int):
        self.run = Run(count)
        self.grants: dict = {}  # key -> Grant holding slots
        self.queue: collections.deque = collections.deque()  # Grant waiting for room, in arrival order

    @property
    def free(self) -> np.ndarray:
        return self.run.free


class GrantsMixin:
    """The receiver's side of staged writes (part of :class:`RemoteAgent`).

    Owns each pool's ``slots`` (:class:`ReceiveRun`), ``_scattering``
    (GPU scatters not finished yet: ``(event, pool, grant, count)``) and
    ``_dropped`` (registration uid -> dropped pool whose receive run a live
    grant may still write).
    """

    def _init_grants(self) -> None:
        self._scattering: list = []
        self._dropped: dict = {}

    def _runs(self) -> list:
        """The pools with a receive run: registered ones, and dropped ones a grant still holds."""
        return [p for p in [*self._pools.values(), *self._dropped.values()] if p.slots is not None]

    def _registration(self, name: str, uid: int):
        """The pool of registration ``uid`` of ``name``: registered, or dropped and still held."""
        pool = self._pools.get(name)
        if pool is None or pool.layout.uid != uid:
            pool = self._dropped.get(uid)
        return pool if pool is not None and pool.layout.name == name else None

    def _refuse_grants(self, pool) -> bool:
        """The pool is dropped: fail what waits or is granted (each records its
        blocks as failed, its sender is told); nothing is granted for it any
        more.  Granted slots wait, as after a disconnect, for the sender's
        ``CANCEL`` or one ``peer_timeout``: True when one does, and the pool's
        receive run is then kept (``_dropped``) until the last is freed."""
        if pool.slots is None:
            return False
        for grant in pool.slots.queue:  # never granted: nothing of it can land
            self._record_failed(grant, "the pool was dropped")
            self._nack(grant.key, pool.layout.name, grant.uid, wire.DROPPED)
        pool.slots.queue.clear()
        release_at = time.monotonic() + self.peer_timeout
        for grant in list(pool.slots.grants.values()):
            self._end_grant(pool, grant, "the pool was dropped", wire.DROPPED, release_at)
        if pool.slots.grants:
            self._dropped[pool.layout.uid] = pool
        return bool(pool.slots.grants)

    def _fail_grants_of(self, peer: str, incarnation: int, how: str) -> None:
        """Fail what ``(peer, incarnation)`` waits for or was granted here
        (``how``: ``"restart"``, its process is gone; ``"disconnect"``, it
        lives: it is told, and its slots wait for its ``CANCEL`` or one
        ``peer_timeout``, since a chunk it posted may still land)."""
        why = "its sender was disconnected" if how == "disconnect" else "its sender restarted"
        release_at = time.monotonic() + self.peer_timeout if how == "disconnect" else 0.0
        reason = wire.DISCONNECTED if how == "disconnect" else None
        for pool in self._runs():
            for grant in [g for g in pool.slots.queue if g.key[:2] == (peer, incarnation)]:
                pool.slots.queue.remove(grant)  # never granted: nothing of it can land
                self._record_failed(grant, why)
                if reason is not None:
                    self._nack(grant.key, grant.pool, grant.uid, reason)
            for grant in [g for k, g in pool.slots.grants.items() if k[:2] == (peer, incarnation)]:
                self._end_grant(pool, grant, why, reason, release_at)
            self._grant(pool)

    def _end_grant(self, pool, grant: Grant, why: str, reason: int | None, release_at: float) -> None:
        """Fail a granted write (recorded, its sender told ``reason`` unless
        None); its slots are freed by ``release_at`` at the latest, at once
        when every chunk landed, and never under a running scatter."""
        if not grant.failed:
            self._record_failed(grant, why)
            if reason is not None:
                self._nack(grant.key, grant.pool, grant.uid, reason)
        grant.failed = True
        if grant.noted == grant.n:  # every chunk landed: none is left to come
            grant.release_at = 0.0
        elif grant.release_at is None or grant.release_at > release_at:
            grant.release_at = release_at
        self._maybe_release(pool, grant)

    def _finish_scatters(self) -> None:
        """Count the GPU scatters whose event completed (CPU tests stand one in)."""
        if not self._scattering:
            return
        scattering, self._scattering, still = self._scattering, [], []
        for entry in scattering:
            if entry[0].done:
                entry[2].inflight -= 1
                self._scattered(*entry[1:])
            else:
                still.append(entry)
        self._scattering = still + self._scattering

    def _expire(self, now: float) -> None:
        """Fail the grants whose next chunk is late and the requests that
        waited for room past the deadline; free failed grants' slots once
        nothing of them can land."""
        for pool in self._runs():
            slots = pool.slots
            if not (slots.grants or slots.queue):
                continue
            for grant in [g for g in slots.queue if g.deadline is not None and now > g.deadline]:
                slots.queue.remove(grant)  # never granted: nothing of it can land
                self._record_failed(grant, f"no room for it within {self.peer_timeout} s (peer_timeout)")
                self._nack(grant.key, pool.layout.name, grant.uid, wire.EXPIRED)
            for grant in list(slots.grants.values()):
                if not grant.failed and grant.deadline is not None and now > grant.deadline:
                    self._fail_grant(pool, grant, wire.EXPIRED, f"no chunk within {self.peer_timeout} s")
                elif grant.failed:
                    self._maybe_release(pool, grant)
            self._grant(pool)

    def _on_cancel(self, peer_name: str, note: wire.Note) -> None:
        """The sender says nothing of this transfer can land any more: fail
        what waited, free its granted slots (once no scatter of it runs)."""
        pool = self._registration(note.pool, note.uid)
        if pool is None or pool.slots is None:
            return
        key = (peer_name, note.src, note.xfer_id)
        for grant in [g for g in pool.slots.queue if g.key == key]:
            pool.slots.queue.remove(grant)
            self._record_failed(grant, "the sender gave it up")
        grant = pool.slots.grants.get(key)
        if grant is not None and not (grant.noted == grant.n and not grant.failed):  # else it completes
            if not grant.failed:
                self._record_failed(grant, "the sender gave it up")
            grant.failed, grant.release_at = True, 0.0
            self._maybe_release(pool, grant)
        self._grant(pool)

    def _on_request(self, peer_name: str, note: wire.Note) -> None:
        """A sender asks for slots of a pool's receive run: queue it, grant what fits, or refuse it."""
        pool = self._pools.get(note.pool)
        key = (peer_name, note.src, note.xfer_id)
        uid = note.uid
        dst = note.blocks.astype(np.int64)
        if pool is None or pool.slots is None:
            self._nack(key, note.pool, note.uid, wire.NO_STAGING)
            return
        if pool.layout.uid != uid:  # asked of a pool of that name that was dropped since
            self._nack(key, note.pool, note.uid, wire.DROPPED)
            return
        if not 0 < dst.size <= pool.slots.free.size:
            self._nack(key, note.pool, note.uid, wire.TOO_MANY)
            return
        nb = pool.layout.num_blocks
        if key in pool.slots.grants or any(g.key == key for g in pool.slots.queue):
            self._warn(f"a repeated request {key[2]} from {key[0]!r} was ignored")
            return
        if dst.min() < 0 or dst.max() >= nb or np.unique(dst).size != dst.size:
            self._nack(key, note.pool, note.uid, wire.BAD_BLOCKS)
            return
        grant = Grant(key, note.pool, uid, dst, time.monotonic() + self.peer_timeout)
        pool.slots.queue.append(grant)
        self._grant(pool)

    def _on_chunk(self, peer_name: str, note: wire.Note) -> None:
        """A chunk of a granted write landed: scatter it (or refuse it)."""
        pool = self._registration(note.pool, note.uid)  # dropped since: only its failed grants are left
        key = (peer_name, note.src, note.xfer_id)
        grant = None if pool is None or pool.slots is None else pool.slots.grants.get(key)
        if grant is None:
            self._nack(key, note.pool, note.uid, wire.NO_GRANT)
            self._warn(f"staged arrival {key[2]} from {key[0]!r} into {note.pool!r}: no slots granted")
            return
        if grant.failed:
            return
        start, count = (int(note.blocks[0]), int(note.blocks[1])) if note.blocks.size == 2 else (-1, 0)
        if grant.covered is None:
            grant.covered = np.zeros(grant.n, dtype=bool)
        if start < 0 or count < 1 or start + count > grant.n:
            self._fail_grant(
                pool,
                grant,
                wire.BAD_BLOCKS,
                f"a chunk of {count} blocks at slot {start}, {grant.n} slots granted",
            )
            return
        if grant.covered[start : start + count].any():
            self._fail_grant(
                pool, grant, wire.BAD_BLOCKS, f"a chunk at slot {start} claims slots an earlier chunk claimed"
            )
            return
        grant.covered[start : start + count] = True
        grant.noted += count
        grant.deadline = None if grant.noted == grant.n else time.monotonic() + self.peer_timeout
        dst = grant.dst[start : start + count]
        event = pool.stager.scatter(dst, grant.offset + start)
        if event is None:
            self._scattered(pool, grant, count)
        else:  # pragma: no cover - GPU scatter, counted once its event finished
            grant.inflight += 1
            self._scattering.append((event, pool, grant, count))

    def _fail_grant(self, pool, grant: Grant, reason: int, why: str) -> None:
        """Refuse a granted write: tell the sender, record its blocks as failed;
        its slots are freed one ``peer_timeout`` later (the sender's own
        deadline has stopped its chunks by then) or when it cancels."""
        grant.failed = True
        grant.release_at = time.monotonic() + self.peer_timeout
        self._nack(grant.key, pool.layout.name, grant.uid, reason)
        self._record_failed(grant, f"{wire.NACK_REASONS[reason]} ({why})")
        self._warn(
            f"staged write {grant.key[2]} from {grant.key[0]!r} into {pool.layout.name!r} failed: {why}"
        )

    def _maybe_release(self, pool, grant: Grant) -> None:
        slots = pool.slots
        if slots is None or slots.grants.get(grant.key) is not grant:
            return
        if grant.inflight or grant.release_at is None or time.monotonic() < grant.release_at:
            return
        del slots.grants[grant.key]
        slots.run.give(grant.offset, grant.n)
        if not slots.grants and self._dropped.get(pool.layout.uid) is pool:  # nothing can land in it now
            try:
                self.nixl.deregister_memory(pool.regs[-1])  # the staging runs' registration, then the memory
            except Exception as e:  # said, not raised: this runs inside whichever call progressed the agent
                release.keep_for_process(pool)  # may still be registered: never freed
                self._warn(
                    f"dropped pool {pool.layout.name!r}: deregistration failed ({type(e).__name__}: {e})"
                )
            finally:
                del self._dropped[pool.layout.uid]

    def _record_failed(self, grant: Grant, why: str) -> None:
        peer, inc, xfer_id = grant.key
        self._arrivals.append(
            Arrival(peer, grant.pool, "failed", grant.dst.astype(np.int32), xfer_id, inc, why, grant.uid)
        )

    def _scattered(self, pool, grant: Grant, count: int) -> None:
        """``count`` more blocks of a staged write are in place: once all are,
        free its slots, acknowledge it and grant waiting requests."""
        slots = pool.slots
        if slots is None or slots.grants.get(grant.key) is not grant:  # the pool was dropped meanwhile
            return
        grant.scattered += count
        if grant.failed:
            self._maybe_release(pool, grant)
            self._grant(pool)
            return
        if grant.scattered < grant.n:
            return
        del slots.grants[grant.key]
        slots.run.give(grant.offset, grant.n)
        peer, inc, xfer_id = grant.key
        dst = grant.dst.astype(np.int32)
        self._ack(Arrival(peer, pool.layout.name, "staged", dst, xfer_id, inc, registration=grant.uid))
        self._grant(pool)

    def _grant(self, pool) -> None:
        """Grant slots to the waiting requests, in arrival order, while they fit."""
        slots = pool.slots
        while slots is not None and slots.queue:
            grant = slots.queue[0]
            offset = slots.run.take(grant.n)
            if offset is None:
                return
            slots.queue.popleft()
            grant.offset, grant.deadline = offset, time.monotonic() + self.peer_timeout
            slots.grants[grant.key] = grant
            peer, inc, xfer_id = grant.key
            try:
                self.nixl.send_notif(
                    peer, self._note(wire.GRANT, xfer_id, pool.layout.name, pool.layout.uid, [offset], inc)
                )
            except Exception as e:
                del slots.grants[grant.key]
                slots.run.give(offset, grant.n)
                self._record_failed(grant, "its grant could not be sent")
                self._warn(
                    f"could not grant staging slots to {peer!r} ({type(e).__name__}: {e}); is it "
                    "connected (connect() its metadata) and alive?"
                )

    def _nack(self, key, pool: str, uid: int, reason: int) -> None:
        peer, inc, xfer_id = key
        try:
            self.nixl.send_notif(peer, self._note(wire.NACK, xfer_id, pool, uid, [reason], inc))
        except Exception as e:
            self._warn(f"could not refuse staged write {xfer_id} of {peer!r} ({type(e).__name__}: {e})")

    def _ack(self, arrival: Arrival) -> None:
        self._arrivals.append(arrival)  # the blocks are in place, whether the sender hears of it or not
        try:
            self.nixl.send_notif(
                arrival.peer,
                self._note(
                    wire.SCATTERED,
                    arrival.xfer_id,
                    arrival.pool,
                    arrival.registration,
                    (),
                    arrival.incarnation,
                ),
            )
        except Exception as e:
            self._warn(
                f"could not acknowledge staged write {arrival.xfer_id} of {arrival.peer!r} "
                f"({type(e).__name__}: {e}); is it connected and alive?"
            )
