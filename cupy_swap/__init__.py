"""cupy_swap: move paged KV-cache blocks between GPU memory and pinned host
memory at the speed of the PCIe link, in one kernel launch per swap.

Public API::

    host = cupy_swap.empty_pinned((num_blocks, 16, 8, 128), "float16")
    sw = cupy_swap.BlockSwapper(max_blocks=4096)
    event = sw.swap_in(host, gpu_cache, [(src_block, dst_block), ...])
"""

from . import hostpool  # issue 41: pools of any size, pinned in chunks, NUMA-placed
from .cuda.availability import CudaUnavailableError
from .cuda.memory import empty_pinned, is_pinned, register_host, unregister_host, zeros_pinned
from .graphs.graph_swap import GraphSwap
from .hostpool import PinError, PinHandle, pin_array, pin_pool, pin_shared
from .hostpool.shared import shared_pinned, unlink_shared
from .swapper import BlockSwapper, PreparedSwap

__version__ = "0.3.0.dev0"  # a development version until 0.3.0 is released (CHANGELOG.md)


def __getattr__(name: str):
    # SwapEvent subclasses cupy.cuda.Event, so it is built when first asked
    # for (importing cupy_swap does not import CuPy); it is left out of
    # __all__ so that `from cupy_swap import *` works without CuPy.
    if name == "SwapEvent":
        from .cuda.availability import cuda_unavailable_error
        from .cuda.streams import swap_event_class

        try:
            return swap_event_class()
        except ImportError as e:  # no CuPy: say so and how to install it, as every other entry point
            err = cuda_unavailable_error(e, "cupy_swap.SwapEvent")
            if err is None:
                raise
            raise err from e
    raise AttributeError(f"module 'cupy_swap' has no attribute {name!r}")


__all__ = [
    "BlockSwapper",
    "PreparedSwap",
    "GraphSwap",
    "CudaUnavailableError",
    "empty_pinned",
    "zeros_pinned",
    "shared_pinned",
    "unlink_shared",
    "register_host",
    "unregister_host",
    "is_pinned",
    "hostpool",
    "pin_pool",
    "pin_shared",
    "pin_array",
    "PinHandle",
    "PinError",
    "__version__",
]
