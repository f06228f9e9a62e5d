"""Finding NIXL's Python API: the one place that imports it.

NIXL ships one wheel per CUDA major (``nixl-cu12``, ``nixl-cu13``, modules
``nixl_cu12`` / ``nixl_cu13``) and a meta package ``nixl`` that depends on
both.  Any one of them is enough here; at import NIXL needs only NumPy.
``CUPY_SWAP_NIXL_MODULE`` names the module to use when more than one is
installed (e.g. ``nixl_cu12._api``).
"""

from __future__ import annotations

import importlib
import os

__all__ = ["api", "unavailable_reason", "INSTALL_HINT"]

INSTALL_HINT = (
    'pip install --no-deps "nixl-cu12>=1.5.1,<1.6" (or nixl-cu13 on CUDA 13); '
    "--no-deps because the wheel declares an unpinned torch, which NIXL does not need to move host "
    "or CuPy memory"
)

_CANDIDATES = ("nixl_cu13._api", "nixl_cu12._api", "nixl._api")
_found = None
_why: str | None = None


def api():
    """The ``_api`` module of an installed NIXL (``nixl_agent``, ``nixl_agent_config``).

    Raises
    ------
    ImportError
        No NIXL wheel is importable; the message says how to install one.
    """
    global _found, _why
    if _found is not None:
        return _found
    names = [os.environ["CUPY_SWAP_NIXL_MODULE"]] if os.environ.get("CUPY_SWAP_NIXL_MODULE") else _CANDIDATES
    errors = []
    for name in names:
        try:
            _found = importlib.import_module(name)
            return _found
        except ImportError as e:  # a wheel that is absent, or present but unloadable
            errors.append(f"{name}: {e}")
    _why = "; ".join(errors)
    raise ImportError(f"cupy_swap.remote needs NIXL ({_why}); install it with {INSTALL_HINT}")


def unavailable_reason() -> str | None:
    """Why NIXL cannot be imported here, or None when it can."""
    try:
        api()
    except ImportError as e:
        return str(e)
    return None
