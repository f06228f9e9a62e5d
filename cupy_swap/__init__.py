"""cupy_swap: move paged KV-cache blocks between GPU memory and pinned host
memory at the speed of the PCIe link, in one kernel launch per swap.

Public API::

    host = cupy_swap.empty_pinned((num_blocks, 16, 8, 128), "float16")
    sw = cupy_swap.BlockSwapper(max_blocks=4096)
    event = sw.swap_in(host, gpu_cache, [(src_block, dst_block), ...])
"""

from .cuda.availability import CudaUnavailableError
from .cuda.memory import empty_pinned, is_pinned, register_host, unregister_host, zeros_pinned
from .cuda.shared import shared_pinned, unlink_shared
from .swapper import BlockSwapper, PreparedSwap

__version__ = "0.1.0"

__all__ = [
    "BlockSwapper",
    "PreparedSwap",
    "CudaUnavailableError",
    "empty_pinned",
    "zeros_pinned",
    "shared_pinned",
    "unlink_shared",
    "register_host",
    "unregister_host",
    "is_pinned",
    "__version__",
]
