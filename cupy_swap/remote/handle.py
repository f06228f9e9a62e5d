"""The handle a transfer returns: ``done()`` polls, ``wait(timeout)`` sleeps
between polls (the GIL is free while it waits) and raises on failure."""

from __future__ import annotations

import time

from .errors import TransferError

__all__ = ["Transfer"]


class Transfer:
    """One posted (or about to be posted) ``write``/``read``.

    A transfer goes through up to three steps, each polled by :meth:`done`:
    ``ready()`` (GPU data produced on the caller's stream: the post waits for
    the event recorded there), NIXL's transfer (``check_xfer_state``), and
    ``settled()`` (staged writes: the receiver scattered the blocks and
    acknowledged).

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
        self._on_error = on_error
        self.what, self.nbytes, self.num_blocks = what, nbytes, num_blocks
        self._xfer = None
        self._moved = post is None  # nothing to post (empty mapping)
        self._done = False
        self._error: TransferError | None = None
        if ready is None and post is not None:
            self._start()

    def done(self) -> bool:
        """True once the blocks are in the destination pool; False while in
        flight.

        Raises
        ------
        TransferError
            NIXL reported a failure (the peer died, disconnected, or refused).
        """
        if self._done:
            return True
        if self._error is not None:
            raise self._error
        if not self._moved:
            if self._xfer is None:
                if self._ready is not None and not self._ready():
                    return False
                self._start()
            if not self._moved:
                try:
                    state = self._nixl.check_xfer_state(self._xfer)
                except Exception as e:  # NIXL raises its own error types
                    self._fail(e)
                if state == "ERR":
                    self._fail(None)
                if state != "DONE":
                    return False
                self._finish_xfer()
        if self._settled is not None and not self._settled():
            return False
        self._done = True
        return True

    def wait(self, timeout: float | None = None) -> None:
        """Poll until :meth:`done`: yielding the GIL between the first 200
        polls (each poll also drives NIXL's progress), then sleeping 50 us
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
            Not done within ``timeout`` (the transfer is left as it is).
        """
        end = None if timeout is None else time.monotonic() + timeout
        polls, pause = 0, 50e-6
        while not self.done():
            if end is not None and time.monotonic() > end:
                raise TimeoutError(f"{self.what}: not done after {timeout} s")
            polls += 1
            if polls < 200:  # the first ~ms: yield the GIL between polls, do not sleep
                time.sleep(0)
            else:
                time.sleep(pause)
                pause = min(pause * 2, 1e-3)

    def _start(self) -> None:
        try:
            self._xfer, state = self._post()
        except Exception as e:
            self._fail(e)
        if state == "ERR":
            self._fail(None)
        if state == "DONE":
            self._finish_xfer()

    def _finish_xfer(self) -> None:
        self._moved = True
        xfer, self._xfer = self._xfer, None
        xfer.release()

    def _fail(self, cause) -> None:
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
            self._on_error()
        raise self._error from cause
