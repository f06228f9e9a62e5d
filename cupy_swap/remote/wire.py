"""Bytes that travel between agents: the metadata blob a side exports, and
the notifications that ride on transfers.

Metadata blob: ``b"CSWAPMD1"``, a little-endian u32 length, a UTF-8 JSON
header ``{"agent": name, "pools": {name: PoolLayout.to_dict()}}``, then
NIXL's own agent metadata (which holds the memory keys: whoever has the blob
can read and write the registered pools).

Notification: ``b"CSN1"``, then ``<B kind, Q transfer id, H name length>``,
the pool name (UTF-8), then the block indices as little-endian int32.

Kinds: ``WRITE``/``READ`` ride on transfers (the blocks written or read),
``STAGED`` on each chunk of a staged write (blocks ``[start, dst...]``: the
chunk fills granted slots ``start..`` and belongs in blocks ``dst``); ``DROP`` (a pool is gone) and the staged path's handshake are sent on
their own: ``REQUEST`` (sender -> receiver, blocks ``[n]``: n slots of the
pool's receive run wanted), ``GRANT`` (blocks ``[offset]``: slots
``offset..offset+n-1`` are this transfer's), ``SCATTERED`` (the blocks are in
place, the slots free again), ``NACK`` (refused, blocks ``[reason]``, one of
:data:`NACK_REASONS`) and ``CANCEL`` (sender -> receiver: the granted or
requested slots will not be written).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass

import numpy as np

from .layout import PoolLayout

__all__ = ["pack_metadata", "unpack_metadata", "Note", "pack_note", "unpack_note", "WRITE", "READ"]

_MD_MAGIC = b"CSWAPMD1"
_NOTE_MAGIC = b"CSN1"
_NOTE_HEAD = struct.Struct("<BQH")

WRITE, READ, STAGED, DROP, SCATTERED, REQUEST, GRANT, NACK, CANCEL = range(1, 10)
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
}
NO_STAGING, TOO_MANY, BAD_BLOCKS, NO_GRANT, DROPPED = range(1, 6)
NACK_REASONS = {
    NO_STAGING: "the receiver has no such pool with a staging run",
    TOO_MANY: "more blocks than the receiver's receive run holds",
    BAD_BLOCKS: "destination blocks out of range, repeated, or not the granted count",
    NO_GRANT: "no slots were granted to this transfer (cancelled, or the peer was disconnected)",
    DROPPED: "the receiver dropped the pool",
}


def pack_metadata(agent: str, pools: dict, nixl_md: bytes) -> bytes:
    """The blob a side hands its peer (``pools``: name -> PoolLayout)."""
    head = json.dumps({"agent": agent, "pools": {k: v.to_dict() for k, v in pools.items()}}).encode()
    return _MD_MAGIC + struct.pack("<I", len(head)) + head + bytes(nixl_md)


def unpack_metadata(blob: bytes) -> tuple[str, dict, bytes]:
    """``(agent name, {name: PoolLayout}, NIXL metadata)`` of a blob.

    Raises
    ------
    ValueError
        Not a blob made by :func:`pack_metadata`.
    """
    blob = bytes(blob)
    if not blob.startswith(_MD_MAGIC) or len(blob) < len(_MD_MAGIC) + 4:
        raise ValueError("connect: expected metadata exported by cupy_swap.remote (RemoteAgent.metadata())")
    (n,) = struct.unpack_from("<I", blob, len(_MD_MAGIC))
    start = len(_MD_MAGIC) + 4
    head = json.loads(blob[start : start + n])
    pools = {k: PoolLayout.from_dict(v) for k, v in head["pools"].items()}
    return head["agent"], pools, blob[start + n :]


@dataclass(frozen=True)
class Note:
    """A decoded notification: ``kind`` (WRITE, READ, ...), the sender's
    transfer id, the pool it concerns, and block indices (int32, shape (N,))."""

    kind: int
    xfer_id: int
    pool: str
    blocks: np.ndarray


def pack_note(kind: int, xfer_id: int, pool: str, blocks=()) -> bytes:
    name = pool.encode()
    return (
        _NOTE_MAGIC
        + _NOTE_HEAD.pack(kind, xfer_id, len(name))
        + name
        + np.ascontiguousarray(blocks, dtype="<i4").tobytes()
    )


def unpack_note(msg: bytes) -> Note | None:
    """The :class:`Note` in ``msg``, or None for a message that is not ours."""
    if not msg.startswith(_NOTE_MAGIC):
        return None
    kind, xfer_id, n = _NOTE_HEAD.unpack_from(msg, len(_NOTE_MAGIC))
    start = len(_NOTE_MAGIC) + _NOTE_HEAD.size
    pool = msg[start : start + n].decode()
    blocks = np.frombuffer(msg, dtype="<i4", offset=start + n).copy()
    return Note(kind, xfer_id, pool, blocks)
