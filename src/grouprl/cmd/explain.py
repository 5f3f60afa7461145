"""``grouprl explain``: interactive explainers of the algorithms, computed by the library's own functions."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("explain", help="write an HTML page explaining advantages, the clipped objective and KL estimators")
    p.add_argument("-o", "--output", default=None,
                   help="where to write the HTML (default: grouprl-explain.html in the system's temporary folder, "
                        "so nothing lands in the current folder unless asked)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import tempfile
    from pathlib import Path

    from grouprl.report.explain import build_explain

    out = args.output or Path(tempfile.gettempdir()) / "grouprl-explain.html"
    print(f"explainers: {build_explain(out)}  (open it in a browser)")
    return 0
