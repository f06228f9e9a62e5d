"""Names for the argument types of the public API, for annotations.

The library takes arrays from several frameworks without importing them, so
these are documentation-grade aliases (``Any`` underneath), not checks: the
checks happen at run time and raise with a message that names the argument.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

#: A ``cupy.ndarray``, a torch tensor, a NumPy array in pinned memory, or any
#: object with ``__cuda_array_interface__`` / DLPack.
Array = Any
#: One array, or a sequence of arrays (the parts of a swap).
Parts = Array | Sequence[Array]
#: ``(N, 2)`` integer rows ``(src_block, dst_block)``: a list of pairs, a NumPy
#: array, a torch CPU tensor, or (int64) a CuPy array / torch CUDA tensor.
Mapping = Any
#: A ``cupy.cuda.Stream``, a ``torch.cuda.Stream``, a raw ``cudaStream_t`` int, or None.
Stream = Any
#: An event or stream (CuPy or torch, or a raw stream handle), or a sequence of them.
WaitFor = Any
