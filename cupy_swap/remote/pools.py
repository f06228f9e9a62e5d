"""Registered pools.  Invariant: a pool's memory stays registered with
NIXL, and its descriptor lists alive, while any request that uses them may
still run: ``drop_pool`` refuses while a transfer from the pool is busy
(and ``close()`` leaves such a pool registered), fails what has not posted,
tells every connected peer which *registration* is gone, and ends every
staged write into it as failed; its receive run stays registered and alive
while a sender it granted slots may still write there (``grants.py``).
What refers to a registration goes with it (``Peer.paired``).  Each
registration gets its own ``uid`` (in its :class:`PoolLayout`), so a pool
dropped and registered again under the same name is never mistaken for
its predecessor.

Every block's descriptor is prepared once, at registration; a pool with
``staging_blocks=S`` also gets a *send* run (what its own staged writes
gather into) and a *receive* run (what peers' staged writes land in), S
slots each, pinned where CUDA answers.
"""

from __future__ import annotations

import dataclasses
import itertools
import warnings
import weakref
from dataclasses import dataclass, field

from . import wire
from .grants import ReceiveRun, Run
from .layout import PoolLayout, check_pool_parts, merged_spans, pool_layout
from .lock import locked
from .staging import GpuStager, HostStager, alloc_staging, gpu_bytes, host_bytes

__all__ = ["Pool", "PoolsMixin"]


@dataclass(eq=False)
class Pool:
    """A registered pool: its layout, registrations, descriptor lists and staging."""

    layout: PoolLayout  # its staging runs are the receive runs (what peers write into)
    regs: list
    dlist: object
    send_dlist: object = None  # the send runs' slots (the local side of a staged write)
    stager: object = None
    slots: ReceiveRun | None = None
    send: Run | None = None
    keep: list = field(default_factory=list)  # arrays whose memory is registered
    torch: bool = False
    transfers: weakref.WeakSet = field(default_factory=weakref.WeakSet)


class PoolsMixin:
    """Registering and dropping pools (part of :class:`RemoteAgent`).

    Owns ``_pools`` (name -> :class:`Pool`) and ``_uids`` (registration numbers).
    """

    def _init_pools(self) -> None:
        self._pools: dict[str, Pool] = {}
        self._uids = itertools.count(1)

    @locked
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
            pool = Pool(
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
                pool.slots = ReceiveRun(staging_blocks)
                pool.send = Run(staging_blocks)
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

    @locked
    def drop_pool(self, name: str) -> None:
        """Tell every connected peer that ``name`` is gone, then deregister it.

        Peers refuse later transfers to it (:class:`PoolDroppedError`) once
        the notification arrived; a direct transfer they posted before that
        may still land, so quiesce first.  Staged writes into it that are
        waiting or granted are refused (the receiver records them as
        failed); the receive run stays registered and alive until each
        granted sender confirmed (``CANCEL``) or one ``peer_timeout`` passed,
        since its chunks may still be on the wire.  This agent's own
        transfers from it that have not been posted fail.

        Raises
        ------
        RemoteError
            A transfer from this pool still has NIXL requests in flight
            (wait for it or close it first: its descriptors are this pool's).
        """
        pool = self._pools[name]
        self._abort_unposted(pool.transfers, f"local pool {name!r} was dropped")
        self._refuse_busy(pool.transfers, "drop_pool", f"from pool {name!r}")
        del self._pools[name]
        for peer in self._peers.values():
            peer.paired = {k: v for k, v in peer.paired.items() if v[0] is not pool.layout}
            try:
                self.nixl.send_notif(
                    peer.name, self._note(wire.DROP, 0, name, pool.layout.uid, (), peer.incarnation)
                )
            except Exception:  # a dead peer needs no news
                pass
        held = self._refuse_grants(pool)  # grants.py: True keeps the receive run for granted senders
        self._release_pool(pool, pool.regs[:1] if held else pool.regs)

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

    @locked
    def pools(self) -> dict:
        """``{name: PoolLayout}`` of this agent's registered pools."""
        return {k: p.layout for k, p in self._pools.items()}
