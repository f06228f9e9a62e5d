"""Bytes that travel between agents: the metadata blob a side exports, and
the notifications that ride on transfers.

Metadata blob: ``b"CSWAPMD3"``, a little-endian u32 length, a UTF-8 JSON
header ``{"agent": name, "incarnation": nonce, "pools": {name:
PoolLayout.to_dict()}}`` (the pools' virtual addresses, strides and sizes),
then NIXL's own agent metadata (which holds the memory keys: whoever has the
blob can read and write the registered pools).

Notification: ``b"CSN3"``, then ``<B kind, Q transfer id, Q sender's
incarnation, Q receiver's incarnation, Q pool registration, H name
length>``, the pool name (UTF-8), then the block indices as little-endian
int32.  An incarnation is a random nonzero 64-bit nonce an agent draws when
it starts: a note names whom it is from and whom it is for, so a restarted
process under the same name never answers (or is answered for) its
predecessor's transfers.  The registration is the ``uid`` of the pool's
:class:`PoolLayout` (an agent numbers its registrations from 1): a note
concerns that registration only, so a pool dropped and registered again
under the same name is never told what was done to its predecessor.

Kinds: ``WRITE``/``READ`` ride on transfers (the blocks written or read),
``STAGED`` on each chunk of a staged write (blocks ``[start, count]``: the
chunk fills granted slots ``start..start+count-1``, which belong in the
request's destination blocks ``start..``); ``DROP`` (that registration is
gone) and the staged path's handshake are sent on their own: ``REQUEST``
(sender -> receiver, blocks ``[dst...]``: slots of the pool's receive run
wanted for these destination blocks, refused unless the registration is
the pool's), ``GRANT`` (blocks ``[offset]``: slots
``offset..offset+n-1`` are this transfer's), ``SCATTERED`` (the blocks are in
place, the slots free again), ``NACK`` (refused, blocks ``[reason]``, one of
:data:`NACK_REASONS`; the receiver may keep the granted slots until the
sender confirms), ``CANCEL`` (sender -> receiver: nothing of this transfer
can land any more, after a failure, a close or a refusal: the granted or
requested slots may be freed; accepted from a sender the receiver
disconnected, which is how its slots come back before the deadline) and
``ABORT`` (sender -> receiver, blocks ``[dst...]``: a direct write into these
blocks failed or was closed and nothing of it can land any more).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass

import numpy as np

from .layout import PoolLayout

__all__ = ["pack_metadata", "unpack_metadata", "Note", "pack_note", "unpack_note", "WRITE", "READ"]

_MD_MAGIC = b"CSWAPMD3"  # 3: notes name the pool's registration (CSN3)
_NOTE_MAGIC = b"CSN3"
_NOTE_HEAD = struct.Struct("<BQQQQH")

WRITE, READ, STAGED, DROP, SCATTERED, REQUEST, GRANT, NACK, CANCEL, ABORT = range(1, 11)
KIND_NAMES = {
    WRITE: "write",
    READ: "read",
    STAGED: "staged",
    DROP: "drop",
    SCATTERED: "scattered",
    REQUEST: "request",
    GRANT: "grant",
    NACK: "nack",
    CANCEL: "cancel",
    ABORT: "abort",
}
NO_STAGING, TOO_MANY, BAD_BLOCKS, NO_GRANT, DROPPED, EXPIRED, DISCONNECTED = range(1, 8)
NACK_REASONS = {
    NO_STAGING: "the receiver has no such pool with a staging run",
    TOO_MANY: "more blocks than the receiver's receive run holds",
    BAD_BLOCKS: "destination blocks out of range, repeated, or not the granted count",
    NO_GRANT: "no slots were granted to this transfer (cancelled, or the peer was disconnected)",
    DROPPED: "the receiver dropped the pool",
    EXPIRED: "its chunks did not arrive within the receiver's deadline (peer_timeout)",
    DISCONNECTED: "the receiver disconnected this sender",
}


def pack_metadata(agent: str, pools: dict, nixl_md: bytes, incarnation: int = 0) -> bytes:
    """The blob a side hands its peer (``pools``: name -> PoolLayout)."""
    pools_d = {k: v.to_dict() for k, v in pools.items()}
    head = json.dumps({"agent": agent, "incarnation": incarnation, "pools": pools_d}).encode()
    return _MD_MAGIC + struct.pack("<I", len(head)) + head + bytes(nixl_md)


def unpack_metadata(blob: bytes) -> tuple[str, dict, bytes, int]:
    """``(agent name, {name: PoolLayout}, NIXL metadata, incarnation)`` of a blob.

    Raises
    ------
    ValueError
        Not a blob made by :func:`pack_metadata`.
    """
    blob = bytes(blob)
    if not blob.startswith(_MD_MAGIC) or len(blob) < len(_MD_MAGIC) + 4:
        raise ValueError(
            "connect: expected metadata exported by this version of cupy_swap.remote (RemoteAgent.metadata())"
        )
    (n,) = struct.unpack_from("<I", blob, len(_MD_MAGIC))
    start = len(_MD_MAGIC) + 4
    head = json.loads(blob[start : start + n])
    pools = {k: PoolLayout.from_dict(v) for k, v in head["pools"].items()}
    return head["agent"], pools, blob[start + n :], int(head.get("incarnation", 0))


@dataclass(frozen=True)
class Note:
    """A decoded notification: ``kind`` (WRITE, READ, ...), the transfer id
    (the sender's of the transfer it concerns), the pool it concerns and its
    registration (``uid``; 0: none named), block indices (int32, shape
    (N,)), and the incarnations of the agent that sent the note (``src``)
    and of the one it is for (``dst``)."""

    kind: int
    xfer_id: int
    pool: str
    blocks: np.ndarray
    src: int = 0
    dst: int = 0
    uid: int = 0


def pack_note(
    kind: int, xfer_id: int, pool: str, blocks=(), src: int = 0, dst: int = 0, *, uid: int = 0
) -> bytes:
    """The bytes of a :class:`Note` (``uid``: the registration of ``pool`` it concerns)."""
    name = pool.encode()
    return (
        _NOTE_MAGIC
        + _NOTE_HEAD.pack(kind, xfer_id, src, dst, uid, len(name))
        + name
        + np.ascontiguousarray(blocks, dtype="<i4").tobytes()
    )


def unpack_note(msg: bytes) -> Note | None:
    """The :class:`Note` in ``msg``, or None for a message that is not ours."""
    if not msg.startswith(_NOTE_MAGIC):
        return None
    kind, xfer_id, src, dst, uid, n = _NOTE_HEAD.unpack_from(msg, len(_NOTE_MAGIC))
    start = len(_NOTE_MAGIC) + _NOTE_HEAD.size
    pool = msg[start : start + n].decode()
    blocks = np.frombuffer(msg, dtype="<i4", offset=start + n).copy()
    return Note(kind, xfer_id, pool, blocks, src, dst, uid)
