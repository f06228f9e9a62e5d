"""The handle a transfer returns: ``done()`` polls, ``wait(timeout)`` sleeps
between polls (the GIL is free while it waits) and raises on failure."""

from __future__ import annotations

import time

from .errors import RemoteError, TransferError

__all__ = ["Transfer", "SPIN_S"]

# Seconds a wait polls without sleeping: a transfer's bytes move (over TCP)
# only while someone polls, and a sleep of up to 1 ms cost 5-20 % of a
# 32 MB host -> host write (benchmarks/NOTES.md, item 44).
SPIN_S = 0.05


class Transfer:
    """One posted (or about to be posted) ``write``/``read``.

    A transfer goes through up to three steps, each polled by :meth:`done`
    (and advanced by the agent's :meth:`~RemoteAgent.poll`): ``ready()`` (GPU
    data produced on the caller's stream: the post waits for the event
    recorded there; staged writes: the receiver granted slots of its receive
    run), NIXL's transfer (``check_xfer_state``), and ``settled()`` (staged
    writes: the receiver scattered the blocks and acknowledged).

    A transfer dropped before it is done is :meth:`close` d (its NIXL handle
    released); close it yourself to give up on one that ``wait`` timed out on.

    Attributes
    ----------
    what : str
        e.g. ``"write kv -> decode/kv (1250 blocks, direct)"``.
    nbytes : int
        Bytes moved.
    num_blocks : int
        Rows of the mapping.
    """

    def __init__(
        self, nixl, what: str, nbytes: int, num_blocks: int, post, ready=None, settled=None, on_error=None
    ):
        self._nixl, self._post, self._ready, self._settled = nixl, post, ready, settled
        self._on_error = on_error  # called once, with cancel=True when nothing of ours can still land
        self.what, self.nbytes, self.num_blocks = what, nbytes, num_blocks
        self._xfer = None
        self._moved = post is None  # nothing to post (empty mapping)
        self._done = False
        self._error: TransferError | None = None
        if ready is None and post is not None:
            self._start()

    @property
    def moved(self) -> bool:
        """True once NIXL finished moving the bytes (the source may be reused;
        a staged write may still wait for the receiver's scatter)."""
        return self._moved

    def done(self) -> bool:
        """True once the blocks are in the destination pool; False while in
        flight.

        Raises
        ------
        TransferError
            NIXL reported a failure (the peer died, disconnected, or refused),
            or the transfer was closed.
        """
        if self._done:
            return True
        if not self._advance():
            return False
        if self._settled is not None:
            try:
                settled = self._settled()
            except RemoteError as e:
                self._fail(e, cancel=False)
            if not settled:
                return False
        self._done = True
        return True

    def _advance(self) -> bool:
        """Post once ready, then poll NIXL: True once the bytes moved."""
        if self._error is not None:
            raise self._error
        if self._moved:
            return True
        if self._xfer is None:
            if self._ready is not None:
                try:
                    ready = self._ready()
                except RemoteError as e:
                    self._fail(e, cancel=True)
                if not ready:
                    return False
            self._start()
            if self._moved:
                return True
        try:
            state = self._nixl.check_xfer_state(self._xfer)
        except Exception as e:  # NIXL raises its own error types
            self._fail(e)
        if state == "ERR":
            self._fail(None)
        if state != "DONE":
            return False
        self._finish_xfer()
        return True

    def wait(self, timeout: float | None = None) -> None:
        """Poll until :meth:`done`: yielding the GIL between polls for the
        first :data:`SPIN_S` seconds (each poll also drives NIXL's progress,
        which over TCP moves bytes only when polled), then sleeping 50 us
        growing to 1 ms.

        Parameters
        ----------
        timeout : float, optional
            Seconds; None waits as long as it takes.

        Raises
        ------
        TransferError
            As :meth:`done`.
        TimeoutError
            Not done within ``timeout`` (the transfer is left as it is: wait
            again, or :meth:`close` it).
        """
        start = time.monotonic()
        end = None if timeout is None else start + timeout
        spin_until, pause = start + SPIN_S, 50e-6
        while not self.done():
            now = time.monotonic()
            if end is not None and now > end:
                raise TimeoutError(f"{self.what}: not done after {timeout} s")
            if now < spin_until:
                time.sleep(0)
            else:
                time.sleep(pause)
                pause = min(pause * 2, 1e-3)

    def close(self) -> None:
        """Give up on a transfer that is not done: release its NIXL handle
        (NIXL cancels the request where it can) and forget its state; later
        :meth:`done`/:meth:`wait` raise :class:`TransferError`.  The
        destination blocks of its mapping then hold undefined bytes.  A done
        or failed transfer is left as it is."""
        if self._done or self._error is not None:
            return
        if self._moved and self._settled is None:
            self._done = True
            return
        in_flight = self._xfer is not None
        xfer, self._xfer = self._xfer, None
        if xfer is not None:
            try:
                xfer.release()
            except Exception:  # NIXL could not cancel it: it frees the handle with the agent
                pass
        self._error = TransferError(
            f"{self.what}: closed before it was done; the destination blocks of this mapping hold "
            "undefined bytes"
        )
        if self._on_error is not None:
            self._on_error(not in_flight and not self._moved)

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown, or NIXL already gone
            pass

    def _start(self) -> None:
        try:
            self._xfer, state = self._post()
        except Exception as e:
            self._fail(e, cancel=True)
        if state == "ERR":
            self._fail(None)
        if state == "DONE":
            self._finish_xfer()

    def _finish_xfer(self) -> None:
        self._moved = True
        xfer, self._xfer = self._xfer, None
        xfer.release()

    def _fail(self, cause, cancel: bool = True) -> None:
        if isinstance(cause, RemoteError):
            self._error = TransferError(
                f"{self.what} failed: {cause}. The destination blocks of this mapping hold undefined "
                "bytes; other blocks are untouched"
            )
        else:
            why = f"{type(cause).__name__}: {cause}" if cause is not None else "transfer state ERR"
            self._error = TransferError(
                f"{self.what} failed ({why}); the peer may have died or disconnected. The destination "
                "blocks of this mapping hold undefined bytes; other blocks are untouched"
            )
        xfer, self._xfer = self._xfer, None
        if xfer is not None:
            try:
                xfer.release()
            except Exception:  # an active request may refuse; NIXL frees it with the agent
                pass
        if self._on_error is not None:
            self._on_error(cancel)
        raise self._error from cause
