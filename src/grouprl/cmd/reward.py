"""``grouprl reward score --reward NAME|composite --input samples.jsonl``: score completions offline.

Each input line is a JSON object with the completion (``--completion-key``, default ``completion``;
a string or a list of chat messages), the ground truth (``answer``, or ``ground_truth`` / ``solution``)
and any other columns, which are passed to the reward as keywords (e.g. ``task_type``, ``tests``).
Prints a per-sample table of every dimension and the total, then summary statistics; with
``--group-key`` also the fraction of groups whose totals all tie (zero std: GRPO learns nothing from
them). A malformed line gets an error naming its line number; the other lines are still scored and
the exit status is 1.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from typing import Any

ANSWER_KEYS = ("answer", "ground_truth", "solution")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("reward", help="score completions with a reward (per-sample table and summary)")
    rsub = p.add_subparsers(dest="reward_command", metavar="ACTION")
    s = rsub.add_parser("score", help="score a JSONL file of completions")
    s.add_argument(
        "--reward", "-r", default="composite", help="a REWARDS name (see `grouprl list rewards`) or composite"
    )
    s.add_argument("--input", "-i", required=True, help="JSONL file, one sample per line ('-' for stdin)")
    s.add_argument("--config", default="default", help="composite weights: default, math, code or retrieval")
    s.add_argument("--completion-key", default="completion", help="field holding the completion")
    s.add_argument(
        "--group-key", default=None, help="field holding the group id (prompt id) for zero-std stats"
    )
    s.add_argument(
        "--option",
        "-o",
        action="append",
        default=[],
        metavar="key=value",
        help="fixed keyword for the reward (value parsed as JSON when possible), repeatable",
    )
    s.add_argument(
        "--json", action="store_true", help="print JSON lines and a JSON summary instead of tables"
    )
    s.add_argument("--max-rows", type=int, default=200, help="rows shown in the table (all are summarised)")
    s.set_defaults(func=run_score)
    p.set_defaults(func=lambda args: p.print_help() or 1)


def _parse_options(items: list[str]) -> dict[str, Any]:
    from grouprl.errors import ConfigError

    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--option {item!r} must look like key=value (e.g. -o strict=true)")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def make_scorer(reward: str, config: str, options: dict[str, Any]):
    """``fn(completion, answer, meta) -> dict of dimensions incl. "total"`` for a reward name or composite."""
    from grouprl.builtins import load_builtins
    from grouprl.errors import ConfigError, did_you_mean
    from grouprl.registry import REWARDS
    from grouprl.rewards.adapters import as_sample_reward, check_reward_options
    from grouprl.rewards.composite import TEMPLATES, AgentRewardFunction

    load_builtins()
    if reward == "composite":
        if config not in TEMPLATES:
            raise ConfigError(f"--config {config!r}: use one of {', '.join(TEMPLATES)}.{did_you_mean(config, TEMPLATES)}")
        # the composite's options go to its accuracy dimension (plus task_type)
        check_reward_options("composite", REWARDS.get("accuracy"), options, where="--option")
        agent = AgentRewardFunction(TEMPLATES[config])

        def score(completion, answer, meta):
            meta = {**meta, **options}
            task_type = meta.pop("task_type", None)
            return agent(completion, answer, task_type, **meta)

        return score
    fn = as_sample_reward(REWARDS.get(reward), reward)  # a batch-form plug-in works too
    check_reward_options(reward, fn, options, where="--option")

    def score_one(completion, answer, meta):
        value = fn(completion, answer=answer, **{**meta, **options})
        return {reward: value, "total": value}

    return score_one


def _read(path: str):
    stream = sys.stdin if path == "-" else open(path, encoding="utf-8")  # noqa: SIM115
    try:
        yield from enumerate(stream, start=1)
    finally:
        if stream is not sys.stdin:
            stream.close()


def score_file(args: argparse.Namespace) -> tuple[list[dict], list[str]]:
    """Score every line; returns (rows, errors). Rows hold ``line``, ``group`` and every dimension."""
    from grouprl.errors import DataError, GroupRLError
    from grouprl.rewards.adapters import completion_text

    scorer = make_scorer(args.reward, args.config, _parse_options(args.option))
    rows, errors = [], []
    try:
        lines = list(_read(args.input))
    except OSError as e:
        raise DataError(f"cannot read --input {args.input!r}: {e.strerror}") from e
    for lineno, line in lines:
        if not line.strip():
            continue
        try:
            sample = json.loads(line.rstrip("\r\n"))
        except json.JSONDecodeError as e:
            errors.append(f"line {lineno}: invalid JSON ({e.msg} at column {e.colno})")
            continue
        if not isinstance(sample, dict) or args.completion_key not in sample:
            errors.append(f"line {lineno}: expected a JSON object with a {args.completion_key!r} field")
            continue
        answer = next((sample[k] for k in ANSWER_KEYS if k in sample), None)
        meta = {k: v for k, v in sample.items() if k not in ANSWER_KEYS and k != args.completion_key}
        group = meta.pop(args.group_key, None) if args.group_key else None
        try:
            dims = scorer(completion_text(sample[args.completion_key]), answer, meta)
        except GroupRLError as e:
            errors.append(f"line {lineno}: {e}")
            continue
        except Exception as e:  # noqa: BLE001 - one bad sample must not stop the others
            errors.append(f"line {lineno}: reward {args.reward!r} raised {type(e).__name__}: {e}")
            continue
        rows.append({"line": lineno, "group": group, **dims})
    return rows, errors


def summarize(rows: list[dict], group_key: str | None) -> dict[str, Any]:
    """Per dimension: n, none, mean, std (population), min, max; plus zero-std group stats."""
    dims = [k for k in rows[0] if k not in ("line", "group")] if rows else []
    out: dict[str, Any] = {"samples": len(rows), "dimensions": {}}
    for d in dims:
        vals = [r[d] for r in rows if r[d] is not None and not math.isnan(r[d])]
        out["dimensions"][d] = {
            "n": len(vals),
            "none": len(rows) - len(vals),
            "mean": statistics.fmean(vals) if vals else None,
            "std": statistics.pstdev(vals) if vals else None,
            "min": min(vals) if vals else None,
            "max": max(vals) if vals else None,
        }
    if group_key:
        groups: dict[Any, list[float]] = {}
        for r in rows:
            if r["total"] is not None:
                groups.setdefault(json.dumps(r["group"], sort_keys=True), []).append(r["total"])
        sized = [v for v in groups.values() if len(v) >= 2]
        zero = sum(1 for v in sized if statistics.pstdev(v) < 1e-6)
        out["groups"] = len(sized)
        out["zero_std_groups"] = zero
        out["zero_std_fraction"] = zero / len(sized) if sized else None
    return out


def _fmt(v: Any) -> str:
    return "None" if v is None else f"{v:.4f}" if isinstance(v, float) else str(v)


def run_score(args: argparse.Namespace) -> int:
    rows, errors = score_file(args)
    for err in errors:
        print(f"error: {args.input}: {err}", file=sys.stderr)
    summary = summarize(rows, args.group_key)
    if args.json:
        for r in rows:
            print(json.dumps(r))
        print(json.dumps({"summary": summary, "errors": errors}))
        return 1 if errors else 0
    from rich.console import Console
    from rich.table import Table

    console = Console()
    dims = list(summary["dimensions"])
    table = Table(title=f"reward: {args.reward}", show_edge=False)
    table.add_column("line", justify="right")
    if args.group_key:
        table.add_column(args.group_key)
    for d in dims:
        table.add_column(d, justify="right", style="bold" if d == "total" else None)
    for r in rows[: args.max_rows]:
        cells = [str(r["line"])] + ([str(r["group"])] if args.group_key else []) + [_fmt(r[d]) for d in dims]
        table.add_row(*cells)
    console.print(table)
    if len(rows) > args.max_rows:
        console.print(f"({len(rows) - args.max_rows} more rows not shown; all are in the summary)")
    stats = Table(title=f"summary over {summary['samples']} samples", show_edge=False)
    for col in ("dimension", "n", "none", "mean", "std", "min", "max"):
        stats.add_column(col, justify="left" if col == "dimension" else "right")
    for d, s in summary["dimensions"].items():
        stats.add_row(d, *[_fmt(s[k]) for k in ("n", "none", "mean", "std", "min", "max")])
    console.print(stats)
    if args.group_key:
        frac = summary["zero_std_fraction"]
        console.print(
            f"zero-std groups: {summary['zero_std_groups']}/{summary['groups']}"
            + (f" ({frac:.1%}) -- these give GRPO no learning signal" if frac is not None else "")
        )
    if errors:
        console.print(f"[red]{len(errors)} line(s) could not be scored (see errors above)[/red]")
    return 1 if errors else 0
