"""``grouprl report``: the run report (one self-contained HTML file), reviewer marks, run comparison."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="write a run's HTML report (curves, alerts, sample review), or compare two runs")
    p.add_argument("run_dir", nargs="?", help="a training run's output_dir (holds metrics.jsonl)")
    p.add_argument("-o", "--output", help="where to write the HTML (default RUN_DIR/report.html, "
                   "or RUN_B/compare.html with --compare)")
    p.add_argument("--review-window", type=int, default=100,
                   help="steps per sample-review window and reward histogram (default 100)")
    p.add_argument("--marks", help="marks.json downloaded from a report: fold it into RUN_DIR/review_marks.jsonl "
                   "(the report written next shows the marks)")
    p.add_argument("--compare", nargs=2, metavar=("RUN_A", "RUN_B"),
                   help="compare two runs: rewards, config and curves side by side")
    p.add_argument("--threshold", action="append", metavar="NAME=VALUE",
                   help="change an alert threshold (repeatable), e.g. --threshold zero_std_frac=0.9")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from grouprl.errors import ConfigError
    from grouprl.report import AlertThresholds, build_compare, build_report, fold_marks

    if args.compare:
        if args.run_dir or args.marks:
            raise ConfigError("--compare RUN_A RUN_B takes no RUN_DIR or --marks: run them separately.")
        path = build_compare(*args.compare, out=args.output, review_window=args.review_window)
        print(f"comparison: {path}")
        return 0
    if not args.run_dir:
        raise ConfigError("give a RUN_DIR (a training run's output_dir) or --compare RUN_A RUN_B.")
    if args.marks:
        added = fold_marks(args.run_dir, args.marks)
        print(f"folded {added} new mark(s) from {args.marks} into {args.run_dir}/review_marks.jsonl")
    path = build_report(args.run_dir, out=args.output, review_window=args.review_window,
                        thresholds=AlertThresholds.from_overrides(args.threshold))
    print(f"report: {path}")
    return 0
