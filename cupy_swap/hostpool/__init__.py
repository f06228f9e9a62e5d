"""Host pools at production size (issue 41): any size pinned in chunks cut at
block-row boundaries, optionally in a background thread behind a handle,
placed on the NUMA node of the GPU that uses them, shared between processes,
and never breaking another thread's capture or leaving a CUDA error pending.

One idea per module:

- :mod:`.settings`  the chunk size (getter, setter, reset, context manager,
  ``CUPY_SWAP_PIN_CHUNK_BYTES``);
- :mod:`.chunks`    where a pool is cut (pure arithmetic);
- :mod:`.numa`      which node(s) a pool's pages go to, and binding them;
- :mod:`cupy_swap.cuda.pools` (below this package, which feeds it) the pools
  being pinned, and what a swap may read of them;
- :mod:`.handle`    registering chunk by chunk, the :class:`PinHandle`;
- :mod:`.errors`    one clear error for a failed registration, no pending one;
- :mod:`.progress`  a text progress bar;
- :mod:`.shared`    POSIX shared-memory segments, and ``shared_pinned`` over them;
- :mod:`.api`       ``pin_pool``, ``pin_shared``, ``pin_array``.

Example::

    handle = cupy_swap.pin_pool((num_blocks, 16, 8, 128), "float16", background=True,
                                progress=cupy_swap.hostpool.ProgressBar())
    op = sw.prepare(gpu, handle.usable)     # rows pinned so far; all of them after
    handle.wait(timeout=600)                # True when every chunk is pinned
"""

from .api import pin_array, pin_pool, pin_shared
from .errors import PinError
from .handle import PinHandle, Progress
from .numa import Placement
from .progress import ProgressBar
from .settings import ENV, chunk_bytes, chunk_bytes_set, reset_chunk_bytes, set_chunk_bytes

__all__ = [
    "pin_pool",
    "pin_shared",
    "pin_array",
    "PinHandle",
    "Progress",
    "PinError",
    "Placement",
    "ProgressBar",
    "ENV",
    "chunk_bytes",
    "set_chunk_bytes",
    "reset_chunk_bytes",
    "chunk_bytes_set",
]
