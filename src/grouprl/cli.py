"""The ``grouprl`` command line: ``grouprl train|eval|reward|sandbox|list ...``.

Each subcommand lives in ``grouprl.cmd.<name>`` and exposes ``add_parser(subparsers)``, which
registers its arguments and sets ``func`` to the function that runs it. Command modules import
nothing heavy at module level, so ``grouprl --help`` is instant.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from grouprl import __version__
from grouprl.errors import GroupRLError

COMMANDS = ["train", "eval", "reward", "sandbox", "list", "check-template", "report", "explain", "serve"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="grouprl",
        description="GRPO / GSPO reinforcement learning for language models, with verifiable rewards.",
    )
    parser.add_argument("--version", action="version", version=f"grouprl {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"grouprl.cmd.{name.replace('-', '_')}").add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 1
    try:
        return int(args.func(args) or 0)
    except GroupRLError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
