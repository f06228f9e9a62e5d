"""Peers and their incarnations.  Invariant: ``_peers[name]`` is the one
view this agent holds of a peer (its incarnation, pools and prepared
descriptor lists), and it is replaced or forgotten only once no transfer
that uses it has NIXL requests in flight or may still post; every
incarnation it replaced (a restarted process under the same name) or
disconnected is *retired* for at least one ``peer_timeout`` (the deadline
of everything it had under way here): notes from it are refused and
counted against nothing, except ``CANCEL``, which can only free what it
held.  Retirements older than that are forgotten as the next one is
recorded, so ``_retired`` holds only those of the last ``peer_timeout``;
a forgotten incarnation's note is then handled as one from a peer this
agent never connected.

Every agent draws a random nonce when it starts (its *incarnation*),
exports it in its metadata and puts both sides' in every note, so grants,
landings and scatters are keyed by ``(peer, incarnation, transfer id)``.
Connecting a restarted peer fails what this agent still waited for from
the old one and frees the slots the old one held once nothing of it can
land (its scatters finished); disconnecting a live one tells it, and keeps
its slots until it confirms or the deadline passed (``grants.py``).
Descriptors of a peer's pools are prepared once, at first use, and
released with the view.
"""

from __future__ import annotations

import time
import weakref
from dataclasses import dataclass, field

from . import wire
from .errors import PoolDroppedError, RemoteError
from .layout import PoolLayout, check_pairable
from .lock import locked

__all__ = ["Peer", "PeersMixin"]


@dataclass(eq=False)
class Peer:
    """This agent's view of a connected peer (one incarnation of it)."""

    name: str
    incarnation: int
    pools: dict
    blob: bytes = b""  # the metadata connect() took (a refresh with the same bytes does nothing)
    dlists: dict = field(default_factory=dict)  # (pool, staging?) -> prepared remote dlist
    dropped: set = field(default_factory=set)
    paired: dict = field(default_factory=dict)  # (id(local), id(remote layout)) -> both, until drop_pool
    transfers: weakref.WeakSet = field(default_factory=weakref.WeakSet)


class PeersMixin:
    """Peers and incarnations (part of :class:`RemoteAgent`).

    Owns ``_peers`` (name -> :class:`Peer`) and ``_retired`` (``(name,
    incarnation)`` replaced by a later ``connect()`` or disconnected -> when
    it may be forgotten).
    """

    def _init_peers(self) -> None:
        self._peers: dict[str, Peer] = {}
        self._retired: dict = {}

    @locked
    def metadata(self) -> bytes:
        """This agent's metadata (NIXL's, the pools' layouts, its incarnation) as bytes.

        Whoever holds these bytes can read and write the registered pools,
        and learns their virtual addresses and sizes: carry them only to
        peers you trust.  Export again after registering or dropping pools.
        """
        return wire.pack_metadata(self.name, self.pools(), self.nixl.get_agent_metadata(), self.incarnation)

    @locked
    def connect(self, blob: bytes) -> str:
        """Import a peer's :meth:`metadata` and prepare its pools' descriptors.

        Connecting again with the same bytes does nothing.  NIXL 1.5.1
        leaves two sockets open each time an agent is removed and added
        again: 200 ``remove_remote_agent`` + ``add_remote_agent`` of one
        peer took a process from 14 to 414 open sockets (2-core CPU,
        loopback; ``benchmarks/NOTES.md``, item 59), so each refresh with
        *changed* metadata, and each disconnect and reconnect, still costs
        two.

        Connecting again with newer metadata replaces the old view of that
        peer, once nothing uses it: transfers to the peer that still have
        NIXL requests in flight or may post (a staged write waiting for its
        grant, a GPU write waiting for its stream) make it refuse, unless the
        metadata is a new incarnation (the peer restarted): then those not
        yet posted fail ("restarted"), what the old incarnation held here
        (grants, waiting requests) is freed once nothing of it can land, and
        only transfers with requests in flight make it refuse.

        Returns
        -------
        str
            The peer's agent name.

        Raises
        ------
        LayoutMismatchError
            A pool of the same name on both sides differs in part count or
            block bytes (checked here, before any transfer).
        RemoteError
            Transfers to this peer are in flight (see above).
        """
        blob = bytes(blob)
        name, pools, nixl_md, incarnation = wire.unpack_metadata(blob)
        for pool_name, remote in pools.items():
            if pool_name in self._pools:
                check_pairable(self._pools[pool_name].layout, remote, name)
        old = self._peers.get(name)
        if old is not None and old.blob == blob:  # unchanged: the view held is this one
            return name
        if old is not None:
            restarted = old.incarnation != incarnation
            if restarted:
                self._abort_unposted(old.transfers, f"peer {name!r} restarted (a new incarnation connected)")
            self._refuse_busy(
                old.transfers,
                "connect",
                f"to peer {name!r}",
                "wait for them or close() them before connecting its new metadata (their descriptors "
                "are the old view's)",
                are="are still",
            )
            self._drop_peer(name, "restart" if restarted else "refresh")
        added = self.nixl.add_remote_agent(nixl_md)
        added = added.decode() if isinstance(added, bytes) else added
        if added != name:
            raise RemoteError(f"connect: metadata names agent {name!r} but NIXL loaded {added!r}")
        self._retired.pop((name, incarnation), None)
        self._peers[name] = Peer(name, incarnation, pools, blob)
        self.nixl.make_connection(name)  # UCX wire-up now, not inside the first transfer
        return name

    @locked
    def disconnect(self, peer: str) -> None:
        """Forget a peer: fail this agent's transfers to it that have not
        been posted and its staged writes still waiting for an answer,
        release its prepared descriptors and its NIXL metadata.  Its staged
        writes into this agent's pools fail (their blocks are recorded as
        failed) and it is told so; the receive slots granted to it are not
        granted again until it confirmed that nothing of them can land any
        more (``CANCEL``, which this agent still accepts from it) or one
        ``peer_timeout`` passed, so a chunk it posted late never lands in
        slots that another sender's write holds.  Quiesce first: a direct
        write of it still in flight may land.

        Raises
        ------
        RemoteError
            A transfer to it still has NIXL requests in flight (wait or close it first).
        """
        p = self._peer(peer)
        self._abort_unposted(p.transfers, f"peer {peer!r} was disconnected")
        self._refuse_busy(p.transfers, "disconnect", f"to peer {peer!r}")
        self._drop_peer(peer, "disconnect")

    def _drop_peer(self, peer: str, how: str) -> None:
        """Forget the view of ``peer`` (``how``: ``"refresh"``, same
        incarnation; ``"restart"``, a new incarnation connected;
        ``"disconnect"``).  After a restart or a disconnect its incarnation
        is retired and what it held here is failed; the slots it was granted
        are freed once nothing of it can land: at once after a restart (the
        old process is gone) when no scatter of it runs, and after a
        disconnect (the peer lives and may still post a chunk) only when it
        confirms (``CANCEL``) or one ``peer_timeout`` passed.  It is told
        (``NACK``) before NIXL forgets it."""
        p = self._peers.pop(peer)
        for handle in p.dlists.values():
            handle.release()
        if how != "refresh":
            now = time.monotonic()
            self._retired = {k: t for k, t in self._retired.items() if t > now}
            self._retired[(peer, p.incarnation)] = now + self.peer_timeout
            self._fail_grants_of(peer, p.incarnation, how)  # grants.py; told before NIXL forgets it
            self._fail_sent_to(peer)  # staged.py
        try:
            self.nixl.remove_remote_agent(peer)
        except Exception:  # already gone
            pass

    @locked
    def remote_pools(self, peer: str) -> dict:
        """``{name: PoolLayout}`` of a connected peer's pools that it has not dropped."""
        self._progress()
        p = self._peer(peer)
        return {k: v for k, v in p.pools.items() if k not in p.dropped}

    def _peer(self, peer: str) -> Peer:
        try:
            return self._peers[peer]
        except KeyError:
            raise RemoteError(
                f"not connected to a peer named {peer!r}; connect() its metadata first"
            ) from None

    def _remote_dlist(self, peer: Peer, pool: PoolLayout, staging: bool):
        key = (pool.name, staging)
        if key not in peer.dlists:
            mem = "DRAM" if staging else pool.mem
            peer.dlists[key] = self.nixl.prep_xfer_dlist(peer.name, pool.block_descs(staging), mem)
        return peer.dlists[key]

    def _pair(self, local: str, remote) -> tuple:
        try:
            pool = self._pools[local]
        except KeyError:
            raise RemoteError(f"no local pool named {local!r} (registered: {sorted(self._pools)})") from None
        peer_name, remote_name = remote
        self._progress()  # learn of dropped pools and staged answers
        peer = self._peer(peer_name)
        if remote_name in peer.dropped or remote_name not in peer.pools:
            why = "dropped" if remote_name in peer.dropped else "does not have"
            raise PoolDroppedError(
                f"peer {peer_name!r} {why} pool {remote_name!r} (it has: "
                f"{sorted(set(peer.pools) - peer.dropped)}); connect() its fresh metadata if it registered it again"
            )
        rpool = peer.pools[remote_name]
        key = (id(pool.layout), id(rpool))
        if key not in peer.paired:  # checked once per pair of layouts (both kept alive here)
            check_pairable(pool.layout, rpool, peer_name)
            peer.paired[key] = (pool.layout, rpool)
        return pool, peer, rpool

    @locked
    def prepared(self, local: str, remote, staging: bool = False) -> tuple:
        """The prepared NIXL descriptor lists a transfer between ``local`` and
        ``remote`` uses, for callers (benchmarks) that time NIXL's own calls on them.

        Returns
        -------
        tuple
            ``(local_dlist, remote_dlist, local PoolLayout, remote PoolLayout)``;
            descriptor ``p * B + b`` is block (or staging slot) ``b`` of part ``p``; with
            ``staging``, the local list is this pool's send run and the remote one the
            peer's receive run.
        """
        pool, peer, rpool = self._pair(local, remote)
        ldl = pool.send_dlist if staging else pool.dlist
        return ldl, self._remote_dlist(peer, rpool, staging), pool.layout, rpool

    def _accepts(self, peer_name: str, note: wire.Note) -> bool:
        """Whether ``note`` is for this incarnation and from one of ``peer_name``
        this agent has not retired.  Warns about a refused one, except news
        of a dropped pool (nothing to do) and a ``CANCEL`` to this
        incarnation (the caller still frees what it names)."""
        if note.dst == self.incarnation and (peer_name, note.src) not in self._retired:
            return True
        if note.kind == wire.DROP or (note.kind == wire.CANCEL and note.dst == self.incarnation):
            return False
        whom = (
            "another incarnation of this agent"
            if note.dst != self.incarnation
            else "an incarnation it replaced"
        )
        self._warn(
            f"a {wire.KIND_NAMES.get(note.kind, '?')} note from {peer_name!r} for {whom} was refused "
            "(the process restarted, or was reconnected)"
        )
        return False

    def _from_connected(self, peer_name: str, note: wire.Note) -> bool:
        """Whether ``note`` comes from the incarnation of ``peer_name`` this agent
        connected (or from a peer it never connected: its answers then fail to
        send, with a warning); warns otherwise."""
        peer = self._peers.get(peer_name)
        if peer is not None and peer.incarnation != note.src:
            self._warn(
                f"a {wire.KIND_NAMES.get(note.kind, '?')} note from an incarnation of {peer_name!r} this agent "
                "has not connected was refused; connect() its new metadata"
            )
            return False
        return True

    def _on_drop(self, peer_name: str, note: wire.Note) -> None:
        """The peer dropped registration ``note.uid`` of ``note.pool``."""
        peer = self._peers.get(peer_name)
        if peer is None or peer.incarnation != note.src:
            return
        known = peer.pools.get(note.pool)
        if known is not None and known.uid == note.uid:
            peer.dropped.add(note.pool)
        self._fail_sent_into(peer_name, note.pool, note.uid)  # staged.py: its receive run is gone
