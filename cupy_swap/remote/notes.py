"""Notifications and what the receiver learns from them.  Invariant: every
note is handled on its own and only for what it names: the incarnations of
its sender and of this agent (a note from a retired incarnation, or for
another one of this agent, touches nothing), the pool's registration (an
:class:`Arrival` is reported only on the registration its bytes touched),
and the transfer (answers go to the one staged write whose id, peer and
incarnation they name).  One note that cannot be handled costs a
:class:`RuntimeWarning`, never the others.

Notes are read by :meth:`_progress` (inside every call that drives this
agent) and dispatched by kind: answers to this agent's staged writes
(``staged.py``), a peer's dropped pool (``peers.py``), the staged path's
requests, chunks and cancellations (``grants.py``), and ``WRITE``/``READ``/
``ABORT``, which become :class:`Arrival` s here.  Arrivals wait in
``_arrivals`` for :meth:`RemoteAgent.poll`.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass

import numpy as np

from . import wire
from .errors import RemoteError

__all__ = ["Arrival", "NotesMixin"]


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


class NotesMixin:
    """Reading and dispatching notifications (part of :class:`RemoteAgent`).

    Owns ``_arrivals`` (what :meth:`poll` returns next) and ``_next_expiry``.
    """

    def _init_notes(self) -> None:
        self._arrivals: list[Arrival] = []
        self._next_expiry = 0.0

    def _note(self, kind: int, xfer_id: int, pool: str, uid: int, blocks, to: int) -> bytes:
        """A note from this incarnation for incarnation ``to`` of its peer,
        about registration ``uid`` of pool ``pool`` (0: none)."""
        return wire.pack_note(kind, xfer_id, pool, blocks, self.incarnation, to, uid=uid)

    def _warn(self, what: str) -> None:
        warnings.warn(f"cupy_swap.remote ({self.name}): {what}", RuntimeWarning, stacklevel=4)

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
        self._finish_scatters()  # grants.py
        self._run_later()  # transfers.py
        now = time.monotonic()
        if now >= self._next_expiry:
            self._next_expiry = now + min(0.01, self.peer_timeout / 20)
            self._expire(now)

    def _on_note(self, peer_name: str, note: wire.Note) -> None:
        kind = note.kind
        if not self._accepts(peer_name, note):  # peers.py: the incarnations it names
            if kind == wire.CANCEL and note.dst == self.incarnation:  # a sender disconnected here
                self._on_cancel(peer_name, note)  # confirms nothing of its grant can land: free it
            return
        if kind in (wire.SCATTERED, wire.GRANT, wire.NACK):
            self._on_answer(peer_name, note)  # staged.py: answers to this agent's staged writes
        elif kind == wire.DROP:
            self._on_drop(peer_name, note)  # peers.py
        elif kind in (wire.WRITE, wire.READ, wire.ABORT):
            self._on_transfer_note(peer_name, note)
        elif self._from_connected(peer_name, note):  # grants.py: the receiver's side of staged writes
            if kind == wire.REQUEST:
                self._on_request(peer_name, note)
            elif kind == wire.CANCEL:
                self._on_cancel(peer_name, note)
            elif kind == wire.STAGED:
                self._on_chunk(peer_name, note)

    def _on_transfer_note(self, peer_name: str, note: wire.Note) -> None:
        """A direct write landed, a read finished, or a direct write was given
        up: an :class:`Arrival`, if the registration it names is the pool's."""
        kind, pool = note.kind, self._pools.get(note.pool)
        if pool is None or pool.layout.uid != note.uid:  # not the memory its bytes touched
            if not note.uid:  # made by hand (a benchmark's raw NIXL transfer), or by an older cupy_swap
                why = "it names no registration"
            else:
                now = "is not registered" if pool is None else f"is registration {pool.layout.uid} now"
                why = f"that registration was dropped (the pool {now})"
            self._warn(
                f"a {wire.KIND_NAMES[kind]} note from {peer_name!r} for registration {note.uid} of pool "
                f"{note.pool!r} was not reported: {why}"
            )
            return
        kind_name, why = (
            ("failed", "the sender gave it up") if kind == wire.ABORT else (wire.KIND_NAMES[kind], "")
        )
        self._arrivals.append(
            Arrival(peer_name, note.pool, kind_name, note.blocks, note.xfer_id, note.src, why, note.uid)
        )
