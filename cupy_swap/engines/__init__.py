"""Adapters that let serving engines load cupy_swap as they are.

* :mod:`cupy_swap.engines.vllm`: an ``OffloadingSpec`` that vLLM's offloading
  connector loads by ``spec_module_path``; its worker moves each transfer with
  one prepared-op call over every KV cache tensor.
* :mod:`cupy_swap.engines.sglang`: sgl-kernel's ``kvcacheio`` transfer
  functions (names, signatures, semantics), and a patch that routes SGLang's
  HiCache host pools to them.
* :mod:`cupy_swap.engines.chunks` and :mod:`cupy_swap.engines.offload`: the
  engine-independent parts (NumPy row arithmetic, the in-order worker).

Nothing here imports vLLM, SGLang, torch or CuPy when it is imported: each
engine's classes are built when first asked for.  ``from cupy_swap import
engines`` then ``engines.vllm`` imports the submodule on first use.
"""

from __future__ import annotations

import importlib

_SUBMODULES = ("chunks", "offload", "sglang", "vllm")


def __getattr__(name: str):
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = list(_SUBMODULES)
