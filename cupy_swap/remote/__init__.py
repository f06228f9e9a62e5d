"""cupy_swap.remote: the block mapping of ``swap()``, to another process or
host, through NIXL (UCX backend).

Optional: needs a NIXL wheel (``pip install --no-deps nixl-cu12``, or
``nixl-cu13``).  Importing this package does not import NIXL; making a
:class:`RemoteAgent` does.

Modules, one idea each: ``agent`` (RemoteAgent, put together from
``pools``, ``peers`` and incarnations, ``transfers``, ``staged`` and
``grants`` (the two sides of a staged write), ``notes`` (notifications,
Arrival), ``listener`` and ``lock``, each with its invariant at its top),
``handle`` (Transfer), ``layout`` (pool layouts and pairing), ``mapping``
(checks and descriptor indices), ``staging`` (gather/scatter for the staged
path), ``wire`` (metadata and notification bytes), ``exchange`` (carrying
metadata on one host: a file, or ``fetch_from`` an agent's
``listen_port``), ``errors``.  Outcomes, deadlines, threads and what a
listener exposes: ``cupy_swap/remote/README.md``.
"""

from ._nixl import unavailable_reason
from .agent import Arrival, RemoteAgent
from .errors import LayoutMismatchError, PoolDroppedError, RemoteError, TransferError
from .exchange import fetch, fetch_from, publish
from .handle import Transfer
from .layout import PoolLayout

__all__ = [
    "RemoteAgent",
    "Arrival",
    "Transfer",
    "PoolLayout",
    "RemoteError",
    "LayoutMismatchError",
    "PoolDroppedError",
    "TransferError",
    "publish",
    "fetch",
    "fetch_from",
    "unavailable_reason",
]
