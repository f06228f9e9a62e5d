"""Posting direct transfers and keeping every transfer to its end.
Invariant: every transfer has exactly one outcome, told to its own caller
(its :class:`Transfer` ends done, or with one :class:`TransferError`), and
while it may still post or has NIXL requests in flight the agent keeps a
(weak) reference to it: :meth:`poll` drives it, and ``connect()``,
``disconnect()`` and ``drop_pool()`` refuse to release the descriptors and
memory under it.  A request NIXL would not release is kept until NIXL
reports it finished; only then is the receiver told that nothing of it can
land (``ABORT``, ``CANCEL``).

Direct transfers use one prepared descriptor per block and part, on both
sides; a GPU write is posted once the event recorded on its producing
stream has completed.  Nothing runs in the background: that event, NIXL's
request states and the deferred steps in ``_later`` are checked inside
:meth:`Transfer.done`/``wait`` and :meth:`RemoteAgent.poll`.
"""

from __future__ import annotations

import itertools
import weakref

from . import wire
from .errors import RemoteError, TransferError
from .handle import Transfer
from .layout import PoolLayout
from .mapping import descriptor_indices
from .staging import stream_ready

__all__ = ["TransfersMixin"]


class TransfersMixin:
    """Direct transfers, and driving every transfer (part of :class:`RemoteAgent`).

    Owns ``_pending`` (weak references to transfers not moved yet),
    ``_later`` (``(ready(), then())`` steps run once ready), ``_ids``
    (transfer numbers) and the driving flag.
    """

    def _init_transfers(self) -> None:
        self._pending: list = []
        self._prune_at = 64
        self._later: list = []
        self._driving = False
        self._ids = itertools.count(1)

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

    def _read_direct(self, pool, peer, rpool, src, dst, notify) -> Transfer:
        local = pool.layout.name
        note = (
            self._note(wire.READ, next(self._ids), rpool.name, rpool.uid, src, peer.incarnation)
            if notify
            else b""
        )
        what = f"read {peer.name}/{rpool.name} -> {local} ({src.size} blocks)"
        return self._post("READ", pool, peer, rpool, dst, src, note, None, what, None)

    @staticmethod
    def _refuse_busy(
        transfers, call: str, whose: str, tail: str = "wait for them or close() them first", are: str = "are"
    ) -> None:
        """Raise RemoteError naming ``call`` while a transfer of ``transfers`` is in flight."""
        busy = [t for t in transfers if t._busy()]
        if busy:
            raise RemoteError(
                f"{call}: {len(busy)} transfer(s) {whose} {are} in flight ({busy[0].what}); {tail}"
            )

    def _abort_unposted(self, transfers, why: str) -> None:
        """Fail the transfers that posted nothing now in flight (they may not post any more)."""
        for t in list(transfers):
            if t._busy() and not t._xfers:
                t._abort(RemoteError(why))

    def _post(
        self,
        op: str,
        pool,
        peer,
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

    def _track(self, transfer: Transfer, pool, peer) -> Transfer:
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

    def _run_later(self) -> None:
        """Run the deferred steps whose condition holds (taken first: a step may add more)."""
        if not self._later:
            return
        later, self._later, still = self._later, [], []
        for cond, then in later:
            if cond():
                then()
            else:
                still.append((cond, then))
        self._later = still + self._later
