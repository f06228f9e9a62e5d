"""``info`` (what the library found on this machine) and ``calibrate``
(measure and store this GPU's kernel / copy-engine thresholds)."""

from __future__ import annotations

import json
import sys

from .. import __version__
from ..cuda.availability import no_gpu_message
from . import cli_common as common

__all__ = ["cmd_info", "cmd_calibrate", "add_calibrate_arguments"]


def cmd_info(args) -> int:
    from ..cuda import copy_engine as dma
    from ..cuda import memory

    ok, what = common.gpu_status()
    print(f"cupy_swap {__version__}")
    if not ok:
        # Without CuPy nothing is known about the GPUs: say what is missing, not "no GPU"; on
        # stderr, as every other command's diagnosis.
        missing = "CuPy: missing" if what.startswith("CuPy") else "GPU: none"
        print(f"cupy_swap: {missing} ({no_gpu_message(what)})", file=sys.stderr)
        return common.EXIT_NO_GPU
    import cupy
    from cupy.cuda import runtime

    for line in common.environment_lines():
        print(line)
    for dev in range(runtime.getDeviceCount()):
        props = runtime.getDeviceProperties(dev)
        name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
        attr = lambda a, dev=dev: runtime.deviceGetAttribute(a, dev)  # noqa: E731
        mapped, why = memory.host_mapping_status(dev)
        print(f"GPU {dev}: {name}, compute capability {props['major']}.{props['minor']}")
        print(f"  SMs: {props['multiProcessorCount']}, memory: {props['totalGlobalMem'] / 2**30:.1f} GiB")
        print(f"  unified addressing: {bool(attr(runtime.cudaDevAttrUnifiedAddressing))}")
        print(f"  can map host memory: {bool(attr(runtime.cudaDevAttrCanMapHostMemory))}")
        print(f"  copy engines (async engine count): {attr(runtime.cudaDevAttrAsyncEngineCount)}")
        print(f"  host memory reachable by kernels: {'yes' if mapped else 'no'} ({why})")
        modes = (
            ["auto", "kernel", "dma", "staged"]
            if mapped
            else ["auto (dma or staged for host arrays)", "dma", "staged", "kernel (GPU->GPU only)"]
        )
        print(f"  modes: {', '.join(modes)}")
        print(f"  host pools (pin_pool): {_placement_line(dev)}")  # issue 41
    print(
        f"cuMemcpyBatchAsync: {'available' if dma.batch_available() else 'not available (one memcpy per copy)'}"
    )
    from ..hostpool import ENV, chunk_bytes

    print(f"host pools pinned in chunks of at most {chunk_bytes() / 2**30:g} GiB ({ENV} to change)")
    from ..cuda.settings import calibration_path, load_calibration

    path = calibration_path(runtime.getDevice())
    cal = load_calibration(runtime.getDevice())
    print(f"calibration: {path} ({'loaded: ' + json.dumps(cal) if cal else 'none; built-in defaults'})")
    print(f"CuPy {cupy.__version__}")
    return 0


def _placement_line(dev: int) -> str:
    """Where a pool for GPU ``dev`` goes (:mod:`cupy_swap.hostpool.numa`)."""
    from ..hostpool import numa

    try:
        return numa.placement_for([dev]).describe()
    except Exception as e:  # noqa: BLE001 - info reports, it does not fail
        return f"unknown ({type(e).__name__}: {e})"


def cmd_calibrate(args) -> int:
    common.require_gpu()
    from .calibrate import calibrate

    result, path = calibrate(reps=args.reps, progress=print)
    print(f"wrote {path}: {json.dumps(result)}")
    return common.EXIT_OK


def add_calibrate_arguments(parser) -> None:
    parser.add_argument(
        "--reps", type=common.positive_int, default=20, help="timed repetitions per measurement"
    )
