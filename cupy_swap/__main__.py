"""``python -m cupy_swap``: see :mod:`cupy_swap.cli`."""

import sys

from .cli import main

sys.exit(main())
