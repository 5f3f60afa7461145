"""``grouprl reward``: placeholder until its issue lands (owned by the helper building it)."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("reward", help="(not built yet)")
    p.set_defaults(func=lambda args: print("grouprl reward is not built yet") or 1)
