"""The staged path's two ends: gather a mapping's source blocks into slots
``0..n-1`` of the pool's contiguous *send* run before NIXL moves it, and
scatter slots ``offset..offset+n-1`` of its *receive* run (the slots the
receiver granted that transfer) into the destination blocks after it arrived.

Every part is seen as bytes, ``(num_blocks, block_bytes)`` uint8 with the
part's own axis-0 stride, so staging needs no dtype (bfloat16 included).
Host pools gather and scatter with NumPy (tested on the CPU).  GPU pools
gather with a cupy_swap prepared op into pinned staging on the caller's
stream (torch's current stream for torch pools when none is given, CuPy's
otherwise) and scatter with another on the stager's stream (marked below:
not run on the CPU machine; the GPU tests run them).
"""

from __future__ import annotations

import numpy as np

import cupy_swap as cs

from .layout import PartLayout

__all__ = ["host_bytes", "alloc_staging", "HostStager", "GpuStager"]

# Host blocks of at least this many bytes are gathered one row copy at a
# time (1250 x 32 KiB: 9.3 ms against 29.4 for np.take; 4 KiB: 1.5 against
# 2.1; 512 B: 1.1 against 0.2; benchmarks/NOTES.md, item 44).
ROW_COPY_BYTES = 4096


class _Interface:
    """Lets NumPy view foreign host bytes while keeping their owner alive."""

    def __init__(self, owner, layout: PartLayout):
        self.owner = owner
        self.__array_interface__ = {
            "data": (layout.address, False),
            "shape": (layout.num_blocks, layout.block_bytes),
            "strides": (layout.stride, 1),
            "typestr": "|u1",
            "version": 3,
        }


def host_bytes(array, layout: PartLayout) -> np.ndarray:
    """``(num_blocks, block_bytes)`` uint8 view of a host part (the owner is kept alive)."""
    return np.asarray(_Interface(array, layout))


def alloc_staging(count: int, block_bytes: int) -> np.ndarray:
    """A ``(count, block_bytes)`` uint8 staging run: pinned where CUDA
    answers (GPU pools need it; host pools do not), plain NumPy otherwise."""
    try:
        return cs.empty_pinned((count, block_bytes), "uint8")
    except cs.CudaUnavailableError:
        run = np.empty((count, block_bytes), dtype=np.uint8)
        run.fill(0)  # resident now: a transfer into untouched pages would pay the page faults
        return run


class HostStager:
    """Gather/scatter between host parts and their staging runs (NumPy).

    Parameters
    ----------
    parts : list of numpy.ndarray of shape (B, block_bytes_p), uint8
        Byte views of the pool's parts (:func:`host_bytes`).
    send, recv : list of numpy.ndarray of shape (S, block_bytes_p), uint8
        The send and receive runs, one per part.
    """

    def __init__(self, parts, send, recv):
        self.parts, self.send, self.recv = parts, send, recv

    def gather(self, src: np.ndarray, stream=None, chunk: int = 0, offset: int = 0):
        """Copy blocks ``src`` (shape (n,)) into send slots ``offset..offset+n-1``; returns None (all done)."""
        n, rows = src.shape[0], None
        for part, run in zip(self.parts, self.send):
            if part.shape[1] < ROW_COPY_BYTES:
                np.take(part, src, axis=0, out=run[offset : offset + n])
                continue
            rows = src.tolist() if rows is None else rows
            for i, j in enumerate(rows):  # one copy a row: np.take moves large rows 3x slower
                run[offset + i] = part[j]
        return None

    def scatter(self, dst: np.ndarray, offset: int = 0):
        """Copy receive slots ``offset..offset+n-1`` into blocks ``dst`` (shape (n,)); returns None (done)."""
        n = dst.shape[0]
        for part, run in zip(self.parts, self.recv):
            part[dst] = run[offset : offset + n]
        return None


class GpuStager:  # pragma: no cover - needs a GPU; tests/test_remote.py runs it on the device
    """Gather/scatter between GPU parts and pinned staging runs with one
    cupy_swap prepared op each way (one kernel launch per call).

    Parameters
    ----------
    parts : list of cupy.ndarray of shape (B, block_bytes_p), uint8
        Byte views of the pool's GPU parts.
    send, recv : list of numpy.ndarray of shape (S, block_bytes_p), uint8, pinned
    device : int
    torch_parts : bool
        The pool holds torch tensors: a gather without ``stream`` is ordered
        on torch's current stream (as the direct path's :func:`stream_ready`),
        not CuPy's.  Not run on a GPU yet.
    """

    def __init__(self, parts, send, recv, device: int, torch_parts: bool = False):
        import cupy

        self._cupy = cupy
        self.device, self.torch_parts = device, torch_parts
        self.swapper = cs.BlockSwapper(max_blocks=max(send[0].shape[0], recv[0].shape[0]), device=device)
        self.to_staging = self.swapper.prepare(parts, send)
        self.from_staging = self.swapper.prepare(recv, parts)
        with cupy.cuda.Device(device):
            self.stream = cupy.cuda.Stream(non_blocking=True)

    def gather(self, src: np.ndarray, stream=None, chunk: int = 0, offset: int = 0):
        """Launch the gather into send slots ``offset..`` on ``stream`` (None:
        torch's current stream for torch pools, CuPy's otherwise), after the
        work queued there, one launch per ``chunk`` blocks (0: one launch);
        returns a ``ready()`` callable per chunk that says whether it finished."""
        if stream is None and self.torch_parts:
            import torch

            stream = torch.cuda.current_stream(self.device)
        n = src.shape[0]
        rows = np.stack([src, np.arange(offset, offset + n, dtype=np.int64)], axis=1)
        chunk = chunk or n
        events = [self.to_staging(rows[a : a + chunk], stream=stream) for a in range(0, n, chunk)]
        return [(lambda e=e: e.done) for e in events]

    def scatter(self, dst: np.ndarray, offset: int = 0):
        """Launch the scatter of receive slots ``offset..`` on the stager's stream; returns its event."""
        rows = np.stack([np.arange(offset, offset + dst.shape[0], dtype=np.int64), dst], axis=1)
        return self.from_staging(rows, stream=self.stream)


def gpu_bytes(array, layout: PartLayout):  # pragma: no cover - needs a GPU
    """``(num_blocks, block_bytes)`` uint8 CuPy view of a GPU part (CuPy
    array or CUDA torch tensor; the owner is kept alive)."""
    import cupy

    span = layout.span()[1]
    mem = cupy.cuda.UnownedMemory(layout.address, span, array)
    ptr = cupy.cuda.MemoryPointer(mem, 0)
    return cupy.ndarray((layout.num_blocks, layout.block_bytes), cupy.uint8, ptr, (layout.stride, 1))


def stream_ready(stream, torch_parts: bool):  # pragma: no cover - needs a GPU
    """A ``ready()`` callable that turns True once the work queued on
    ``stream`` so far has finished (None: torch's current stream for torch
    parts, CuPy's current stream otherwise).  The post waits for it; nobody
    blocks on the GPU."""
    if torch_parts:
        import torch

        s = stream if stream is not None else torch.cuda.current_stream()
        event = s.record_event()
        return event.query
    import cupy

    s = stream if stream is not None else cupy.cuda.get_current_stream()
    event = cupy.cuda.Event(block=False, disable_timing=True)
    event.record(s)
    return lambda: event.done
