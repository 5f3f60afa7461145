"""Held-out k/n (tests passed by the final file), edits and test runs per trajectory, before and after GRPO,
for recipes/code_repair.yaml over seeds -- one command::

    python benchmarks/code_repair_curve.py                         # -> benchmarks/results/code_repair.{json,png}
    python benchmarks/code_repair_curve.py --cells 0:0 0:1 0:2 1:0 2:0 --out benchmarks/results/x.json advantage=mt_grpo

Each cell ``WS:RL`` is one training run of the recipe on warm-start seed WS (``builtin:code_repair`` built with
``seed=WS``, cached in ~/.cache/grouprl) and RL seed RL, in its own process, one at a time, one thread each.
The runs, held-out evaluations and the JSON + PNG are benchmarks/agent_curve.py's grid (``--builtin
code_repair``); the held-out records carry the python environment's counters (``eval/env/edits``,
``eval/env/iterations``: means per trajectory, grouprl.train.agent.agent_metrics). This script adds the
per-seed table it prints: sampled k/n (the recipe's eval_temperature, 2 samples per prompt) and greedy k/n
before -> after, with edits and test runs per trajectory before -> after.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import agent_curve  # noqa: E402  (benchmarks/ is not a package)


def summary(report: dict) -> list[dict]:
    """One row per cell: k/n sampled and greedy, edits and iterations per trajectory, before -> after."""
    def counters(env: dict | None) -> tuple:
        env = env or {}
        return env.get("edits"), env.get("iterations")

    rows = []
    for c in report["cells"]:
        (e0, i0), (e1, i1) = counters(c.get("env_before")), counters(c.get("env_after"))
        (ge0, gi0), (ge1, gi1) = counters(c.get("greedy_env_before")), counters(c.get("greedy_env_after"))
        rows.append({"ws_seed": c["ws_seed"], "rl_seed": c["rl_seed"], "kn": [c["before"], c["after"]],
                     "kn_gain_points": round(100 * (c["after"] - c["before"]), 1),
                     "greedy_kn": [c["greedy_before"], c["greedy_after"]],
                     "edits_per_traj": [e0, e1], "iterations_per_traj": [i0, i1],
                     "greedy_edits_per_traj": [ge0, ge1], "greedy_iterations_per_traj": [gi0, gi1],
                     "wall_seconds": c["wall_seconds"], "train_seconds": c["train_seconds"]})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-c", "--config", default=str(ROOT / "recipes" / "code_repair.yaml"))
    ap.add_argument("--cells", nargs="+", default=["0:0", "0:1", "0:2"], metavar="WS:RL")
    ap.add_argument("--eval-steps", type=int, default=None, help="held-out evaluation every N steps (default: "
                                                                  "the recipe's)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "code_repair.json"))
    ap.add_argument("--runs-dir", default=str(ROOT / "outputs" / "code_repair_curve"))
    ap.add_argument("--reuse", action="store_true", help="keep cells whose JSON already exists")
    ap.add_argument("overrides", nargs="*", metavar="key=value", help="recipe overrides")
    args = ap.parse_args(argv)
    eval_steps = args.eval_steps
    if eval_steps is None:
        from grouprl.config import GRPOConfig

        eval_steps = GRPOConfig.from_yaml(args.config, list(args.overrides)).eval_steps
    grid_args = ["--grid", "-c", args.config, "--builtin", "code_repair", "--cells", *args.cells, "--jobs", "1",
                 "--eval-steps", str(eval_steps), "--out", args.out, "--runs-dir", args.runs_dir,
                 *(["--reuse"] if args.reuse else []), *args.overrides]
    agent_curve.main(grid_args)
    out = Path(args.out)
    report = json.loads(out.read_text())
    report["summary"] = summary(report)
    gains = [r["kn_gain_points"] for r in report["summary"]]
    report["kn_gain_points_min"], report["kn_gain_points_max"] = min(gains, default=None), max(gains, default=None)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({"json": str(out), "png": str(out.with_suffix(".png")),
                      "kn_gain_points": [report["kn_gain_points_min"], report["kn_gain_points_max"]],
                      "cells": report["summary"]}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
