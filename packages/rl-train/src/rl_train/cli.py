"""The ``rl-train`` command line.

``rl-train demo`` will run a real training job on the embedded default (a tiny model and task
that ship with the package, on CPU). The training loops land with the rl-train issue; until then
the command exists, explains that, and exits with status 2 so that scripts cannot mistake it for
a finished run.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from rl_train import __version__

#: Exit status of a sub-command that exists but is not built yet.
EXIT_NOT_BUILT = 2


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser of the ``rl-train`` command."""
    parser = argparse.ArgumentParser(
        prog="rl-train",
        description="Reinforcement-learning fine-tuning of causal language models.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.add_parser(
        "demo",
        help="train the embedded tiny model on the embedded task, on CPU",
        description="Train the embedded tiny model on the embedded task, on CPU.",
    )
    return parser


def _demo() -> int:
    print(
        "rl-train demo: not built yet.\n"
        "The demo training run (tiny embedded model and task, on CPU) arrives with the rl-train\n"
        "training loops; this release only provides the package layout and the command itself.\n"
        "Nothing was trained.",
        file=sys.stderr,
    )
    return EXIT_NOT_BUILT


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``rl-train`` command and return its exit status.

    Args:
        argv: Arguments without the program name; ``None`` reads ``sys.argv``.

    Returns:
        The process exit status.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "demo":
        return _demo()
    parser.print_help()
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
