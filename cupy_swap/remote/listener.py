"""The metadata listener.  Invariant: it serves the bytes of the agent's
:meth:`~RemoteAgent.metadata` to whoever connects to ``(host, port)``,
reads nothing from its clients, gives each connection a deadline (a client
that never reads cannot hold it), and never keeps the agent alive or waits
while holding the agent's lock (the agent stops it without the lock).

Each connection gets a little-endian u32 length and the blob, then is
closed; :func:`~cupy_swap.remote.fetch_from` reads it, under one deadline
and a size cap.  Whoever can reach the address gets the metadata, and with
it the pools (``cupy_swap/remote/README.md``: what a listener exposes):
loopback unless the agent was given another ``listen_host``.  NIXL's own
listener is never started (NIXL 1.5 binds it to every interface).
"""

from __future__ import annotations

import socket
import struct
import threading
import weakref

__all__ = ["MetadataServer"]


class MetadataServer:
    """Serves an agent's metadata over TCP at ``(host, port)``: each
    connection gets a little-endian u32 length and the blob, then is closed.
    It reads nothing from its clients."""

    def __init__(self, agent, host: str, port: int):
        self._agent = weakref.ref(agent)
        self._sock = socket.create_server((host, port))
        self._sock.settimeout(0.2)
        self.address = self._sock.getsockname()
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._serve, name=f"cupy_swap metadata {agent.name}", daemon=True
        )
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn:
                if not self._answer(conn):
                    return

    def _answer(self, conn) -> bool:
        """Send the metadata on ``conn``; False once the agent is gone.  The
        agent is referenced only here, not while the server waits."""
        conn.settimeout(5.0)  # the deadline of the whole send: a client that never reads cannot hold it
        agent = self._agent()
        if agent is None:
            return False
        try:
            blob = agent.metadata()
            conn.sendall(struct.pack("<I", len(blob)) + blob)
        except Exception:  # a client that left; an agent closing
            pass
        return True

    def close(self) -> None:
        self._stop.set()
        self._sock.close()
        self._thread.join(2)
