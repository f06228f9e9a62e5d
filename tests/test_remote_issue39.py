"""cupy_swap.remote, the five findings of the review at 9d0871a (issue 39):
real NIXL over loopback, host pools, agents in this process; the fetch
tests against a plain local socket server.

1. a peer's slots are not granted again while its late chunk may still land;
2. an arrival is reported only on the registration its bytes landed in;
3. no lock is held across a wait (another thread's ``wait(timeout)`` returns);
4. a refresh with unchanged metadata costs no socket;
5. ``fetch_from`` has one deadline for the whole fetch and a size cap.

Each waits on conditions with deadlines, never on sleeps."""

from __future__ import annotations

import socket
import struct
import threading
import time

import pytest

from cupy_swap.remote import fetch_from

# --- 5: fetch_from, one deadline and a size cap --------------------------------------------------------


class OneShotServer:
    """Serves one connection on 127.0.0.1 with ``serve(conn, stop)`` in a thread."""

    def __init__(self, serve):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(serve,), daemon=True)
        self.thread.start()

    def _run(self, serve):
        conn, _ = self.sock.accept()
        with conn:
            try:
                serve(conn, self.stop)
            except OSError:  # the client left
                pass

    def close(self):
        self.stop.set()
        self.sock.close()
        self.thread.join(10)
        assert not self.thread.is_alive()


def test_fetch_from_trickling_server_is_bounded_by_one_deadline():
    """Finding 5: a server that sends its answer one byte at a time, each
    well within the timeout, cannot hold fetch_from past ``timeout`` (the
    deadline was per read: timeout=1 ran 6 s)."""
    blob = bytes(range(100))
    sent = [0]

    def trickle(conn, stop):
        conn.sendall(struct.pack("<I", len(blob)))
        for byte in blob:  # 100 bytes, one each 50 ms: 5 s in all
            if stop.wait(0.05):
                return
            conn.sendall(bytes([byte]))
            sent[0] += 1

    server = OneShotServer(trickle)
    try:
        start = time.monotonic()
        with pytest.raises(TimeoutError, match="within 0.5 s"):
            fetch_from("127.0.0.1", server.port, timeout=0.5)
        elapsed = time.monotonic() - start
        assert sent[0] < len(blob)  # it gave up while the server was still trickling
        assert elapsed < 3.0, elapsed  # 0.5 s and scheduling, not the 5 s of the trickle
    finally:
        server.close()


def test_fetch_from_refuses_an_answer_over_the_cap():
    """Finding 5: an answer announcing more than ``max_bytes`` is refused at
    once, naming the limit, before a byte of it is read."""

    def huge(conn, stop):
        conn.sendall(struct.pack("<I", 1 << 30) + b"x" * 16)
        stop.wait(30)  # holds the connection open: only the cap can end the fetch early

    server = OneShotServer(huge)
    try:
        with pytest.raises(ValueError, match=r"1073741824 bytes .* limit of 67108864 \(max_bytes\)"):
            fetch_from("127.0.0.1", server.port, timeout=10)
    finally:
        server.close()


@pytest.mark.parametrize("max_bytes,ok", [(64, True), (63, False)])
def test_fetch_from_reads_the_announced_bytes(max_bytes, ok):
    blob = b"m" * 64

    def whole(conn, stop):
        conn.sendall(struct.pack("<I", len(blob)) + blob)

    server = OneShotServer(whole)
    try:
        if ok:
            assert fetch_from("127.0.0.1", server.port, timeout=10, max_bytes=max_bytes) == blob
        else:
            with pytest.raises(ValueError, match="limit of 63"):
                fetch_from("127.0.0.1", server.port, timeout=10, max_bytes=max_bytes)
    finally:
        server.close()


def test_fetch_from_a_short_answer_is_not_metadata():
    def short(conn, stop):
        conn.sendall(struct.pack("<I", 10) + b"abc")

    server = OneShotServer(short)
    try:
        with pytest.raises(ValueError, match="sent 7 bytes where it announced 14"):
            fetch_from("127.0.0.1", server.port, timeout=10)
    finally:
        server.close()
