"""The handle a transfer returns: ``done()`` polls, ``wait(timeout)`` sleeps
between polls (the GIL is free while it waits) and raises on failure."""

from __future__ import annotations

import contextlib
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
    run), NIXL's transfers (``post(track)`` posts what is ready and says
    whether that was all: a staged write posts each chunk once its gather
    finished; each is polled with ``check_xfer_state``), and ``settled()``
    (staged writes: the receiver scattered the blocks and acknowledged; it
    raises RemoteError on a refusal or past its deadline; ``check()``, the
    same test without starting the wait for the acknowledgement, runs while
    chunks are in flight, so a refusal fails the transfer at once).

    Deadlines.  NIXL requests posted and not finished fail the transfer
    once ``timeout`` seconds pass with none of them finishing (a peer that
    died or hangs); the waits on the peer's answers have theirs in the
    agent (``peer_timeout``).

    On failure or :meth:`close`, the transfer releases its NIXL requests
    (NIXL cancels an active one, or refuses: then the agent keeps it until
    NIXL reports it finished); ``on_error()`` runs once nothing of it can
    land any more, so the agent can give the receiver's slots back.

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
        self,
        nixl,
        what: str,
        nbytes: int,
        num_blocks: int,
        post,
        ready=None,
        settled=None,
        on_error=None,
        *,
        lock=None,
        check=None,
        timeout: float | None = None,
        on_moved=None,
        linger=None,
    ):
        self._nixl, self._post, self._ready, self._settled = nixl, post, ready, settled
        self._check = check
        self._on_error = on_error  # called once, when nothing of this transfer can land any more
        self._lingering = False  # failed, with NIXL requests the agent keeps until they end
        self._on_moved = on_moved  # called once, when every byte moved
        self._linger = linger  # linger(xfers, then): keep requests NIXL refused to release, then call then()
        self._lock = lock if lock is not None else contextlib.nullcontext()
        self._timeout = timeout
        self.what, self.nbytes, self.num_blocks = what, nbytes, num_blocks
        self._xfers: list = []  # posted NIXL transfers not finished yet
        self._since = 0.0  # when a request was last posted or finished (the deadline runs from it)
        self._all_posted = self._moved = post is None  # None: nothing to post (empty mapping)
        self._done = self._advancing = False
        self._error: TransferError | None = None
        if ready is None and post is not None:
            self._post_ready()

    @property
    def moved(self) -> bool:
        """True once NIXL finished moving the bytes (the source may be reused;
        a staged write may still wait for the receiver's scatter)."""
        return self._moved

    def _busy(self) -> bool:
        """Still able to post or touch NIXL requests (their descriptor lists
        and registered memory must stay): not settled, or failed with
        requests NIXL could not cancel that the agent keeps until they end."""
        return (self._error is None and not self._moved) or self._lingering

    def done(self) -> bool:
        """True once the blocks are in the destination pool, on the live
        incarnation of the peer the transfer was posted to; False while in
        flight.

        Raises
        ------
        TransferError
            NIXL reported a failure (the peer died, disconnected, restarted
            or refused), a deadline passed, or the transfer was closed.
        """
        if self._done:
            return True
        with self._lock:
            if self._done:
                return True
            if not self._advance():
                return False
            if self._settled is not None:
                try:
                    settled = self._settled()
                except RemoteError as e:
                    self._fail(e)
                if not settled:
                    return False
            self._done = True
            return True

    def _advance(self) -> bool:
        """Post what is ready, then poll NIXL: True once every byte moved.
        Not re-entered: the agent's progress, driven from inside ``ready()``,
        skips the transfer that is advancing."""
        if self._error is not None:
            raise self._error
        if self._moved:
            return True
        if self._advancing:
            return False
        self._advancing = True
        try:
            return self._advance_once()
        finally:
            self._advancing = False

    def _advance_once(self) -> bool:
        if not self._all_posted:
            if self._ready is not None:
                try:
                    ready = self._ready()
                except RemoteError as e:
                    self._fail(e)
                if not ready:
                    return False
                self._ready = None  # ready once: post() waits for the rest itself
            self._post_ready()
        elif self._check is not None:  # all posted: a refusal must not wait for transfers that never end
            try:
                self._check()
            except RemoteError as e:
                self._fail(e)
        still = []
        for xfer in self._xfers:
            try:
                state = self._nixl.check_xfer_state(xfer)
            except Exception as e:  # NIXL raises its own error types
                self._fail(e)
            if state == "ERR":
                self._fail(None)
            if state == "DONE":
                xfer.release()
            else:
                still.append(xfer)
        if len(still) != len(self._xfers):
            self._since = time.monotonic()
        elif still and self._timeout is not None and time.monotonic() - self._since > self._timeout:
            self._fail(
                RemoteError(
                    f"NIXL moved nothing of it for {self._timeout} s (peer_timeout): the peer may have died "
                    "or hung"
                )
            )
        self._xfers = still
        self._moved = self._all_posted and not still
        if self._moved and self._on_moved is not None:
            on_moved, self._on_moved = self._on_moved, None
            on_moved()
        return self._moved

    def wait(self, timeout: float | None = None) -> None:
        """Poll until :meth:`done`: yielding the GIL between polls for the
        first :data:`SPIN_S` seconds (each poll also drives NIXL's progress,
        which over TCP moves bytes only when polled), then sleeping 50 us
        growing to 1 ms.  Another thread may use the agent between polls.

        Parameters
        ----------
        timeout : float, optional
            Seconds; None waits as long as it takes (the agent's
            ``peer_timeout`` still bounds every wait on the peer).

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
        """Give up on a transfer that is not done: release its NIXL requests
        (NIXL cancels an active one; one it cannot cancel is kept by the agent
        until NIXL reports it finished) and forget its state; later
        :meth:`done`/:meth:`wait` raise :class:`TransferError`.  Once nothing
        of it can land any more, the receiver is told (its slots are freed,
        and it records the blocks as failed).  The destination blocks of its
        mapping then hold undefined bytes.  A done or failed transfer is left
        as it is."""
        with self._lock:
            if self._done or self._error is not None:
                return
            if self._moved and self._settled is None:
                self._done = True
                return
            self._error = TransferError(
                f"{self.what}: closed before it was done; the destination blocks of this mapping hold "
                "undefined bytes"
            )
            self._give_up()

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown, or NIXL already gone
            pass

    def _post_ready(self) -> None:
        """Post what ``post(track)`` finds ready: it hands each NIXL request to
        ``track`` before posting it (so a failure later in the same call
        still knows it may land), and returns whether everything is posted;
        it raises RemoteError or NIXL's errors."""
        try:
            before = len(self._xfers)
            self._all_posted = self._post(self._xfers.append)
            if len(self._xfers) != before:
                self._since = time.monotonic()
        except Exception as e:
            self._fail(e)

    def _give_up(self) -> None:
        """Release the NIXL requests; call ``on_error`` once none of them can land."""
        xfers, self._xfers = self._xfers, []
        stuck = []
        for xfer in xfers:
            try:
                xfer.release()  # NIXL cancels an active request, or refuses
            except Exception:
                stuck.append(xfer)
        on_error, self._on_error = self._on_error, None
        self._on_moved = None
        if stuck and self._linger is not None:
            self._lingering = True  # busy until NIXL let go of them: their memory must stay

            def then():
                self._lingering = False
                if on_error is not None:
                    on_error()

            self._linger(stuck, then)
        elif not stuck and on_error is not None:
            on_error()

    def _abort(self, cause) -> None:
        """Fail the transfer from outside (its peer restarted, its pool was dropped), without raising."""
        with self._lock:
            if self._done or self._error is not None:
                return
            try:
                self._fail(cause)
            except TransferError:
                pass

    def _fail(self, cause) -> None:
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
        self._give_up()
        raise self._error from cause
