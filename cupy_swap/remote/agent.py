"""RemoteAgent: a NIXL agent (UCX backend) that moves KV blocks between
registered pools of two processes or hosts by a ``swap()``-style mapping.
Invariants: every transfer has exactly one outcome, told to its own caller;
every wait on a peer has a deadline (``peer_timeout``); no wait holds the
agent's lock.  Each module below keeps one of them, and says which at its top.

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

The agent is one class put together from one part per concern:

- ``pools.py``: registering and dropping pools (their registrations);
- ``peers.py``: peers and their incarnations (connect, disconnect, restarts);
- ``transfers.py``: direct transfers, and driving every transfer to its end;
- ``staged.py``: the sender's side of staged writes (send runs, the handshake);
- ``grants.py``: the receiver's side of staged writes (receive runs, grants);
- ``notes.py``: reading notifications and the :class:`Arrival` s they make;
- ``listener.py``: the optional metadata listener (``listen_port``);
- ``lock.py``: the one lock, and the pauses of waits taken without it.

This module holds the public calls that cross them (``write``, ``read``,
``poll``, ``close``) and the default path.
"""

from __future__ import annotations

import secrets
import threading
import warnings

from . import _nixl
from .errors import RemoteError
from .grants import GrantsMixin
from .handle import Transfer
from .layout import PoolLayout
from .listener import MetadataServer
from .lock import Pauses, locked
from .mapping import split_mapping
from .notes import Arrival, NotesMixin
from .peers import PeersMixin
from .pools import PoolsMixin
from .staged import StagedMixin
from .transfers import TransfersMixin

__all__ = ["RemoteAgent", "Arrival", "default_path"]

DIRECT, STAGED = "direct", "staged"
# Bytes of one chunk of a staged write (benchmarks/NOTES.md, item 45).
STAGED_CHUNK_BYTES = 8 << 20
# Seconds every wait on a peer may last (RemoteAgent(peer_timeout=...)).
PEER_TIMEOUT = 30.0


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
    (3.44 against 1.81): on a 2-core CPU over loopback staged moves 0.37-0.67
    of direct at 32 KiB-2 MiB blocks, since each side makes one more CPU copy
    of every byte where the wire itself is one (item 59).  Pass ``path=`` to
    override.
    """
    if (local.mem == "VRAM") != (remote.mem == "VRAM") and local.staging and remote.staging:
        return STAGED
    return DIRECT


class RemoteAgent(PoolsMixin, PeersMixin, TransfersMixin, StagedMixin, GrantsMixin, NotesMixin):
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
        past it the transfer fails on both sides (``staged.py``, ``grants.py``).
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
        self._init_pools()
        self._init_peers()
        self._init_transfers()
        self._init_staged()
        self._init_grants()
        self._init_notes()
        self._server = None
        if listen_port is not None:
            self._server = MetadataServer(self, listen_host, listen_port)

    # --- transfers ----------------------------------------------------------------------------------

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

    @locked
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
        return self._read_direct(pool, peer, rpool, src, dst, notify)

    # --- the target's side ---------------------------------------------------------------------------

    @locked
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

    # --- end -------------------------------------------------------------------------------------------

    def close(self) -> None:
        """Close every transfer of this agent not done, drop every pool (peers
        are told), forget every peer, stop the metadata server.  Waits up to
        1 s in all, holding the lock only for each poll, for requests NIXL
        could not cancel at once, then for granted senders to confirm that
        nothing more lands in a receive run (``CANCEL``); a run one did not
        confirm stays registered and alive, and is freed by a later
        :meth:`poll` once its deadline passed, or with the agent."""
        with self._lock:
            server, self._server = self._server, None
        if server is not None:  # its thread may be waiting for the lock (metadata()): not held here
            server.close()
        with self._lock:
            for ref in self._pending:
                t = ref()
                if t is not None and t._busy():
                    t.close()
        pauses = Pauses()
        self._settle(lambda: self._later, pauses)  # requests NIXL could not cancel at once
        with self._lock:
            self._drop_all()
        self._settle(lambda: self._dropped, pauses)  # grants.py: granted senders, still connected, confirm
        with self._lock:
            for peer in list(self._peers):
                try:
                    self.disconnect(peer)
                except RemoteError:  # its descriptor lists stay with the request NIXL holds
                    pass

    def _settle(self, busy, pauses: Pauses) -> None:
        """Progress, taking the lock for each try, while ``busy()`` and ``close()``'s second lasts."""
        while pauses.elapsed() < min(1.0, self.peer_timeout):
            with self._lock:
                if not busy():
                    return
                self._progress()
            pauses.sleep()

    def _drop_all(self) -> None:
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

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
