"""The errors of :mod:`cupy_swap.remote`, in one place so callers can catch them."""

from __future__ import annotations

__all__ = ["RemoteError", "LayoutMismatchError", "PoolDroppedError", "TransferError"]


class RemoteError(RuntimeError):
    """Base class of the errors below."""


class LayoutMismatchError(RemoteError, ValueError):
    """Two pools that a transfer would pair differ in part count, block bytes
    or memory kind; raised at ``connect()`` (pools of one name) or at the first
    transfer between two differently named pools, before anything is posted."""


class PoolDroppedError(RemoteError):
    """The peer dropped the pool (or never had it): the transfer was refused
    before anything was posted."""


class TransferError(RemoteError):
    """NIXL reported a failed transfer (e.g. the peer died or disconnected).
    The destination blocks of that mapping hold undefined bytes; all others
    are untouched."""
