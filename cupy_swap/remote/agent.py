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
"""

from __future__ import annotations

import itertools
import time
import warnings
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


@dataclass
class _Pool:
    layout: PoolLayout
    regs: list
    dlist: object
    staging_dlist: object = None
    stager: object = None
    keep: list = field(default_factory=list)  # arrays whose memory is registered
    last_staged: Transfer | None = None  # the staging run is free once it is done
    torch: bool = False


@dataclass
class _Peer:
    name: str
    pools: dict
    dlists: dict = field(default_factory=dict)  # (pool, staging?) -> prepared remote dlist
    dropped: set = field(default_factory=set)
    paired: dict = field(default_factory=dict)  # (id(local layout), id(remote layout)) -> both
    unacked: dict = field(default_factory=dict)  # remote pool -> staged transfer id not yet scattered


def default_path(local: PoolLayout, remote: PoolLayout) -> str:
    """The path a ``write`` takes when none is given: ``"staged"`` for a GPU
    pool when both pools have staging runs, ``"direct"`` otherwise.

    Why: host pools gain nothing from staging (two extra host copies; on the
    2-core CPU machine 32 KiB x 1250 moved at 1.1 GB/s staged against 4-7
    direct), while a GPU pool without GPUDirect RDMA moved 0.33-0.52 GB/s
    one descriptor per block on the H200 host (DESIGN.md) where one large
    host run moves at 3.0-3.2.  The GPU half of this choice waits on the
    device sweep (``bench --remote --from gpu``); pass ``path=`` to override.
    """
    if local.mem == "VRAM" and local.staging and remote.staging:
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
    progress_thread : bool
        NIXL's progress thread.  Off by default: NIXL 1.5's Python API starts
        it with no delay between polls, so it keeps one core busy even when
        idle (measured: 1.87 s of CPU in 2 s idle), and on the 2-core CI
        machine two of them slowed every transfer to milliseconds.  Without
        it, :meth:`Transfer.done`/``wait`` and :meth:`poll` drive progress.
    """

    def __init__(self, name: str, *, listen_port: int | None = None, progress_thread: bool = False):
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
        self._scattering: list = []  # (event, Arrival) of GPU scatters not finished yet
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
        staging = [alloc_staging(staging_blocks, b) for b in layout.block_bytes] if staging_blocks else []
        layout = pool_layout(name, seq, staging)
        regs = [self._register(layout.mem, layout.device, [p.span() for p in layout.parts])]
        pool = _Pool(
            layout, regs, self.nixl.prep_xfer_dlist("NIXL_INIT_AGENT", layout.block_descs(), layout.mem)
        )
        pool.keep = seq + staging
        pool.torch = hasattr(seq[0], "data_ptr")
        if staging:
            regs.append(self._register("DRAM", 0, [p.span() for p in layout.staging]))
            pool.staging_dlist = self.nixl.prep_xfer_dlist(
                "NIXL_INIT_AGENT", layout.block_descs(True), "DRAM"
            )
            if layout.mem == "DRAM":
                pool.stager = HostStager([host_bytes(a, p) for a, p in zip(seq, layout.parts)], staging)
            else:  # pragma: no cover - GPU pools: run by the GPU tests on the device
                pool.stager = GpuStager(
                    [gpu_bytes(a, p) for a, p in zip(seq, layout.parts)], staging, layout.device
                )
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
        for handle in (pool.dlist, pool.staging_dlist):
            if handle is not None:
                handle.release()
        for reg in pool.regs:
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
        if name in self._peers:
            self.disconnect(name)
        added = self.nixl.add_remote_agent(nixl_md)
        added = added.decode() if isinstance(added, bytes) else added
        if added != name:
            raise RemoteError(f"connect: metadata names agent {name!r} but NIXL loaded {added!r}")
        self._peers[name] = _Peer(name, pools)
        self.nixl.make_connection(name)  # UCX wire-up now, not inside the first transfer
        return name

    def disconnect(self, peer: str) -> None:
        """Forget a peer: release its prepared descriptors and its NIXL metadata."""
        p = self._peers.pop(peer)
        for handle in p.dlists.values():
            handle.release()
        try:
            self.nixl.remove_remote_agent(peer)
        except Exception:  # already gone
            pass

    def remote_pools(self, peer: str) -> dict:
        """``{name: PoolLayout}`` of a connected peer's pools that it has not dropped."""
        self.poll()
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
        self.poll()  # learn of dropped pools and staged acknowledgements
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
            descriptor ``p * B + b`` is block (or staging slot) ``b`` of part ``p``.
        """
        pool, peer, rpool = self._pair(local, remote)
        ldl = pool.staging_dlist if staging else pool.dlist
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
            into the local staging run, move ``P`` contiguous runs into the
            peer's staging run, the peer scatters when it :meth:`poll`s; one
            staged write per remote pool in flight (the next waits up to
            ``staged_timeout`` s for the peer's acknowledgement).
        stream : cupy or torch stream, optional
            GPU pools: the data is posted only after the work queued on this
            stream (default: the current stream) finished; the handle polls an
            event, nothing blocks.
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
        return self._post(
            "WRITE",
            pool,
            pool.dlist,
            peer,
            self._remote_dlist(peer, rpool, False),
            src,
            dst,
            pool.layout.num_blocks,
            rpool.num_blocks,
            note,
            ready,
            None,
            f"write {local} -> {peer.name}/{rpool.name} ({src.size} blocks, direct)",
        )

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
        return self._post(
            "READ",
            pool,
            pool.dlist,
            peer,
            self._remote_dlist(peer, rpool, False),
            dst,
            src,
            pool.layout.num_blocks,
            rpool.num_blocks,
            note,
            None,
            None,
            f"read {peer.name}/{rpool.name} -> {local} ({src.size} blocks)",
        )

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
        if not n:
            return Transfer(self.nixl, "staged write of no blocks", 0, 0, None)
        self._wait_staging_free(pool, peer, rpool.name, timeout)
        xfer_id = next(self._ids)
        ready = pool.stager.gather(src, stream)
        slots = np.arange(n, dtype=np.int64)
        note = wire.pack_note(wire.STAGED, xfer_id, rpool.name, dst)
        peer.unacked[rpool.name] = xfer_id

        def forget():  # a failed transfer will not be acknowledged
            if peer.unacked.get(rpool.name) == xfer_id:
                del peer.unacked[rpool.name]

        pool.last_staged = self._post(
            "WRITE",
            pool,
            pool.staging_dlist,
            peer,
            self._remote_dlist(peer, rpool, True),
            slots,
            slots,
            pool.layout.staging_blocks,
            rpool.staging_blocks,
            note,
            ready,
            lambda: self._acknowledged(peer, rpool.name, xfer_id),
            f"write {pool.layout.name} -> {peer.name}/{rpool.name} ({n} blocks, staged)",
            forget,
        )
        return pool.last_staged

    def _post(
        self,
        op,
        pool,
        local_dlist,
        peer,
        remote_dlist,
        lblocks,
        rblocks,
        lcount,
        rcount,
        note,
        ready,
        settled,
        what,
        on_error=None,
    ) -> Transfer:
        parts = len(pool.layout.parts)
        nbytes = int(lblocks.size) * sum(pool.layout.block_bytes)
        if not lblocks.size:
            return Transfer(self.nixl, what, 0, 0, None)
        lidx = descriptor_indices(lblocks, parts, lcount)
        ridx = descriptor_indices(rblocks, parts, rcount)
        nixl = self.nixl

        def post():
            xfer = nixl.make_prepped_xfer(op, local_dlist, lidx, remote_dlist, ridx, note)
            return xfer, nixl.transfer(xfer)

        return Transfer(nixl, what, nbytes, int(lblocks.size), post, ready, settled, on_error)

    def _acknowledged(self, peer: _Peer, pool: str, xfer_id: int) -> bool:
        """Whether the peer scattered staged transfer ``xfer_id`` into ``pool``
        (one is in flight per remote pool: it is done once no longer pending)."""
        if peer.unacked.get(pool) == xfer_id:
            self.poll()
        return peer.unacked.get(pool) != xfer_id

    def _wait_staging_free(self, pool: _Pool, peer: _Peer, rpool: str, timeout: float) -> None:
        """Wait (sleeping, bounded) until this pool's staging run is free (its
        last staged write is done) and the peer scattered our last staged
        write into ``rpool``."""
        end = time.monotonic() + timeout
        while True:
            last = pool.last_staged
            try:
                free = last is None or last.done()
            except TransferError:  # that one failed; its run is free
                free = True
            if free and (rpool not in peer.unacked or self._acknowledged(peer, rpool, peer.unacked[rpool])):
                pool.last_staged = None
                return
            if time.monotonic() > end:
                raise TransferError(
                    f"write(path='staged'): the previous staged write to {peer.name}/{rpool} (or from "
                    f"{pool.layout.name!r}) is not done after {timeout} s: is the peer alive and calling poll()?"
                )
            time.sleep(1e-4)

    # --- the target's side -----------------------------------------------------------------------------

    def poll(self) -> list[Arrival]:
        """Read new notifications: scatter staged arrivals into their pools
        (acknowledging each to its sender), note dropped pools, and return
        the :class:`Arrival` s completed since the last call.
        """
        for peer_name, messages in self.nixl.get_new_notifs().items():
            for msg in messages:
                note = wire.unpack_note(msg)
                if note is not None:
                    self._on_note(peer_name, note)
        still = []
        for event, arrival in self._scattering:  # pragma: no cover - GPU scatters
            if event.done:
                self._ack(arrival)
            else:
                still.append((event, arrival))
        self._scattering = still
        out, self._arrivals = self._arrivals, []
        return out

    def _on_note(self, peer_name: str, note: wire.Note) -> None:
        peer = self._peers.get(peer_name)
        if note.kind == wire.DROP:
            if peer is not None:
                peer.dropped.add(note.pool)
            return
        if note.kind == wire.SCATTERED:
            if peer is not None and peer.unacked.get(note.pool) == note.xfer_id:
                del peer.unacked[note.pool]
            return
        arrival = Arrival(peer_name, note.pool, wire.KIND_NAMES[note.kind], note.blocks, note.xfer_id)
        if note.kind != wire.STAGED:
            self._arrivals.append(arrival)
            return
        pool = self._pools.get(note.pool)
        dst = note.blocks.astype(np.int64)
        try:
            if pool is None or pool.stager is None:
                raise RemoteError(f"no pool {note.pool!r} with a staging run here")
            split_mapping((dst, dst), pool.layout.num_blocks, pool.layout.num_blocks, note.pool, note.pool)
        except (RemoteError, ValueError, IndexError) as e:  # not acknowledged: the sender times out
            warnings.warn(
                f"cupy_swap.remote: staged arrival from {peer_name!r} not scattered: {e}", stacklevel=2
            )
            return
        event = pool.stager.scatter(dst)
        if event is None:
            self._ack(arrival)
        else:  # pragma: no cover - GPU scatter, acknowledged once its event finished
            self._scattering.append((event, arrival))

    def _ack(self, arrival: Arrival) -> None:
        self.nixl.send_notif(arrival.peer, wire.pack_note(wire.SCATTERED, arrival.xfer_id, arrival.pool))
        self._arrivals.append(arrival)

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
