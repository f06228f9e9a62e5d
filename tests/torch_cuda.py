"""torch with CUDA for GPU test modules: ``torch = require_torch_cuda()`` at
module level skips the module, saying why, where either is missing."""

import pytest

TORCH_REASON = 'needs PyTorch: pip install torch, or the torch extra (pip install -e ".[cuda12,test,torch]")'


def require_torch_cuda():
    """The torch module, or a module-level skip."""
    torch = pytest.importorskip("torch", reason=TORCH_REASON)
    if not torch.cuda.is_available():  # pragma: no cover - depends on the machine
        pytest.skip(
            "needs PyTorch with CUDA (this torch build or machine has none): install a CUDA build of torch",
            allow_module_level=True,
        )
    return torch
