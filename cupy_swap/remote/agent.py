"""RemoteAgent: a NIXL agent (UCX backend) that moves KV blocks between
registered pools of two processes or hosts by a ``swap()``-style mapping.

The life of a pair of agents::

    a = RemoteAgent("prefill")                   # nothing listens unless listen_port=...
    a.register_pool("kv", [k_cache, v_cache], staging_blocks=1250)
    blob = a.metadata()                          # bytes: carry them to the peer (exchange.py)
    peer = b_side.connect(blob)                  # ... and back: a.connect(b_side.metadata())
    t = a.write("kv", ("decode", "kv"), [(src, dst), ...])
    t.wait(timeout=10)
    for arrival in b_side.poll(): ...            # target: which blocks arrived (or failed)

Descriptors are prepared once: every block of a local pool when it is
registered, every block of a remote pool when its peer connects.  A call only
checks the mapping, turns it into descriptor indices and posts.  What a call
keeps of the mapping it copies before it returns.

Incarnations.  Every agent draws a random nonce when it starts (its
*incarnation*), exports it in its metadata and puts both sides' in every
note.  Grants, landings and scatters are keyed by ``(peer, incarnation,
transfer id)``; a note from an incarnation that a later ``connect()``
replaced, or addressed to another incarnation of this agent, is refused and
counted against nothing.  Connecting a restarted peer (same name, new
incarnation) fails what this agent still waited for from the old one and
frees the slots the old one held once nothing of it can land (its scatters
finished).

Deadlines (``peer_timeout``, one setting per agent).  Every wait on a peer
has one: a sender's wait for its grant and for the scatter's
acknowledgement, NIXL requests that finish nothing, a receiver's wait for the
next chunk of a granted write and a request waiting for room.  Past it the
transfer fails with :class:`TransferError` on the sender and an
:class:`Arrival` of kind ``"failed"`` on the receiver; the receiver frees
the slots one more ``peer_timeout`` later (by then the sender's own
deadline stopped it), or at once when the sender says nothing of it can land
(``CANCEL``).

Progress.  Nothing runs in the background (NIXL's progress thread is off by
default).  A GPU write is posted when the event recorded on its producing
stream has completed, and that is noticed inside :meth:`Transfer.done`,
:meth:`Transfer.wait` or :meth:`RemoteAgent.poll` (which drives every
transfer of this agent not moved yet).  Internal progress (every
``write``/``read``/``remote_pools`` call) handles notifications as they come
but keeps the :class:`Arrival` s for :meth:`poll`.

Threads.  An agent may be used from several threads: one re-entrant lock
guards its state and every NIXL call (NIXL runs with
``NIXL_THREAD_SYNC_STRICT`` too).  No wait holds it: :meth:`Transfer.wait`,
a staged write waiting for send slots and :meth:`close` waiting for NIXL
take it only for each try, so other threads use the agent between them.

Staging.  A pool registered with ``staging_blocks=S`` gets two host runs of S
slots: a *send* run, which its own staged writes gather into (first fit: a
write takes n free slots and gives them back once its bytes left), and a
*receive* run that peers write into.  The receive run is shared by every
sender through receiver-granted credits: a staged write first asks the
receiver for slots for its destination blocks (``REQUEST``, naming the
pool's registration), the receiver grants a free range (``GRANT``, first
fit, in arrival order), the sender writes that range in chunks of about
``staged_chunk_bytes`` (each posted once its gather finished), the receiver
scatters each chunk as it lands and, once all are in place, frees the range
(``SCATTERED``).  Refusals come back as ``NACK`` and fail the sender's
:class:`Transfer` with :class:`TransferError`.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import itertools
import secrets
import socket
import struct
import threading
import time
import warnings
import weakref
from dataclasses import dataclass, field

import numpy as np

from . import _nixl, wire
from .errors import PoolDroppedError, RemoteError, TransferError
from .handle import SPIN_S, Transfer
from .layout import PoolLayout, check_pairable, check_pool_parts, merged_spans, pool_layout
from .mapping import descriptor_indices, split_mapping
from .staging import GpuStager, HostStager, alloc_staging, gpu_bytes, host_bytes, stream_ready

__all__ = ["RemoteAgent", "Arrival", "default_path"]

DIRECT, STAGED = "direct", "staged"
# Bytes of one chunk of a staged write (benchmarks/NOTES.md, item 45).
STAGED_CHUNK_BYTES = 8 << 20
# Seconds every wait on a peer may last (RemoteAgent(peer_timeout=...)).
PEER_TIMEOUT = 30.0


@dataclass(frozen=True)
class Arrival:
    """What a peer did to one of this agent's pools, learned from a notification.

    Attributes
    ----------
    peer : str
    pool : str
    kind : str
        ``"write"`` (direct; the bytes are in place), ``"staged"`` (scattered
        from staging into place before it is reported), ``"read"`` (the
        peer read these blocks: they may be reused) or ``"failed"`` (a write
        into these blocks failed or was given up: they hold undefined bytes;
        recompute them or ask again; ``reason`` says why).  A direct write's
        failure is recorded only when its sender lives to say so; a staged
        one's always (the receiver knows its blocks from the request).
    blocks : numpy.ndarray of shape (N,), int32
        Blocks of ``pool`` written (or read, or failed), in mapping order.
    xfer_id : int
        The sender's transfer number.
    incarnation : int
        The sending process's incarnation (a nonce per process).
    reason : str
        Why it failed (``"failed"`` only).
    registration : int
        Which registration of ``pool`` the blocks are in: the ``uid`` of the
        :class:`PoolLayout` that :meth:`RemoteAgent.register_pool` returned.
        A note for a registration dropped since is not reported at all.
    """

    peer: str
    pool: str
    kind: str
    blocks: np.ndarray
    xfer_id: int
    incarnation: int = 0
    reason: str = ""
    registration: int = 0


class _Run:
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
class _Grant:
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


class _Recv:
    """The receive run of a pool: its free slots, grants and waiting requests."""

    def __init__(self, count: int):
        self.run = _Run(count)
        self.grants: dict = {}  # key -> _Grant holding slots
        self.queue: collections.deque = collections.deque()  # _Grant waiting for room, in arrival order

    @property
    def free(self) -> np.ndarray:
        return self.run.free


@dataclass(eq=False)
class _Pool:
    layout: PoolLayout  # its staging runs are the receive runs (what peers write into)
    regs: list
    dlist: object
    send_dlist: object = None  # the send runs' slots (the local side of a staged write)
    stager: object = None
    slots: _Recv | None = None
    send: _Run | None = None
    keep: list = field(default_factory=list)  # arrays whose memory is registered
    torch: bool = False
    transfers: weakref.WeakSet = field(default_factory=weakref.WeakSet)


@dataclass(eq=False)
class _Peer:
    name: str
    incarnation: int
    pools: dict
    blob: bytes = b""  # the metadata connect() took (a refresh with the same bytes does nothing)
    dlists: dict = field(default_factory=dict)  # (pool, staging?) -> prepared remote dlist
    dropped: set = field(default_factory=set)
    paired: dict = field(default_factory=dict)  # (id(local layout), id(remote layout)) -> both
    transfers: weakref.WeakSet = field(default_factory=weakref.WeakSet)


@dataclass(eq=False)
class _Sent:
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


def default_path(local: PoolLayout, remote: PoolLayout) -> str:
    """The path a ``write`` takes when none is given: ``"staged"`` when one
    pool is in GPU memory and the other in host memory and both have
    staging runs, ``"direct"`` otherwise.

    Why (``benchmarks/NOTES.md``, item 45; H200 host, two processes over
    loopback, GB/s staged against direct): GPU -> host 2.91 against 0.33
    (32 KiB x 1250) and 2.77 against 0.41 (2 MiB x 16); host -> GPU 1.92
    against 0.47 and 2.24 against 0.53.  GPU -> GPU goes direct there (UCX's
    cuda_ipc: 4.93 against 4.03, and 86 against 3.7); across hosts without
    GPUDirect RDMA it would bounce each block through host memory, where
    staging should win: not measured.  Host pools gain nothing from staging
    (3.44 against 1.81).  Pass ``path=`` to override.
    """
    if (local.mem == "VRAM") != (remote.mem == "VRAM") and local.staging and remote.staging:
        return STAGED
    return DIRECT


def _locked(method):
    """Run ``method`` holding the agent's lock (re-entrant)."""

    @functools.wraps(method)
    def run(self, *args, **kwargs):
        with self._lock:
            return method(self, *args, **kwargs)

    return run


class RemoteAgent:
    """A NIXL agent with the UCX backend and cupy_swap's block contract.

    Parameters
    ----------
    name : str
        Unique among the agents that will connect to each other.
    listen_port : int, optional
        Serve :meth:`metadata` over TCP on this port (off by default:
        metadata then travels only as bytes the application carries), to be
        read with :func:`cupy_swap.remote.fetch_from`.  NIXL's own listener
        is never started (NIXL 1.5 binds it to every interface).
    listen_host : str
        The address the metadata server binds: loopback unless you say
        otherwise (``"0.0.0.0"``: every interface).  Whoever can reach it
        gets the metadata, and with it the pools (README: what a listener
        exposes).  UCX's own TCP transport listens on an ephemeral port of
        each device in ``UCX_NET_DEVICES`` whatever this says.
    staged_chunk_bytes : int
        A staged write moves in chunks of about this many bytes (whole
        blocks, at least one): each chunk is posted once its own gather
        finished, and the receiver scatters each one as it lands, so
        gather, transfer and scatter overlap (``benchmarks/NOTES.md``, item 45).
    peer_timeout : float
        Seconds every wait on a peer may last (a grant, the next chunk, a
        NIXL request that finishes nothing, a scatter's acknowledgement);
        past it the transfer fails on both sides (module docstring).
    progress_thread : bool
        NIXL's progress thread.  Off by default: NIXL 1.5's Python API starts
        it with no delay between polls, so it keeps one core busy even when
        idle (measured: 1.87 s of CPU in 2 s idle), and on the 2-core CI
        machine two of them slowed every transfer to milliseconds.  Without
        it, :meth:`Transfer.done`/``wait`` and :meth:`poll` drive progress.
    """

    def __init__(
        self,
        name: str,
        *,
        listen_port: int | None = None,
        listen_host: str = "127.0.0.1",
        staged_chunk_bytes: int = STAGED_CHUNK_BYTES,
        peer_timeout: float = PEER_TIMEOUT,
        progress_thread: bool = False,
    ):
        if not isinstance(staged_chunk_bytes, int) or staged_chunk_bytes < 1:
            raise ValueError(f"staged_chunk_bytes: expected a positive int, got {staged_chunk_bytes!r}")
        if not isinstance(peer_timeout, (int, float)) or not peer_timeout > 0:
            raise ValueError(f"peer_timeout: expected a positive number of seconds, got {peer_timeout!r}")
        self.staged_chunk_bytes = staged_chunk_bytes
        self.peer_timeout = float(peer_timeout)
        self._lock = threading.RLock()
        self.incarnation = secrets.randbits(63) + 1  # never 0: a note without one is nobody's
        api = _nixl.api()
        sync = getattr(api, "nixl_thread_sync_t", None)
        config = api.nixl_agent_config(
            enable_prog_thread=progress_thread,
            enable_listen_thread=False,
            backends=["UCX"],
            sync_mode=None if sync is None else sync.NIXL_THREAD_SYNC_STRICT,
        )
        self.name = name
        self.nixl = api.nixl_agent(name, config)
        if "UCX" not in self.nixl.backends:
            raise RemoteError("NIXL could not start its UCX backend (see the log above)")
        self._pools: dict[str, _Pool] = {}
        self._peers: dict[str, _Peer] = {}
        self._retired: set = set()  # (peer, incarnation) replaced by a later connect() or disconnected
        self._arrivals: list[Arrival] = []
        self._scattering: list = []  # (event, pool, grant, count) of GPU scatters not finished yet
        self._sent: dict[int, _Sent] = {}  # staged writes of this agent not yet answered
        self._pending: list = []  # weak references to this agent's transfers not yet moved
        self._prune_at = 64
        self._later: list = []  # (ready(), then()) run by _progress once ready() is True
        self._next_expiry = 0.0
        self._driving = False
        self._ids = itertools.count(1)
        self._uids = itertools.count(1)
        self._server = None
        if listen_port is not None:
            self._server = _MetadataServer(self, listen_host, listen_port)

    # --- pools -----------------------------------------------------------------------------------------

    @_locked
    def register_pool(self, name: str, parts, *, staging_blocks: int = 0) -> PoolLayout:
        """Register a pool's memory with NIXL once and prepare its block descriptors.

        Parameters
        ----------
        name : str
            The name peers address it by.
        parts : array or sequence of arrays
            Each of shape ``(B, ...)``: NumPy (pinned or not), CuPy, or torch
            (CPU or CUDA); all in one memory (host, or one GPU), writeable,
            no two sharing bytes (views ``cache[:, i]`` of one block-first
            cache are fine).
        staging_blocks : int
            Slots of the staging run for the staged path (0: no staged
            transfers to or from this pool).  Allocated here, pinned when CUDA
            answers.

        Returns
        -------
        PoolLayout

        Raises
        ------
        ValueError
            A name in use, read-only parts, parts that share bytes, or a
            layout the pool cannot have.
        """
        if name in self._pools:
            raise ValueError(
                f"register_pool: a pool named {name!r} is registered already; drop_pool() it first"
            )
        seq = list(parts) if isinstance(parts, (list, tuple)) else [parts]
        check_pool_parts(name, seq)
        layout = pool_layout(name, seq)
        send = recv = ()
        if staging_blocks:
            send = [alloc_staging(staging_blocks, b) for b in layout.block_bytes]
            recv = [alloc_staging(staging_blocks, b) for b in layout.block_bytes]
            layout = pool_layout(name, seq, recv)
        layout = dataclasses.replace(layout, uid=next(self._uids))
        regs: list = []
        pool = None
        try:
            regs.append(self._register(layout.mem, layout.device, [p.span() for p in layout.parts]))
            pool = _Pool(
                layout, regs, self.nixl.prep_xfer_dlist("NIXL_INIT_AGENT", layout.block_descs(), layout.mem)
            )
            pool.keep = seq
            pool.torch = hasattr(seq[0], "data_ptr")
            if staging_blocks:
                send_layout = pool_layout(name, seq, send)
                runs = [p.span() for p in send_layout.staging] + [p.span() for p in layout.staging]
                regs.append(self._register("DRAM", 0, runs))
                pool.keep += send + recv
                pool.send_dlist = self.nixl.prep_xfer_dlist(
                    "NIXL_INIT_AGENT", send_layout.block_descs(True), "DRAM"
                )
                pool.slots = _Recv(staging_blocks)
                pool.send = _Run(staging_blocks)
                if layout.mem == "DRAM":
                    host = [host_bytes(a, p) for a, p in zip(seq, layout.parts)]
                    pool.stager = HostStager(host, send, recv)
                else:  # pragma: no cover - GPU pools: run by the GPU tests on the device
                    dev = [gpu_bytes(a, p) for a, p in zip(seq, layout.parts)]
                    pool.stager = GpuStager(dev, send, recv, layout.device, pool.torch)
        except BaseException:
            try:
                self._release_pool(pool, regs)
            except Exception as e:  # the first error is the one to see
                warnings.warn(f"cupy_swap.remote: register_pool cleanup failed: {e}", stacklevel=3)
            raise
        self._pools[name] = pool
        return layout

    def _register(self, mem: str, device: int, spans) -> object:
        # Interleaved parts of one cache cover overlapping ranges: register each byte once.
        rows = [(addr, length, device, "") for addr, length in merged_spans(spans)]
        return self.nixl.register_memory(rows, mem)

    @_locked
    def drop_pool(self, name: str) -> None:
        """Tell every connected peer that ``name`` is gone, then deregister it.

        Peers refuse later transfers to it (:class:`PoolDroppedError`) once
        the notification arrived; a direct transfer they posted before that
        may still land, so quiesce first.  Staged writes into it that are
        waiting or granted are refused (the receiver records them as
        failed); this agent's own transfers from it that have not been
        posted fail.

        Raises
        ------
        RemoteError
            A transfer from this pool still has NIXL requests in flight
            (wait for it or close it first: its descriptors are this pool's).
        """
        pool = self._pools[name]
        self._abort_unposted(pool.transfers, f"local pool {name!r} was dropped")
        busy = [t for t in pool.transfers if t._busy()]
        if busy:
            raise RemoteError(
                f"drop_pool: {len(busy)} transfer(s) from pool {name!r} are in flight ({busy[0].what}); "
                "wait for them or close() them first"
            )
        del self._pools[name]
        for peer in self._peers.values():
            try:
                self.nixl.send_notif(
                    peer.name, self._note(wire.DROP, 0, name, pool.layout.uid, (), peer.incarnation)
                )
            except Exception:  # a dead peer needs no news
                pass
        if pool.slots is not None:  # senders still waiting for slots or granted are refused
            for grant in list(pool.slots.queue) + list(pool.slots.grants.values()):
                self._nack(grant.key, name, grant.uid, wire.DROPPED)
                if not grant.failed:
                    self._record_failed(grant, "the pool was dropped")
            # Nothing is granted or acknowledged for it any more; a GPU scatter
            # still running keeps the pool (and its receive run) alive in
            # _scattering until its event completes.
            pool.slots = None
        self._release_pool(pool, pool.regs)

    def _release_pool(self, pool, regs) -> None:
        """Release what register_pool made: descriptor lists, then registrations."""
        handles = [] if pool is None else [pool.dlist, pool.send_dlist]
        for handle in handles:
            if handle is not None:
                try:
                    handle.release()
                except Exception as e:  # keep going: the memory must still be deregistered
                    warnings.warn(f"cupy_swap.remote: releasing a descriptor list failed: {e}", stacklevel=3)
        for reg in reversed(regs):
            self.nixl.deregister_memory(reg)

    @_locked
    def pools(self) -> dict:
        """``{name: PoolLayout}`` of this agent's registered pools."""
        return {k: p.layout for k, p in self._pools.items()}

    # --- peers -----------------------------------------------------------------------------------------

    @_locked
    def metadata(self) -> bytes:
        """This agent's metadata (NIXL's, the pools' layouts, its incarnation) as bytes.

        Whoever holds these bytes can read and write the registered pools,
        and learns their virtual addresses and sizes: carry them only to
        peers you trust.  Export again after registering or dropping pools.
        """
        return wire.pack_metadata(self.name, self.pools(), self.nixl.get_agent_metadata(), self.incarnation)

    @_locked
    def connect(self, blob: bytes) -> str:
        """Import a peer's :meth:`metadata` and prepare its pools' descriptors.

        Connecting again with the same bytes does nothing.  NIXL 1.5.1
        leaves two sockets open each time an agent is removed and added
        again: 200 ``remove_remote_agent`` + ``add_remote_agent`` of one
        peer took a process from 14 to 414 open sockets (2-core CPU,
        loopback; ``benchmarks/NOTES.md``, item 59), so each refresh with
        *changed* metadata, and each disconnect and reconnect, still costs
        two.  Connecting again with newer
        metadata replaces the old view of that peer, once nothing uses it: transfers to the peer that still have
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
            busy = [t for t in old.transfers if t._busy()]
            if busy:
                raise RemoteError(
                    f"connect: {len(busy)} transfer(s) to peer {name!r} are still in flight ({busy[0].what}); "
                    "wait for them or close() them before connecting its new metadata (their descriptors "
                    "are the old view's)"
                )
            self._drop_peer(name, "restart" if restarted else "refresh")
        added = self.nixl.add_remote_agent(nixl_md)
        added = added.decode() if isinstance(added, bytes) else added
        if added != name:
            raise RemoteError(f"connect: metadata names agent {name!r} but NIXL loaded {added!r}")
        self._retired.discard((name, incarnation))
        self._peers[name] = _Peer(name, incarnation, pools, blob)
        self.nixl.make_connection(name)  # UCX wire-up now, not inside the first transfer
        return name

    @_locked
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
        busy = [t for t in p.transfers if t._busy()]
        if busy:
            raise RemoteError(
                f"disconnect: {len(busy)} transfer(s) to peer {peer!r} are in flight ({busy[0].what}); "
                "wait for them or close() them first"
            )
        self._drop_peer(peer, "disconnect")

    def _abort_unposted(self, transfers, why: str) -> None:
        """Fail the transfers that posted nothing now in flight (they may not post any more)."""
        for t in list(transfers):
            if t._busy() and not t._xfers:
                t._abort(RemoteError(why))

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
            self._retired.add((peer, p.incarnation))
            why = "its sender was disconnected" if how == "disconnect" else "its sender restarted"
            release_at = time.monotonic() + self.peer_timeout if how == "disconnect" else 0.0
            for pool in self._pools.values():
                if pool.slots is None:
                    continue
                for grant in [g for g in pool.slots.queue if g.key[:2] == (peer, p.incarnation)]:
                    pool.slots.queue.remove(grant)  # never granted: nothing of it can land
                    self._record_failed(grant, why)
                    if how == "disconnect":
                        self._nack(grant.key, grant.pool, grant.uid, wire.DISCONNECTED)
                for grant in [g for k, g in pool.slots.grants.items() if k[:2] == (peer, p.incarnation)]:
                    if not grant.failed:
                        self._record_failed(grant, why)
                        if how == "disconnect":
                            self._nack(grant.key, grant.pool, grant.uid, wire.DISCONNECTED)
                    grant.failed = True
                    if grant.noted == grant.n:  # every chunk landed: none is left to come
                        grant.release_at = 0.0
                    elif grant.release_at is None or grant.release_at > release_at:
                        grant.release_at = release_at
                    self._maybe_release(pool, grant)
                self._grant(pool)
            for sent in self._sent.values():
                if sent.peer == peer and sent.error is None and not sent.scattered:
                    sent.error = f"peer {peer!r} was disconnected (or restarted) before it answered"
        try:
            self.nixl.remove_remote_agent(peer)
        except Exception:  # already gone
            pass

    @_locked
    def remote_pools(self, peer: str) -> dict:
        """``{name: PoolLayout}`` of a connected peer's pools that it has not dropped."""
        self._progress()
        p = self._peer(peer)
        return {k: v for k, v in p.pools.items() if k not in p.dropped}

    def _peer(self, peer: str) -> _Peer:
        try:
            return self._peers[peer]
        except KeyError:
            raise RemoteError(
                f"not connected to a peer named {peer!r}; connect() its metadata first"
            ) from None

    def _remote_dlist(self, peer: _Peer, pool: PoolLayout, staging: bool):
        key = (pool.name, staging)
        if key not in peer.dlists:
            mem = "DRAM" if staging else pool.mem
            peer.dlists[key] = self.nixl.prep_xfer_dlist(peer.name, pool.block_descs(staging), mem)
        return peer.dlists[key]

    def _pair(self, local: str, remote) -> tuple[_Pool, _Peer, PoolLayout]:
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

    @_locked
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

    # --- transfers -------------------------------------------------------------------------------------

    def write(
        self,
        local: str,
        remote,
        mapping,
        *,
        path: str | None = None,
        stream=None,
        notify: bool = True,
        staged_timeout: float | None = None,
    ) -> Transfer:
        """Copy blocks of a local pool into a peer's pool.

        Parameters
        ----------
        local : str
            Local pool name.
        remote : tuple (peer, pool)
            The peer's agent name and its pool's name.
        mapping : (N, 2) rows ``(local_block, remote_block)``, or ``(src_indices, dst_indices)``
            Checked before anything is posted (bounds, distinct destinations,
            shape); a refused call moves no byte.  Copied before the call
            returns: reuse its buffer at once.
        path : {None, "direct", "staged"}
            None: :func:`default_path`.  ``direct``: one descriptor per block and part.  ``staged``: gather
            into free slots of the local send run, ask the peer for slots of its receive run,
            move them there in chunks of :attr:`staged_chunk_bytes` once
            granted, the peer scatters each chunk when it :meth:`poll` s.  A
            staged write waits (driving progress) up to ``staged_timeout`` s
            (default: ``peer_timeout``) for n free slots of the send run.
        stream : cupy or torch stream, optional
            GPU pools: the data is posted only after the work queued on this
            stream (default: torch's current stream for torch pools, CuPy's
            otherwise) finished; the handle polls an event, nothing blocks, and
            the post happens inside ``done()``/``wait()``/:meth:`poll`.
        notify : bool
            Send the peer an :class:`Arrival` (direct writes; staged ones always notify).

        Returns
        -------
        Transfer
        """
        if path not in (None, DIRECT, STAGED):
            raise ValueError(f"write: path must be None, 'direct' or 'staged', got {path!r}")
        with self._lock:
            pool, peer, rpool = self._pair(local, remote)
            if path is None:
                path = default_path(pool.layout, rpool)
            src, dst = split_mapping(mapping, pool.layout.num_blocks, rpool.num_blocks, local, rpool.name)
            if path == DIRECT:
                return self._write_direct(pool, peer, rpool, src, dst, stream, notify)
        timeout = self.peer_timeout if staged_timeout is None else staged_timeout
        return self._write_staged(pool, peer, rpool, src, dst, stream, timeout)

    def _write_direct(self, pool, peer, rpool, src, dst, stream, notify) -> Transfer:
        local = pool.layout.name
        xfer_id = next(self._ids)
        note = (
            self._note(wire.WRITE, xfer_id, rpool.name, rpool.uid, dst, peer.incarnation) if notify else b""
        )
        ready = stream_ready(stream, pool.torch) if pool.layout.mem == "VRAM" and src.size else None
        what = f"write {local} -> {peer.name}/{rpool.name} ({src.size} blocks, direct)"
        on_error = None
        if notify:  # the receiver records the blocks as failed once nothing of them can land

            def on_error():
                try:
                    self.nixl.send_notif(
                        peer.name,
                        self._note(wire.ABORT, xfer_id, rpool.name, rpool.uid, dst, peer.incarnation),
                    )
                except Exception:  # a dead peer learns nothing
                    pass

        return self._post("WRITE", pool, peer, rpool, src, dst, note, ready, what, on_error)

    @_locked
    def read(self, local: str, remote, mapping, *, notify: bool = True) -> Transfer:
        """Copy blocks of a peer's pool into a local pool (direct path).

        Parameters
        ----------
        local : str
        remote : tuple (peer, pool)
        mapping : (N, 2) rows ``(remote_block, local_block)``, or ``(src_indices, dst_indices)``
            As :meth:`write`, source first; copied before the call returns.
        notify : bool
            Tell the peer which of its blocks were read (an :class:`Arrival` of kind ``"read"``).

        Returns
        -------
        Transfer
            When done, the blocks are in the local pool (GPU pools: order
            later GPU work after :meth:`Transfer.wait`).
        """
        pool, peer, rpool = self._pair(local, remote)
        src, dst = split_mapping(mapping, rpool.num_blocks, pool.layout.num_blocks, rpool.name, local)
        note = (
            self._note(wire.READ, next(self._ids), rpool.name, rpool.uid, src, peer.incarnation)
            if notify
            else b""
        )
        what = f"read {peer.name}/{rpool.name} -> {local} ({src.size} blocks)"
        return self._post("READ", pool, peer, rpool, dst, src, note, None, what, None)

    def _note(self, kind: int, xfer_id: int, pool: str, uid: int, blocks, to: int) -> bytes:
        """A note from this incarnation for incarnation ``to`` of its peer,
        about registration ``uid`` of pool ``pool`` (0: none)."""
        return wire.pack_note(kind, xfer_id, pool, blocks, self.incarnation, to, uid=uid)

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
        start = time.monotonic()
        pause = 0.0
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
            now = time.monotonic()
            if now - start > timeout:
                raise TransferError(
                    f"write(path='staged'): no {n} free slots in the send run of {pool.layout.name!r} after "
                    f"{timeout} s: earlier staged writes from it have not left (are their receivers alive "
                    "and calling poll()?)"
                )
            # Without the lock: other threads poll, wait and write meanwhile.
            time.sleep(pause)
            if now - start > SPIN_S:
                pause = min(max(pause * 2, 50e-6), 1e-3)

    def _check_still(self, pool: _Pool, peer: _Peer, rpool: PoolLayout, what: str) -> None:
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
        """Gather into send slots ``send_at..`` (taken), ask the receiver for
        slots, and return the Transfer that posts each chunk once granted."""
        n = src.size
        block_bytes = sum(pool.layout.block_bytes)
        chunk = max(1, self.staged_chunk_bytes // block_bytes)
        starts = list(range(0, n, chunk))
        # Send slots send_at.. are ours until this write moved; chunk i is ready once gathered[i]() says so.
        gathered = pool.stager.gather(src, stream, chunk, send_at)
        send_run, nixl, timeout_s = pool.send, self.nixl, self.peer_timeout

        def give_send():  # once the gather finished: a GPU gather may still write the slots
            if gathered is None or all(g() for g in gathered):
                send_run.give(send_at, n)
            else:  # pragma: no cover - GPU gathers
                self._later.append((lambda: all(g() for g in gathered), lambda: send_run.give(send_at, n)))

        xfer_id = next(self._ids)
        sent = _Sent(peer.name, peer.incarnation, rpool.name, rpool.uid, n, time.monotonic() + timeout_s)
        request = self._note(wire.REQUEST, xfer_id, rpool.name, rpool.uid, dst, peer.incarnation)
        try:
            nixl.send_notif(peer.name, request)
        except Exception as e:
            give_send()
            raise RemoteError(
                f"{what}: could not ask peer {peer.name!r} for staging slots ({type(e).__name__}: {e}); "
                "nothing was posted"
            ) from e
        self._sent[xfer_id] = sent
        parts = len(pool.layout.parts)
        next_chunk = 0

        def answered():
            if sent.error is None and not sent.scattered:
                if sent.offset is None:  # its grant may wait for this agent's earlier writes to move
                    self._drive()
                else:
                    self._progress()
            if sent.error is None and not sent.scattered and sent.deadline is not None:
                if time.monotonic() > sent.deadline:
                    step = "grant its slots" if sent.offset is None else "acknowledge the scatter"
                    sent.error = (
                        f"peer {peer.name!r} did not {step} within {timeout_s} s (peer_timeout): it may have "
                        "died, hung, or stopped calling poll()"
                    )
            if sent.error is not None:
                raise RemoteError(sent.error)

        def ready():
            answered()
            return sent.offset is not None

        def post(track):  # the chunks whose gather finished, in order; each note says where it starts
            nonlocal next_chunk
            while next_chunk < len(starts) and (gathered is None or gathered[next_chunk]()):
                answered()  # refused or disconnected meanwhile: post no more
                a = starts[next_chunk]
                b = min(a + chunk, n)
                lidx = descriptor_indices(
                    np.arange(send_at + a, send_at + b, dtype=np.int64), parts, pool.layout.staging_blocks
                )
                slots = np.arange(sent.offset + a, sent.offset + b, dtype=np.int64)
                ridx = descriptor_indices(slots, parts, rpool.staging_blocks)
                note = self._note(wire.STAGED, xfer_id, rpool.name, rpool.uid, [a, b - a], peer.incarnation)
                xfer = nixl.make_prepped_xfer("WRITE", pool.send_dlist, lidx, remote_dlist, ridx, note)
                track(xfer)
                next_chunk += 1
                nixl.transfer(xfer)
            if next_chunk < len(starts):
                answered()  # a refusal may come while chunks wait for their gather
            return next_chunk == len(starts)

        def settled():
            if sent.deadline is None and not sent.scattered and sent.error is None:
                sent.deadline = time.monotonic() + timeout_s  # the wait for the acknowledgement starts
            answered()
            return sent.scattered

        def moved():
            sent.deadline = None  # settled() starts the acknowledgement's clock
            give_send()

        def forget():  # failed, refused or closed, and nothing of it can land any more
            self._sent.pop(xfer_id, None)
            if not sent.final:  # the receiver still holds its request or grant: let it go
                try:
                    nixl.send_notif(
                        peer.name,
                        self._note(wire.CANCEL, xfer_id, rpool.name, rpool.uid, (), peer.incarnation),
                    )
                except Exception:  # a dead peer frees them by its deadline, or when it is disconnected
                    pass
            if send_run is not None and not moved_once[0]:
                give_send()

        moved_once = [False]

        def on_moved():
            moved_once[0] = True
            moved()

        transfer = Transfer(
            nixl,
            what,
            n * block_bytes,
            n,
            post,
            ready,
            settled,
            forget,
            lock=self._lock,
            check=answered,
            timeout=timeout_s,
            on_moved=on_moved,
            linger=self._linger,
        )
        return self._track(transfer, pool, peer)

    def _post(
        self,
        op: str,
        pool: _Pool,
        peer: _Peer,
        rpool: PoolLayout,
        lblocks,
        rblocks,
        note,
        ready,
        what,
        on_error,
    ):
        """A direct transfer between local blocks ``lblocks`` and the peer's
        ``rblocks`` (shape (N,) each), one descriptor per block and part."""
        parts = len(pool.layout.parts)
        nbytes = int(lblocks.size) * sum(pool.layout.block_bytes)
        if not lblocks.size:
            return Transfer(self.nixl, what, 0, 0, None)
        lidx = descriptor_indices(lblocks, parts, pool.layout.num_blocks)
        ridx = descriptor_indices(rblocks, parts, rpool.num_blocks)
        local_dlist, remote_dlist = pool.dlist, self._remote_dlist(peer, rpool, False)
        nixl = self.nixl

        def post(track):
            xfer = nixl.make_prepped_xfer(op, local_dlist, lidx, remote_dlist, ridx, note)
            track(xfer)
            nixl.transfer(xfer)  # its state is polled by the Transfer
            return True

        transfer = Transfer(
            nixl,
            what,
            nbytes,
            int(lblocks.size),
            post,
            ready,
            None,
            on_error,
            lock=self._lock,
            timeout=self.peer_timeout,
            linger=self._linger,
        )
        return self._track(transfer, pool, peer)

    def _track(self, transfer: Transfer, pool: _Pool, peer: _Peer) -> Transfer:
        """Keep (weak) references to a transfer not yet moved: for :meth:`poll`
        to drive, and for connect()/disconnect()/drop_pool() to see what is
        in flight.  Moved and dropped ones are pruned as more come, so a
        sender that never polls keeps no more than about twice its live ones."""
        if transfer.moved and transfer._error is None:
            return transfer
        pool.transfers.add(transfer)
        peer.transfers.add(transfer)
        self._pending.append(weakref.ref(transfer))
        if len(self._pending) >= self._prune_at:
            self._pending = [r for r in self._pending if (t := r()) is not None and t._busy()]
            self._prune_at = max(64, 2 * len(self._pending))
        return transfer

    def _linger(self, xfers: list, then) -> None:
        """NIXL refused to release these requests (it could not cancel them):
        keep them until they finished, release them, then call ``then()``."""
        nixl = self.nixl

        def finished():
            for x in xfers:
                try:
                    if nixl.check_xfer_state(x) == "PROC":
                        return False
                except Exception:
                    pass
            return True

        def release_then():
            for x in xfers:
                try:
                    x.release()
                except Exception:  # freed with the agent
                    pass
            then()

        self._later.append((finished, release_then))

    def _drive(self) -> None:
        """Handle notifications and drive this agent's transfers not moved yet
        (not re-entered: a transfer driven here may ask for it)."""
        self._progress()
        if self._driving:
            return
        self._driving = True
        try:
            self._drive_pending()
        finally:
            self._driving = False

    def _drive_pending(self) -> None:
        live = []
        for ref in self._pending:
            t = ref()
            if t is None:
                continue
            try:
                if not t._advance():
                    live.append(ref)
            except TransferError:  # kept on the handle: its done()/wait() raise it
                pass
        self._pending = live
        self._prune_at = max(64, 2 * len(live))

    # --- the target's side -----------------------------------------------------------------------------

    @_locked
    def poll(self) -> list[Arrival]:
        """Read new notifications (scatter staged arrivals into their pools and
        acknowledge them, grant staging slots, note dropped pools, expire
        what waited on a peer past ``peer_timeout``), drive this agent's own
        transfers that have not moved yet (post those that became ready: GPU
        writes whose stream event completed, staged writes that got their
        slots; check the posted ones, which is also when NIXL was seen to
        send a transfer's notification), and return the :class:`Arrival` s
        completed (or failed) since the last call.

        A notification that cannot be handled, or an answer that cannot be
        sent (a peer that died, or that this agent never connected), is
        reported as a :class:`RuntimeWarning`; the others are handled all the same.
        """
        self._drive()
        out, self._arrivals = self._arrivals, []
        return out

    def _progress(self) -> None:
        """Handle new notifications, each on its own, keeping arrivals for :meth:`poll`."""
        try:
            notes = self.nixl.get_new_notifs()
        except Exception as e:
            raise RemoteError(f"reading NIXL notifications failed ({type(e).__name__}: {e})") from e
        for peer_name, messages in notes.items():
            for msg in messages:
                try:
                    note = wire.unpack_note(msg)
                    if note is not None:
                        self._on_note(peer_name, note)
                except Exception as e:  # one bad message must not cost the others
                    self._warn(f"a notification from {peer_name!r} was not handled ({type(e).__name__}: {e})")
        if self._scattering:  # GPU scatters (CPU tests stand one in)
            scattering, self._scattering, still = self._scattering, [], []
            for entry in scattering:
                if entry[0].done:
                    entry[2].inflight -= 1
                    self._scattered(*entry[1:])
                else:
                    still.append(entry)
            self._scattering = still + self._scattering
        if self._later:  # taken first: a then() may add more
            later, self._later, still = self._later, [], []
            for cond, then in later:
                if cond():
                    then()
                else:
                    still.append((cond, then))
            self._later = still + self._later
        now = time.monotonic()
        if now >= self._next_expiry:
            self._next_expiry = now + min(0.01, self.peer_timeout / 20)
            self._expire(now)

    def _expire(self, now: float) -> None:
        """Fail the grants whose next chunk is late and the requests that
        waited for room past the deadline; free failed grants' slots once
        nothing of them can land."""
        for pool in self._pools.values():
            slots = pool.slots
            if slots is None or not (slots.grants or slots.queue):
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

    def _warn(self, what: str) -> None:
        warnings.warn(f"cupy_swap.remote ({self.name}): {what}", RuntimeWarning, stacklevel=4)

    def _on_note(self, peer_name: str, note: wire.Note) -> None:
        kind = note.kind
        if note.dst != self.incarnation or (peer_name, note.src) in self._retired:
            if kind == wire.DROP:  # news of a pool of a peer that is gone: nothing to do
                return
            if kind == wire.CANCEL and note.dst == self.incarnation:  # a disconnected sender confirms
                self._on_cancel(peer_name, note)  # that nothing of its grant can land: free the slots
                return
            whom = (
                "another incarnation of this agent"
                if note.dst != self.incarnation
                else "an incarnation it replaced"
            )
            self._warn(
                f"a {wire.KIND_NAMES.get(kind, '?')} note from {peer_name!r} for {whom} was refused "
                "(the process restarted, or was reconnected)"
            )
            return
        if kind in (wire.SCATTERED, wire.GRANT, wire.NACK):  # answers to our staged writes
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
            return
        peer = self._peers.get(peer_name)
        if kind == wire.DROP:
            uid = note.uid
            if peer is None or peer.incarnation != note.src:
                return
            known = peer.pools.get(note.pool)
            if known is not None and known.uid == uid:
                peer.dropped.add(note.pool)
            for sent in self._sent.values():  # granted or not: its receive run is gone
                if (
                    sent.peer == peer_name
                    and sent.pool_uid == uid
                    and sent.pool == note.pool
                    and not sent.scattered
                ):
                    sent.error = (
                        sent.error or f"peer {peer_name!r} refused it: {wire.NACK_REASONS[wire.DROPPED]}"
                    )
            return
        pool = self._pools.get(note.pool)
        if kind in (wire.WRITE, wire.READ, wire.ABORT):
            if pool is None or pool.layout.uid != note.uid:  # not the memory its bytes touched
                now = "is not registered" if pool is None else f"is registration {pool.layout.uid} now"
                self._warn(
                    f"a {wire.KIND_NAMES[kind]} note from {peer_name!r} for registration {note.uid} of pool "
                    f"{note.pool!r} was not reported: that registration was dropped (the pool {now})"
                )
                return
            kind_name, why = (
                ("failed", "the sender gave it up") if kind == wire.ABORT else (wire.KIND_NAMES[kind], "")
            )
            self._arrivals.append(
                Arrival(peer_name, note.pool, kind_name, note.blocks, note.xfer_id, note.src, why, note.uid)
            )
            return
        if peer is not None and peer.incarnation != note.src:
            self._warn(
                f"a {wire.KIND_NAMES.get(kind, '?')} note from an incarnation of {peer_name!r} this agent has "
                "not connected was refused; connect() its new metadata"
            )
            return
        if pool is not None and pool.layout.uid != note.uid and kind != wire.REQUEST:
            pool = None  # a chunk or cancel for a registration dropped since: its grants went with it
        key = (peer_name, note.src, note.xfer_id)
        if kind == wire.REQUEST:
            self._on_request(pool, key, note)
        elif kind == wire.CANCEL:
            self._on_cancel(peer_name, note)
        elif kind == wire.STAGED:
            self._on_chunk(pool, key, note)

    def _on_cancel(self, peer_name: str, note: wire.Note) -> None:
        """The sender says nothing of this transfer can land any more: fail
        what waited, free its granted slots (once no scatter of it runs)."""
        pool = self._pools.get(note.pool)
        if pool is None or pool.slots is None or pool.layout.uid != note.uid:
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

    def _on_request(self, pool, key, note) -> None:
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
        grant = _Grant(key, note.pool, uid, dst, time.monotonic() + self.peer_timeout)
        pool.slots.queue.append(grant)
        self._grant(pool)

    def _on_chunk(self, pool, key, note) -> None:
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

    def _fail_grant(self, pool: _Pool, grant: _Grant, reason: int, why: str) -> None:
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

    def _maybe_release(self, pool: _Pool, grant: _Grant) -> None:
        slots = pool.slots
        if slots is None or slots.grants.get(grant.key) is not grant:
            return
        if grant.inflight or grant.release_at is None or time.monotonic() < grant.release_at:
            return
        del slots.grants[grant.key]
        slots.run.give(grant.offset, grant.n)

    def _record_failed(self, grant: _Grant, why: str) -> None:
        peer, inc, xfer_id = grant.key
        self._arrivals.append(
            Arrival(peer, grant.pool, "failed", grant.dst.astype(np.int32), xfer_id, inc, why, grant.uid)
        )

    def _scattered(self, pool: _Pool, grant: _Grant, count: int) -> None:
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

    def _grant(self, pool: _Pool) -> None:
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

    # --- end -------------------------------------------------------------------------------------------

    def close(self) -> None:
        """Close every transfer of this agent not done, drop every pool (peers
        are told), forget every peer, stop the metadata server.  Waits up to
        1 s for requests NIXL could not cancel at once, holding the lock only
        for each poll."""
        with self._lock:
            server, self._server = self._server, None
        if server is not None:  # its thread may be waiting for the lock (metadata()): not held here
            server.close()
        with self._lock:
            for ref in self._pending:
                t = ref()
                if t is not None and t._busy():
                    t.close()
        end = time.monotonic() + min(1.0, self.peer_timeout)
        while time.monotonic() < end:  # requests NIXL could not cancel at once
            with self._lock:
                if not self._later:
                    break
                self._progress()
            time.sleep(0)
        with self._lock:
            self._forget_all()

    def _forget_all(self) -> None:
        for name in list(self._pools):
            try:
                self.drop_pool(name)
            except RemoteError:  # a request NIXL still holds reads it: kept registered, never freed under it
                warnings.warn(
                    f"cupy_swap.remote ({self.name}): pool {name!r} stays registered: NIXL did not let go "
                    f"of a request on it within {min(1.0, self.peer_timeout):.1f} s",
                    RuntimeWarning,
                    stacklevel=3,
                )
        for peer in list(self._peers):
            try:
                self.disconnect(peer)
            except RemoteError:  # as above: its descriptor lists stay with the request NIXL holds
                pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class _MetadataServer:
    """Serves an agent's metadata over TCP at ``(host, port)``: each
    connection gets a little-endian u32 length and the blob, then is closed.
    It reads nothing from its clients."""

    def __init__(self, agent: RemoteAgent, host: str, port: int):
        self._agent = weakref.ref(agent)
        self._sock = socket.create_server((host, port))
        self._sock.settimeout(0.2)
        self.address = self._sock.getsockname()
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._serve, name=f"cupy_swap metadata {agent.name}", daemon=True
        )
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn:
                conn.settimeout(5.0)  # a client that never reads cannot hold the server
                agent = self._agent()
                if agent is None:
                    return
                try:
                    blob = agent.metadata()
                    conn.sendall(struct.pack("<I", len(blob)) + blob)
                except Exception:  # a client that left; an agent closing
                    pass

    def close(self) -> None:
        self._stop.set()
        self._sock.close()
        self._thread.join(2)
