"""Command line: ``python -m cupy_swap [demo|bench|info|calibrate] ...`` (also ``cupy-swap``).

This module only builds the parser and dispatches; each command lives in its
own module:

- ``demo`` (the default, :mod:`.cli_demo`) swaps a demo cache in and out,
  prints GB/s against the contiguous-memcpy ceiling, and checks every byte;
- ``bench`` (:mod:`.cli_bench`) prints the default table (swap in / out of 1
  and 1250 blocks of 32 KiB) or any sweep you ask for, engine-shaped swaps
  (``--engines``), the ``--peers`` comparison, and charts them (``--plot``,
  also from a stored run: ``--from-json``); ``bench --remote`` goes to
  :mod:`.remote_bench`;
- ``info`` and ``calibrate`` (:mod:`.cli_info`) say what the library found
  and store per-device thresholds.

What they share (exit codes, the program name, the GPU check, argument
types) is in :mod:`.cli_common`, which :mod:`.remote_bench` imports too (never
this module: no import circle).  Arguments are checked (argparse, exit 2) before anything
looks for a GPU, and so are the combinations of ``bench`` options (an option
a part of the bench cannot honour is refused, not ignored) and ``--plot``'s
need for matplotlib; ``bench --gpus`` is checked against the GPU count as
soon as CUDA answers, and all of them before anything is measured.  Without
CuPy or a usable GPU every command but ``bench --from-json`` exits with
:data:`EXIT_NO_GPU` (3).  Options given without a command are the demo's
(``python -m cupy_swap --reps 5``).
"""

from __future__ import annotations

import argparse
import sys

from .. import __version__
from ..cuda.availability import no_gpu_message  # noqa: F401  (tests/gpu_helpers.py imports it from here)
from . import cli_bench, cli_demo, cli_info
from .cli_common import EXIT_MISMATCH, EXIT_NO_GPU, EXIT_OK, EXIT_TEXT, EXIT_USAGE, default_prog
from .cli_demo import DEMO_BLOCKS

__all__ = [
    "EXIT_OK",
    "EXIT_MISMATCH",
    "EXIT_USAGE",
    "EXIT_NO_GPU",
    "COMMANDS",
    "default_prog",
    "build_parser",
    "parse_args",
    "main",
]

# One line per command: the top-level --help lists them in plain text.
COMMANDS = {
    "demo": f"swap {DEMO_BLOCKS} random 32 KiB blocks out and in; print GB/s against memcpy; check every byte",
    "bench": f"the default table (1 and {DEMO_BLOCKS} blocks of 32 KiB, in and out), a sweep of your own, "
    "engine-shaped swaps against the engines' own ways, or a chart of GB/s against other ways to swap",
    "info": "what the library found: GPUs, host mapping, copy engines, modes, calibration",
    "calibrate": "measure the kernel / copy-engine thresholds of this GPU and store them",
}
# Each command's function.
RUN = {
    "demo": cli_demo.cmd_demo,
    "bench": cli_bench.cmd_bench,
    "info": cli_info.cmd_info,
    "calibrate": cli_info.cmd_calibrate,
}


def _commands_text(prog: str) -> str:
    return (
        f"commands (demo runs when none is given, and options without a command are its own: "
        f"`{prog} --reps 5`):\n"
        + "\n".join(f"  {name:<10} {line}" for name, line in COMMANDS.items())
        + f"\n\n`{prog} COMMAND --help` lists a command's options."
    )


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    """The command line.  Every argument is checked here, so a bad one is
    reported (exit 2) before any command looks for a GPU; ``bench --gpus``
    is checked against the GPU count by :func:`.cli_bench.cmd_bench`, through
    ``args.command_parser`` (each command's own parser, whose usage line its
    errors print).

    Parameters
    ----------
    prog : str, optional
        The program name in usage lines; :func:`default_prog` by default.
        A command's parser is named ``"{prog} {command}"``.
    """
    prog = prog or default_prog()
    p = argparse.ArgumentParser(
        prog=prog,
        usage="%(prog)s [-h] [--version] [COMMAND] [options]",
        description="Swap paged KV-cache blocks between GPU memory and pinned host memory; "
        "measure and check it on this machine.",
        epilog=f"{_commands_text(prog)}\n\n{EXIT_TEXT}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"cupy_swap {__version__}")
    # The commands are listed once, in the epilog; argparse's own list is hidden.
    sub = p.add_subparsers(dest="command", metavar="COMMAND", help=argparse.SUPPRESS)

    def command(name: str, epilog: str = ""):
        parser = sub.add_parser(
            name,
            prog=f"{prog} {name}",
            description=COMMANDS[name],
            epilog=f"{epilog}\n\n{EXIT_TEXT}" if epilog else EXIT_TEXT,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        parser.set_defaults(command_parser=parser)
        return parser

    cli_demo.add_arguments(command("demo"))
    cli_bench.add_arguments(command("bench", epilog=cli_bench.bench_examples(prog)))
    command("info").set_defaults(reps=0)
    cli_info.add_calibrate_arguments(command("calibrate"))
    return p


def _is_top_level_option(token: str) -> bool:
    """``-h``, ``--help``, ``--version`` or an abbreviation argparse takes for one."""
    return token == "-h" or (len(token) > 2 and any(o.startswith(token) for o in ("--help", "--version")))


def parse_args(argv=None, prog: str | None = None) -> argparse.Namespace:
    """Parse a command line (``sys.argv[1:]`` by default).  With no command,
    the demo runs, and options before any command are the demo's:
    ``--reps 5`` is ``demo --reps 5``; ``-h`` and ``--version`` stay the top
    level's.

    Raises
    ------
    SystemExit
        Code 2 (argparse) for a bad command line, 0 after ``--help`` or
        ``--version``.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or (argv[0].startswith("-") and not _is_top_level_option(argv[0])):
        argv = ["demo", *argv]
    args, extra = build_parser(prog).parse_known_args(argv)
    if extra:  # argparse leaves these to the top level; the command's own usage says more
        args.command_parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["bench"] and "--remote" in argv:  # transfers to another process, through NIXL
        from .remote_bench import main as remote_main

        return remote_main([a for a in argv[1:] if a != "--remote"])
    if argv[:1] == ["bench"] and "--pin" in argv:  # pinning host pools (issue 41): tools/pin_bench.py
        from .pin_bench import main as pin_main

        return pin_main([a for a in argv[1:] if a != "--pin"])
    args = parse_args(argv)
    return RUN[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
