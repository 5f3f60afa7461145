"""``grouprl explain``: interactive explainers of the algorithms, computed by the library's own functions."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("explain", help="write an HTML page explaining advantages, the clipped objective and KL estimators")
    p.add_argument("-o", "--output", default="explain.html", help="where to write the HTML (default explain.html)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from grouprl.report.explain import build_explain

    print(f"explainers: {build_explain(args.output)}")
    return 0
