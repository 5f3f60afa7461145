"""The ``grouprl`` command line: ``grouprl train|eval|reward|sandbox|list|vllm-serve ...``.

Each subcommand lives in ``grouprl.cmd.<name>`` and exposes ``add_parser(subparsers)``, which
registers its arguments and sets ``func`` to the function that runs it. Command modules import
nothing heavy at module level, so ``grouprl --help`` is instant.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import re
import sys

from grouprl import __version__
from grouprl.errors import GroupRLError

COMMANDS = ["train", "eval", "reward", "sandbox", "list", "check-template", "report", "explain", "serve",
            "vllm-serve"]


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


OVERRIDE = re.compile(r"^[A-Za-z_][\w.]*=")
"""A ``key=value`` override (dotted keys nest); never an option or its value."""
TAKES_OVERRIDES = ("train", "eval")


def gather_overrides(argv: list[str]) -> list[str]:
    """Move every ``key=value`` token of ``train`` / ``eval`` behind a ``--``, so overrides may stand anywhere
    (before ``-c`` too) and ``--resume`` never takes one as its checkpoint: ``--resume max_steps=8`` resumes
    from the latest checkpoint with max_steps=8. Tokens after an existing ``--`` are left as they are."""
    if not argv or argv[0] not in TAKES_OVERRIDES:
        return argv
    end = argv.index("--") if "--" in argv else len(argv)
    head, tail = argv[:end], argv[end + 1:]
    overrides = [t for t in head if OVERRIDE.match(t)]
    if not overrides and "--" not in argv:
        return argv
    return [t for t in head if not OVERRIDE.match(t)] + ["--"] + overrides + tail


def main(argv: list[str] | None = None) -> int:
    if os.getcwd() not in sys.path:  # plug-ins ('my_rewards:fn') in the current folder, as `python -m` finds them;
        sys.path.append(os.getcwd())  # appended, so a local file never shadows an installed package
    parser = build_parser()
    args = parser.parse_args(gather_overrides(list(sys.argv[1:] if argv is None else argv)))
    if not getattr(args, "func", None):
        parser.print_help()
        return 1
    try:
        rc = int(args.func(args) or 0)
        sys.stdout.flush()  # a closed pipe shows here, inside the handlers below, not at interpreter exit
        return rc
    except GroupRLError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `grouprl ... | head`: the reader left; what it read is all it wanted
        _silence_stdout()
        return 0
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        print(f"error: no space left on the device writing {e.filename or 'a file'!s} ({e.strerror}). Fix: free "
              f"disk space (or point output_dir / GROUPRL_CACHE elsewhere) and run again; the last complete "
              f"checkpoint is kept.", file=sys.stderr)
        return 2


def _silence_stdout() -> None:
    """After a broken pipe, point stdout at /dev/null so that Python's exit-time flush raises nothing."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


if __name__ == "__main__":
    sys.exit(main())
