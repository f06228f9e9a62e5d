"""``python -m cupy_swap``: the command-line tools (see ``cupy_swap.tools.cli``)."""

import sys

from .tools.cli import main

sys.exit(main())
