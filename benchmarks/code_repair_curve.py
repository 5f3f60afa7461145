"""Held-out k/n (tests passed by the final file), edits and test runs per trajectory, before and after RL,
for recipes/code_repair.yaml over seeds, with trajectory-level ``grpo`` (the recipe) and turn-level
``mt_grpo`` side by side -- one command::

    python benchmarks/code_repair_curve.py          # -> benchmarks/results/code_repair.{json,png}
    python benchmarks/code_repair_curve.py --cells 0:0 1:0 --variants grpo --out benchmarks/results/x.json lr=5e-4

Each cell ``WS:RL`` is one training run of the recipe on warm-start seed WS (``builtin:code_repair`` built with
``seed=WS``, cached in ~/.cache/grouprl) and RL seed RL, in its own process, one at a time, one thread each.
Each variant (``--variants``, default both) is the recipe with its overrides (:data:`VARIANTS`): ``grpo`` as
written, ``mt_grpo`` with ``advantage: mt_grpo`` (arXiv 2505.11821) and the turn reward ``tool_success``
(every call of the trajectory parsed and ran; the first model turn gets its group z-score on top of the
outcome's). The runs, held-out evaluations and each variant's JSON are benchmarks/agent_curve.py's grid
(``--builtin code_repair``; cells in ``<out>_<variant>_cells/``, kept with ``--reuse``); the held-out records
carry the python environment's counters (``eval/env/edits``, ``eval/env/iterations``: means per trajectory,
grouprl.train.agent.agent_metrics). This script writes the per-seed table (sampled k/n at the recipe's
eval_temperature and eval_num_samples, greedy k/n, edits and test runs per trajectory, before -> after, train
and wall seconds) of every variant into one JSON and draws the curves into one PNG.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import agent_curve  # noqa: E402  (benchmarks/ is not a package)

VARIANTS: dict[str, list[str]] = {
    "grpo": [],
    "mt_grpo": ["advantage=mt_grpo", "advantage_kwargs.turn_reward=tool_success"],
}


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


def plot(report: dict, path: Path) -> None:
    """k/n, edits and test runs per trajectory (held-out, sampled) against the step: one line per cell and
    variant (solid grpo, dashed the others)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    panels = [("held-out k/n, sampled (%)", lambda p: 100 * p["accuracy"]),
              ("edits per trajectory", lambda p: p["env"].get("edits")),
              ("test runs per trajectory", lambda p: p["env"].get("iterations"))]
    for k, (name, variant) in enumerate(report["variants"].items()):
        for run in variant["runs"]:
            steps = [p["step"] for p in run["curve"]]
            for ax, (_, value) in zip(axes, panels):
                ax.plot(steps, [value(p) for p in run["curve"]], marker="o", ls="-" if k == 0 else "--",
                        label=f"{name} ws{run['ws_seed']} rl{run['rl_seed']}")
    for ax, (ylabel, _) in zip(axes, panels):
        ax.set_xlabel("optimizer step")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    axes[0].set_ylim(-2, 102)
    axes[0].legend(fontsize=7, ncol=2)
    fig.suptitle(f"{Path(report['recipe']).name}: held-out k/n and tool use per seed, {report['cpu_count']} CPU cores")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-c", "--config", default=str(ROOT / "recipes" / "code_repair.yaml"))
    ap.add_argument("--cells", nargs="+", default=["0:0", "0:1", "0:2", "1:0", "1:1", "1:2"], metavar="WS:RL")
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--builtin", default="code_repair", help="the built-in warm start the cells' WS seeds apply to")
    ap.add_argument("--eval-steps", type=int, default=None, help="held-out evaluation every N steps (default: "
                                                                  "the recipe's)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "code_repair.json"))
    ap.add_argument("--runs-dir", default=str(ROOT / "outputs" / "code_repair_curve"))
    ap.add_argument("--reuse", action="store_true", help="keep cells whose JSON already exists")
    ap.add_argument("overrides", nargs="*", metavar="key=value", help="recipe overrides (every variant)")
    args = ap.parse_args(argv)
    eval_steps = args.eval_steps
    if eval_steps is None:
        from grouprl.config import GRPOConfig

        eval_steps = GRPOConfig.from_yaml(args.config, list(args.overrides)).eval_steps
    out = Path(args.out)
    report = {"recipe": args.config, "overrides": args.overrides, "cpu_count": os.cpu_count(), "variants": {}}
    for name in args.variants:
        part = out.with_name(f"{out.stem}_{name}.json")
        overrides = [*VARIANTS[name], *args.overrides]
        agent_curve.main(["--grid", "-c", args.config, "--builtin", args.builtin, "--cells", *args.cells,
                          "--jobs", "1", "--eval-steps", str(eval_steps), "--out", str(part),
                          "--runs-dir", f"{args.runs_dir}/{name}", *(["--reuse"] if args.reuse else []), *overrides])
        grid = json.loads(part.read_text())
        rows = summary(grid)
        gains = [r["kn_gain_points"] for r in rows]
        report["variants"][name] = {"overrides": overrides, "json": str(part), "summary": rows,
                                    "kn_gain_points_min": min(gains, default=None),
                                    "kn_gain_points_max": max(gains, default=None),
                                    "load_average_end": grid["load_average_end"],
                                    "runs": [{k: r[k] for k in ("ws_seed", "rl_seed", "curve", "per_step")}
                                             for r in grid["runs"]]}
    out.write_text(json.dumps(report, indent=2) + "\n")
    plot(report, out.with_suffix(".png"))
    print(json.dumps({"json": str(out), "png": str(out.with_suffix(".png"))}
                     | {name: {"kn_gain_points": [v["kn_gain_points_min"], v["kn_gain_points_max"]],
                               "cells": v["summary"]} for name, v in report["variants"].items()}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
