"""RemoteAgent: a NIXL agent (UCX backend) that moves KV blocks between
registered pools of two processes or hosts by a ``swap()``-style mapping.

The life of a pair of agents::

    a = RemoteAgent("prefill")                   # no listening thread unless listen_port=...
    a.register_pool("kv", [k_cache, v_cache], staging_blocks=1250)
    blob = a.metadata()                          # bytes: carry them to the peer (exchange.py)
    peer = b_side.connect(blob)                  # ... and back: a.connect(b_side.metadata())
    t = a.write("kv", ("decode", "kv"), [(src, dst), ...])
    t.wait(timeout=10)
    for arrival in b_side.poll(): ...            # target: which blocks arrived

Descriptors are prepared once: every block of a local pool when it is
registered, every block of a remote pool when its peer connects.  A call only
checks the mapping, turns it into descriptor indices and posts.

Progress.  Nothing runs in the background (NIXL's progress thread is off by
default).  A GPU write is posted when the event recorded on its producing
stream has completed, and that is noticed inside :meth:`Transfer.done`,
:meth:`Transfer.wait` or :meth:`RemoteAgent.poll` (which drives every
transfer of this agent not moved yet: posts those that became ready, checks
the posted ones); until one of them runs, the write waits.  The same holds for
a staged write waiting for its slots, and the receiver's notification of a
posted transfer was seen to wait for such a check too: a side that only sends
should still call ``poll()`` (or ``done()``) now and then.
Internal progress (every ``write``/``read``/``remote_pools`` call) handles
notifications as they come but keeps the :class:`Arrival` s for :meth:`poll`.

Staging.  A pool registered with ``staging_blocks=S`` gets two host runs of S
slots: a *send* run, which its own staged writes gather into (one staged write
of a pool between gather and the data leaving; the next waits), and a
*receive* run that peers write into.  The receive run is shared by every
sender through receiver-granted credits: a staged write first asks the
receiver for n slots (``REQUEST``), the receiver grants a free range
(``GRANT``, first fit, requests served in arrival order), the sender writes
that range in chunks of about ``staged_chunk_bytes`` (each posted once its
gather finished), the receiver scatters each chunk as it lands and, once all
are in place, frees the range (``SCATTERED``).  So
staged writes of several peers into one pool, and staged writes both ways
between two agents at once, never share slots.  The receiver grants in
:meth:`poll` (or any call that makes progress): it must poll for staged
writes to move.  Refusals (no staging run, too many blocks, bad blocks, pool
dropped) come back as ``NACK`` and fail the sender's :class:`Transfer` with
:class:`TransferError`.  Slots granted to a peer that dies before it writes
stay taken until this agent :meth:`disconnect` s it.
"""

from __future__ import annotations

import collections
import itertools
import time
import warnings
import weakref
from dataclasses import dataclass, field

import numpy as np

from . import _nixl, wire
from .errors import PoolDroppedError, RemoteError, TransferError
from .handle import Transfer
from .layout import PoolLayout, check_pairable, pool_layout
from .mapping import descriptor_indices, split_mapping
from .staging import GpuStager, HostStager, alloc_staging, gpu_bytes, host_bytes, stream_ready

__all__ = ["RemoteAgent", "Arrival", "default_path"]

DIRECT, STAGED = "direct", "staged"
# Bytes of one chunk of a staged write (benchmarks/NOTES.md, item 45).
STAGED_CHUNK_BYTES = 8 << 20


@dataclass(frozen=True)
class Arrival:
    """What a peer did to one of this agent's pools, learned from a notification.

    Attributes
    ----------
    peer : str
    pool : str
    kind : str
        ``"write"`` (direct; the bytes are in place), ``"staged"`` (scattered
        from staging into place before it is reported) or ``"read"`` (the
        peer read these blocks: they may be reused).
    blocks : numpy.ndarray of shape (N,), int32
        Blocks of ``pool`` written (or read), in mapping order.
    xfer_id : int
        The sender's transfer number.
    """

    peer: str
    pool: str
    kind: str
    blocks: np.ndarray
    xfer_id: int


class _Slots:
    """The receive run's slots: which are free, which are granted to whom,
    and the requests waiting for room (served in arrival order, first fit)."""

    def __init__(self, count: int):
        self.free = np.ones(count, dtype=bool)
        self.grants: dict = {}  # (peer, xfer_id) -> (offset, n)
        # (peer, xfer_id) -> _Landing of a staged write whose chunks are arriving
        self.landing: dict = {}
        self.queue: collections.deque = collections.deque()  # (peer, xfer_id, n)

    def take(self, n: int) -> int | None:
        edges = np.diff(np.concatenate(([0], self.free.view(np.int8), [0])))
        starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
        fits = np.flatnonzero(ends - starts >= n)
        if not fits.size:
            return None
        offset = int(starts[fits[0]])
        self.free[offset : offset + n] = False
        return offset

    def release(self, key) -> tuple | None:
        self.landing.pop(key, None)
        grant = self.grants.pop(key, None)
        if grant is not None:
            offset, n = grant
            self.free[offset : offset + n] = True
        return grant


@dataclass
class _Landing:
    """The chunks of one staged write that reached this receiver: blocks
    noted (checked, scattering or scattered) and scattered, and each chunk's
    ``(start, destination blocks)``.  ``failed``: a chunk was refused; its
    slots stay taken (chunks still in flight may land there) until the peer
    is disconnected."""

    noted: int = 0
    scattered: int = 0
    chunks: list = field(default_factory=list)
    failed: bool = False
    covered: np.ndarray | None = None  # granted slots a chunk claimed
    written: np.ndarray | None = None  # destination blocks a chunk claimed


@dataclass
class _Pool:
    layout: PoolLayout  # its staging runs are the receive runs (what peers write into)
    regs: list
    dlist: object
    send_dlist: object = None  # the send runs' slots (the local side of a staged write)
    stager: object = None
    slots: _Slots | None = None
    keep: list = field(default_factory=list)  # arrays whose memory is registered
    last_send: weakref.ref | None = None  # to the last staged Transfer: the send run is free once it moved
    torch: bool = False


@dataclass
class _Peer:
    name: str
    pools: dict
    dlists: dict = field(default_factory=dict)  # (pool, staging?) -> prepared remote dlist
    dropped: set = field(default_factory=set)
    paired: dict = field(default_factory=dict)  # (id(local layout), id(remote layout)) -> both


@dataclass
class _Sent:
    """A staged write of this agent, from its request to the receiver's answer."""

    peer: str
    pool: str
    n: int
    offset: int | None = None  # granted slots of the receiver's receive run
    scattered: bool = False
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


class RemoteAgent:
    """A NIXL agent with the UCX backend and cupy_swap's block contract.

    Parameters
    ----------
    name : str
        Unique among the agents that will connect to each other.
    listen_port : int, optional
        Start NIXL's metadata listener on this TCP port (off by default:
        metadata then travels only as bytes the application carries).  UCX's
        own TCP transport listens on an ephemeral port of each device in
        ``UCX_NET_DEVICES`` whatever this says (README: what a listener exposes).
    staged_chunk_bytes : int
        A staged write moves in chunks of about this many bytes (whole
        blocks, at least one): each chunk is posted once its own gather
        finished, and the receiver scatters each one as it lands, so
        gather, transfer and scatter overlap (``benchmarks/NOTES.md``, item 45).
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
        staged_chunk_bytes: int = STAGED_CHUNK_BYTES,
        progress_thread: bool = False,
    ):
        if not isinstance(staged_chunk_bytes, int) or staged_chunk_bytes < 1:
            raise ValueError(f"staged_chunk_bytes: expected a positive int, got {staged_chunk_bytes!r}")
        self.staged_chunk_bytes = staged_chunk_bytes
        api = _nixl.api()
        config = api.nixl_agent_config(
            enable_prog_thread=progress_thread,
            enable_listen_thread=listen_port is not None,
            listen_port=listen_port if listen_port is not None else api.DEFAULT_COMM_PORT,
            backends=["UCX"],
        )
        self.name = name
        self.nixl = api.nixl_agent(name, config)
        if "UCX" not in self.nixl.backends:
            raise RemoteError("NIXL could not start its UCX backend (see the log above)")
        self._pools: dict[str, _Pool] = {}
        self._peers: dict[str, _Peer] = {}
        self._arrivals: list[Arrival] = []
        self._scattering: list = []  # (event, pool, key, blocks) of GPU scatters not finished yet
        self._sent: dict[int, _Sent] = {}  # staged writes of this agent not yet answered
        self._pending: list = []  # weak references to this agent's transfers not yet moved
        self._ids = itertools.count(1)

    # --- pools -----------------------------------------------------------------------------------------

    def register_pool(self, name: str, parts, *, staging_blocks: int = 0) -> PoolLayout:
        """Register a pool's memory with NIXL once and prepare its block descriptors.

        Parameters
        ----------
        name : str
            The name peers address it by.
        parts : array or sequence of arrays
            Each of shape ``(B, ...)``: NumPy (pinned or not), CuPy, or torch
            (CPU or CUDA); all in one memory (host, or one GPU).
        staging_blocks : int
            Slots of the staging run for the staged path (0: no staged
            transfers to or from this pool).  Allocated here, pinned when CUDA
            answers.

        Returns
        -------
        PoolLayout
        """
        if name in self._pools:
            raise ValueError(
                f"register_pool: a pool named {name!r} is registered already; drop_pool() it first"
            )
        seq = list(parts) if isinstance(parts, (list, tuple)) else [parts]
        layout = pool_layout(name, seq)
        if staging_blocks:
            send = [alloc_staging(staging_blocks, b) for b in layout.block_bytes]
            recv = [alloc_staging(staging_blocks, b) for b in layout.block_bytes]
            layout = pool_layout(name, seq, recv)
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
                pool.slots = _Slots(staging_blocks)
                if layout.mem == "DRAM":
                    parts = [host_bytes(a, p) for a, p in zip(seq, layout.parts)]
                    pool.stager = HostStager(parts, send, recv)
                else:  # pragma: no cover - GPU pools: run by the GPU tests on the device
                    parts = [gpu_bytes(a, p) for a, p in zip(seq, layout.parts)]
                    pool.stager = GpuStager(parts, send, recv, layout.device, pool.torch)
        except BaseException:
            try:
                self._release_pool(pool, regs)
            except Exception as e:  # the first error is the one to see
                warnings.warn(f"cupy_swap.remote: register_pool cleanup failed: {e}", stacklevel=2)
            raise
        self._pools[name] = pool
        return layout

    def _register(self, mem: str, device: int, spans) -> object:
        rows = [(addr, length, device, "") for addr, length in spans]
        return self.nixl.register_memory(rows, mem)

    def drop_pool(self, name: str) -> None:
        """Tell every connected peer that ``name`` is gone, then deregister it.

        Peers refuse later transfers to it (:class:`PoolDroppedError`) once
        the notification arrived; a transfer they posted before that may
        still land.  Quiesce first (no transfer to this pool in flight), as
        with any memory that a peer may write.
        """
        pool = self._pools.pop(name)
        note = wire.pack_note(wire.DROP, 0, name)
        for peer in self._peers.values():
            try:
                self.nixl.send_notif(peer.name, note)
            except Exception:  # a dead peer needs no news
                pass
        if pool.slots is not None:  # senders still waiting for slots are refused
            waiting = list(pool.slots.queue) + [(p, x, 0) for p, x in pool.slots.grants]
            for peer_name, xfer_id, _ in waiting:
                self._nack(peer_name, xfer_id, name, wire.DROPPED)
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

    def pools(self) -> dict:
        """``{name: PoolLayout}`` of this agent's registered pools."""
        return {k: p.layout for k, p in self._pools.items()}

    # --- peers -----------------------------------------------------------------------------------------

    def metadata(self) -> bytes:
        """This agent's metadata (NIXL's plus the pools' layouts) as bytes.

        Whoever holds these bytes can read and write the registered pools:
        carry them only to peers you trust.  Export again after registering
        or dropping pools.
        """
        return wire.pack_metadata(self.name, self.pools(), self.nixl.get_agent_metadata())

    def connect(self, blob: bytes) -> str:
        """Import a peer's :meth:`metadata` and prepare its pools' descriptors.

        Connecting again with newer metadata replaces the old view of that peer.

        Returns
        -------
        str
            The peer's agent name.

        Raises
        ------
        LayoutMismatchError
            A pool of the same name on both sides differs in part count or
            block bytes (checked here, before any transfer).
        """
        name, pools, nixl_md = wire.unpack_metadata(blob)
        for pool_name, remote in pools.items():
            if pool_name in self._pools:
                check_pairable(self._pools[pool_name].layout, remote, name)
        if name in self._peers:  # staged writes both ways keep their slots and state
            self._drop_peer(name, staging=False)
        added = self.nixl.add_remote_agent(nixl_md)
        added = added.decode() if isinstance(added, bytes) else added
        if added != name:
            raise RemoteError(f"connect: metadata names agent {name!r} but NIXL loaded {added!r}")
        self._peers[name] = _Peer(name, pools)
        self.nixl.make_connection(name)  # UCX wire-up now, not inside the first transfer
        return name

    def disconnect(self, peer: str) -> None:
        """Forget a peer: release its prepared descriptors and its NIXL metadata,
        give the receive slots granted to it back (quiesce first: a staged write
        of it still in flight could land in slots granted anew), and fail this
        agent's staged writes to it that are still waiting for an answer."""
        self._drop_peer(peer, staging=True)

    def _drop_peer(self, peer: str, staging: bool) -> None:
        p = self._peers.pop(peer)
        for handle in p.dlists.values():
            handle.release()
        for pool in self._pools.values() if staging else ():  # its slots and waiting requests are free again
            if pool.slots is not None:
                for key in [k for k in pool.slots.grants if k[0] == peer]:
                    pool.slots.release(key)
                pool.slots.queue = collections.deque(r for r in pool.slots.queue if r[0] != peer)
                self._grant(pool)
        for sent in self._sent.values() if staging else ():
            if sent.peer == peer and sent.error is None and not sent.scattered:
                sent.error = f"peer {peer!r} was disconnected before it answered"
        try:
            self.nixl.remove_remote_agent(peer)
        except Exception:  # already gone
            pass

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
        staged_timeout: float = 30.0,
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
            shape); a refused call moves no byte.
        path : {None, "direct", "staged"}
            None: :func:`default_path`.  ``direct``: one descriptor per block and part.  ``staged``: gather
            into the local send run, ask the peer for slots of its receive run,
            move the run there in chunks of :attr:`staged_chunk_bytes` once
            granted, the peer scatters each chunk when it :meth:`poll` s.  One staged write per local pool between its
            gather and its data leaving: the next waits up to ``staged_timeout``
            s for that (the receiver must poll to grant).
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
        pool, peer, rpool = self._pair(local, remote)
        if path is None:
            path = default_path(pool.layout, rpool)
        src, dst = split_mapping(mapping, pool.layout.num_blocks, rpool.num_blocks, local, rpool.name)
        if path == STAGED:
            return self._write_staged(pool, peer, rpool, src, dst, stream, staged_timeout)
        note = wire.pack_note(wire.WRITE, next(self._ids), rpool.name, dst) if notify else b""
        ready = stream_ready(stream, pool.torch) if pool.layout.mem == "VRAM" and src.size else None
        what = f"write {local} -> {peer.name}/{rpool.name} ({src.size} blocks, direct)"
        return self._post("WRITE", pool, peer, rpool, src, dst, note, ready, what)

    def read(self, local: str, remote, mapping, *, notify: bool = True) -> Transfer:
        """Copy blocks of a peer's pool into a local pool (direct path).

        Parameters
        ----------
        local : str
        remote : tuple (peer, pool)
        mapping : (N, 2) rows ``(remote_block, local_block)``, or ``(src_indices, dst_indices)``
            As :meth:`write`, source first.
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
        note = wire.pack_note(wire.READ, next(self._ids), rpool.name, src) if notify else b""
        what = f"read {peer.name}/{rpool.name} -> {local} ({src.size} blocks)"
        return self._post("READ", pool, peer, rpool, dst, src, note, None, what)

    def _write_staged(self, pool, peer, rpool, src, dst, stream, timeout) -> Transfer:
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
        self._wait_send_free(pool, peer, rpool.name, timeout)
        remote_dlist = self._remote_dlist(peer, rpool, True)
        block_bytes = sum(pool.layout.block_bytes)
        chunk = max(1, self.staged_chunk_bytes // block_bytes)
        starts = list(range(0, n, chunk))
        # The send run is ours until this write moved; chunk i is ready once gathered[i]() says so.
        gathered = pool.stager.gather(src, stream, chunk)
        xfer_id = next(self._ids)
        sent = _Sent(peer.name, rpool.name, n)
        try:
            self.nixl.send_notif(peer.name, wire.pack_note(wire.REQUEST, xfer_id, rpool.name, [n]))
        except Exception as e:
            raise RemoteError(
                f"{what}: could not ask peer {peer.name!r} for staging slots ({type(e).__name__}: {e}); "
                "nothing was posted"
            ) from e
        self._sent[xfer_id] = sent
        parts = len(pool.layout.parts)
        nixl = self.nixl
        next_chunk = 0

        def answered():
            if sent.error is None and not sent.scattered:
                self._progress()
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
                lidx = descriptor_indices(np.arange(a, b, dtype=np.int64), parts, pool.layout.staging_blocks)
                slots = np.arange(sent.offset + a, sent.offset + b, dtype=np.int64)
                ridx = descriptor_indices(slots, parts, rpool.staging_blocks)
                note = wire.pack_note(wire.STAGED, xfer_id, rpool.name, np.concatenate(([a], dst[a:b])))
                xfer = nixl.make_prepped_xfer("WRITE", pool.send_dlist, lidx, remote_dlist, ridx, note)
                track(xfer)
                next_chunk += 1
                nixl.transfer(xfer)
            if next_chunk < len(starts):
                answered()  # a refusal may come while chunks wait for their gather
            return next_chunk == len(starts)

        def settled():
            answered()
            return sent.scattered

        def forget(cancel: bool):  # failed, refused or closed: no answer is awaited any more
            self._sent.pop(xfer_id, None)
            if cancel and sent.error is None:  # our slots will not be written: give them back
                try:
                    nixl.send_notif(peer.name, wire.pack_note(wire.CANCEL, xfer_id, rpool.name))
                except Exception:  # a dead peer frees them when it disconnects us
                    pass

        transfer = self._track(Transfer(nixl, what, n * block_bytes, n, post, ready, settled, forget))
        pool.last_send = weakref.ref(transfer)  # a transfer dropped unposted is closed: the run is free
        return transfer

    def _post(
        self, op: str, pool: _Pool, peer: _Peer, rpool: PoolLayout, lblocks, rblocks, note, ready, what
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

        return self._track(Transfer(nixl, what, nbytes, int(lblocks.size), post, ready))

    def _track(self, transfer: Transfer) -> Transfer:
        """Keep a (weak) reference to a transfer not yet moved, for :meth:`poll` to drive."""
        if not transfer.moved:
            self._pending.append(weakref.ref(transfer))
        return transfer

    def _wait_send_free(self, pool: _Pool, peer: _Peer, rpool: str, timeout: float) -> None:
        """Wait (bounded, driving progress) until this pool's send run is free:
        its last staged write moved, failed or was closed."""
        end = time.monotonic() + timeout
        while True:
            last = None if pool.last_send is None else pool.last_send()
            try:
                free = last is None or last._advance()
            except TransferError:  # that one failed; its run is free
                free = True
            if free:
                pool.last_send = None
                return
            if time.monotonic() > end:
                raise TransferError(
                    f"write(path='staged'): the previous staged write from {pool.layout.name!r} ({last.what}) "
                    f"has not left after {timeout} s: is its receiver alive and calling poll()?"
                )
            time.sleep(1e-4)

    # --- the target's side -----------------------------------------------------------------------------

    def poll(self) -> list[Arrival]:
        """Read new notifications (scatter staged arrivals into their pools and
        acknowledge them, grant staging slots, note dropped pools), drive this
        agent's own transfers that have not moved yet (post those that became
        ready: GPU writes whose stream event completed, staged writes that got
        their slots; check the posted ones, which is also when NIXL was seen to
        send a transfer's notification), and return the :class:`Arrival` s
        completed since the last call.

        A notification that cannot be handled, or an answer that cannot be
        sent (a peer that died, or that this agent never connected), is
        reported as a :class:`RuntimeWarning`; the others are handled all the same.
        """
        self._progress()
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
        if self._scattering:  # pragma: no cover - GPU scatters
            still = []
            for entry in self._scattering:
                if entry[0].done:
                    self._scattered(*entry[1:])
                else:
                    still.append(entry)
            self._scattering = still

    def _warn(self, what: str) -> None:
        warnings.warn(f"cupy_swap.remote ({self.name}): {what}", RuntimeWarning, stacklevel=4)

    def _on_note(self, peer_name: str, note: wire.Note) -> None:
        kind = note.kind
        if kind in (wire.SCATTERED, wire.GRANT, wire.NACK):  # answers to our staged writes
            sent = self._sent.get(note.xfer_id)
            if sent is None or sent.peer != peer_name:
                return
            if kind == wire.GRANT:
                sent.offset = int(note.blocks[0])
                return
            del self._sent[note.xfer_id]  # answered: its Transfer holds the verdict
            if kind == wire.SCATTERED:
                sent.scattered = True
            else:
                reason = int(note.blocks[0]) if note.blocks.size else 0
                why = wire.NACK_REASONS.get(reason, f"reason {reason}")
                sent.error = f"peer {peer_name!r} refused it: {why}"
            return
        if kind == wire.DROP:
            peer = self._peers.get(peer_name)
            if peer is not None:
                peer.dropped.add(note.pool)
            for sent in self._sent.values():  # granted or not: its receive run is gone
                if sent.peer == peer_name and sent.pool == note.pool and not sent.scattered:
                    sent.error = (
                        sent.error or f"peer {peer_name!r} refused it: {wire.NACK_REASONS[wire.DROPPED]}"
                    )
            return
        pool = self._pools.get(note.pool)
        key = (peer_name, note.xfer_id)
        if kind == wire.REQUEST:
            n = int(note.blocks[0]) if note.blocks.size else 0
            if pool is None or pool.slots is None:
                self._nack(peer_name, note.xfer_id, note.pool, wire.NO_STAGING)
            elif not 0 < n <= pool.slots.free.size:
                self._nack(peer_name, note.xfer_id, note.pool, wire.TOO_MANY)
            else:
                pool.slots.queue.append((peer_name, note.xfer_id, n))
                self._grant(pool)
            return
        if kind == wire.CANCEL:
            if pool is not None and pool.slots is not None:
                pool.slots.queue = collections.deque(r for r in pool.slots.queue if r[:2] != key)
                if pool.slots.release(key) is not None:
                    self._grant(pool)
            return
        if kind != wire.STAGED:
            self._arrivals.append(
                Arrival(peer_name, note.pool, wire.KIND_NAMES.get(kind, "?"), note.blocks, note.xfer_id)
            )
            return
        grant = None if pool is None or pool.slots is None else pool.slots.grants.get(key)
        if grant is None:
            self._nack(peer_name, note.xfer_id, note.pool, wire.NO_GRANT)
            self._warn(
                f"staged arrival {note.xfer_id} from {peer_name!r} into {note.pool!r}: no slots granted"
            )
            return
        landing = pool.slots.landing.setdefault(key, _Landing())
        if landing.failed:
            return
        start = int(note.blocks[0]) if note.blocks.size else -1
        dst = note.blocks[1:].astype(np.int64)
        try:
            if start < 0 or start + dst.size > grant[1]:
                raise ValueError(f"a chunk of {dst.size} blocks at slot {start}, {grant[1]} slots granted")
            split_mapping((dst, dst), pool.layout.num_blocks, pool.layout.num_blocks, note.pool, note.pool)
            if landing.covered is None:
                landing.covered = np.zeros(grant[1], dtype=bool)
                landing.written = np.zeros(pool.layout.num_blocks, dtype=bool)
            if landing.covered[start : start + dst.size].any() or landing.written[dst].any():
                raise ValueError(f"a chunk at slot {start} claims slots or blocks an earlier chunk claimed")
            landing.covered[start : start + dst.size] = True
            landing.written[dst] = True
        except (ValueError, IndexError) as e:
            landing.failed = True
            self._nack(peer_name, note.xfer_id, note.pool, wire.BAD_BLOCKS)
            self._warn(f"staged arrival from {peer_name!r} not scattered: {e}")
            return
        landing.noted += dst.size
        landing.chunks.append((start, dst))
        event = pool.stager.scatter(dst, grant[0] + start)
        if event is None:
            self._scattered(pool, key, dst.size)
        else:  # pragma: no cover - GPU scatter, counted once its event finished
            self._scattering.append((event, pool, key, dst.size))

    def _scattered(self, pool: _Pool, key, count: int) -> None:
        """``count`` more blocks of staged write ``key`` are in place: once
        all are, free its slots, acknowledge it and grant waiting requests."""
        slots = pool.slots
        landing = None if slots is None else slots.landing.get(key)
        grant = None if slots is None else slots.grants.get(key)
        if landing is None or grant is None:  # the peer was disconnected, or the pool dropped, meanwhile
            return
        landing.scattered += count
        if landing.scattered < grant[1]:
            return
        blocks = np.concatenate([dst for _, dst in sorted(landing.chunks, key=lambda c: c[0])])
        pool.slots.release(key)
        self._ack(Arrival(key[0], pool.layout.name, "staged", blocks.astype(np.int32), key[1]))
        self._grant(pool)

    def _grant(self, pool: _Pool) -> None:
        """Grant slots to the waiting requests, in arrival order, while they fit."""
        slots = pool.slots
        while slots.queue:
            peer_name, xfer_id, n = slots.queue[0]
            offset = slots.take(n)
            if offset is None:
                return
            slots.queue.popleft()
            slots.grants[(peer_name, xfer_id)] = (offset, n)
            try:
                self.nixl.send_notif(
                    peer_name, wire.pack_note(wire.GRANT, xfer_id, pool.layout.name, [offset])
                )
            except Exception as e:
                slots.release((peer_name, xfer_id))
                self._warn(
                    f"could not grant staging slots to {peer_name!r} ({type(e).__name__}: {e}); is it "
                    "connected (connect() its metadata) and alive?"
                )

    def _nack(self, peer_name: str, xfer_id: int, pool: str, reason: int) -> None:
        try:
            self.nixl.send_notif(peer_name, wire.pack_note(wire.NACK, xfer_id, pool, [reason]))
        except Exception as e:
            self._warn(f"could not refuse staged write {xfer_id} of {peer_name!r} ({type(e).__name__}: {e})")

    def _ack(self, arrival: Arrival) -> None:
        self._arrivals.append(arrival)  # the blocks are in place, whether the sender hears of it or not
        try:
            self.nixl.send_notif(arrival.peer, wire.pack_note(wire.SCATTERED, arrival.xfer_id, arrival.pool))
        except Exception as e:
            self._warn(
                f"could not acknowledge staged write {arrival.xfer_id} of {arrival.peer!r} "
                f"({type(e).__name__}: {e}); is it connected and alive?"
            )

    # --- end -------------------------------------------------------------------------------------------

    def close(self) -> None:
        """Drop every pool (peers are told), forget every peer."""
        for name in list(self._pools):
            self.drop_pool(name)
        for peer in list(self._peers):
            self.disconnect(peer)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
