"""Held-out accuracy and tool use against step and wall time for the calculator agent recipe.

Trains ``recipes/agent_calculator.yaml`` through the real ``GRPOTrainer`` (multi-turn rollouts with the
``calculator`` environment, held-out evaluation every ``--eval-steps``), then evaluates the warm start
and the trained model once more WITHOUT the tool (``environment: null``: the prompt lists no tools and a
tool call would go unanswered) -- the baseline of what the same model does from its head -- and greedily
with the tool (the curve itself uses the recipe's eval_temperature). Writes the
curve to JSON and a PNG::

    python benchmarks/agent_curve.py                      # benchmarks/results/agent_calculator.{json,png}
    python benchmarks/agent_curve.py max_steps=40         # recipe overrides
    python benchmarks/agent_curve.py --grid --ws-seeds 0 1 2 --rl-seeds 0 1 2 --jobs 2 \
        --out benchmarks/results/agent_calculator_grid.json [overrides]   # every warm-start x RL seed

``--grid`` trains each (warm-start seed, RL seed) cell in its own process (``--jobs`` at a time, one
thread each; warm-start seed s is ``builtin:calculator`` built with ``seed=s``, cached), writes each cell
to ``<out>_cells/ws<W>_rl<R>.json`` (``--reuse`` keeps existing ones) and then one JSON with the per-seed
table (held-out accuracy sampled and greedy, tool calls, before/after) and its spread, the build record of
each warm start (``warm_starts``: build seconds, SFT steps, the copy gate's attempts), and a PNG.
The recipe's own figures (its header, docs/CHOOSING.md) are one command each::

    OMP_NUM_THREADS=1 python benchmarks/agent_curve.py --grid --ws-seeds 0 1 2 --rl-seeds 0 1 2 --jobs 1 \
        --eval-steps 25 --out benchmarks/results/agent_calculator_grid.json
    ... the same with advantage=grpo "advantage_kwargs={}" --out benchmarks/results/agent_calculator_grid_grpo.json

benchmarks/results/agent_calculator_before_issue28.{json,png} is the single-run curve of the earlier
recipe design (60 steps, 50% tool demonstrations), measured on another machine.

``train_seconds`` is the sum of the trainer's own ``time/step`` (generation, tools, scoring, update) up
to that step; ``wall_seconds`` is the wall clock since the trainer started, evaluations included (what a
user waits for). The load average of the machine is recorded before and after: the numbers are only
comparable between runs on equally busy machines.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _eval_records(metrics_path: str) -> tuple[list[dict], dict[int, dict]]:
    evals, steps = [], {}
    with open(metrics_path) as f:
        for line in f:
            rec = json.loads(line)
            if "eval/accuracy" in rec:
                evals.append(rec)
            elif "time/step" in rec:
                steps[rec["step"]] = rec
    return evals, steps


def _env_counters(record: dict, prefix: str) -> dict:
    """The environment's counters (``env/edits``, ``env/iterations``, ...: means per trajectory) of a record."""
    return {k[len(prefix):]: round(v, 4) for k, v in record.items() if k.startswith(prefix)}


def train(recipe: str, eval_steps: int, run_dir: Path, overrides: list[str]) -> dict:
    """Train ``recipe``; the held-out curve with tool statistics, train reward and tool use per step."""
    from grouprl.config import GRPOConfig
    from grouprl.train import GRPOTrainer

    cfg = GRPOConfig.from_yaml(recipe, [*overrides, f"eval_steps={eval_steps}", f"output_dir={run_dir}",
                                        "overwrite_output_dir=true", "progress_bar=false", "report_to=none"])
    t0 = time.perf_counter()
    trainer = GRPOTrainer(config=cfg)
    result = trainer.train()
    wall = time.perf_counter() - t0
    evals, steps = _eval_records(result["metrics_path"])
    elapsed, cumulative = 0.0, {0: 0.0}
    for s in sorted(steps):
        elapsed += steps[s]["time/step"]
        cumulative[s] = round(elapsed, 1)
    by_step = {e["step"]: e for e in evals}  # the "after" evaluation repeats the last periodic one's step
    curve = [{"step": s, "train_seconds": cumulative.get(s, round(elapsed, 1)), "accuracy": e["eval/accuracy"],
              "tool_calls_per_traj": e.get("eval/tools/calls_per_traj"),
              "tool_failure_frac": e.get("eval/tools/failure_frac"), "turns": e.get("eval/turns/mean"),
              "env": _env_counters(e, "eval/env/")}
             for s, e in sorted(by_step.items())]
    per_step = [{"step": s, "reward": r.get("reward"), "tool_calls_per_traj": r.get("tools/calls_per_traj"),
                 "seconds": round(r["time/step"], 2)} for s, r in sorted(steps.items())]
    return {"config": cfg, "final": str(result.get("final_model") or run_dir / "final"), "curve": curve,
            "per_step": per_step,
            "train_seconds": round(elapsed, 1), "wall_seconds": round(wall, 1), "steps": result["global_step"]}


def greedy(cfg, checkpoint: str | None, *, tool: bool) -> dict:
    """Greedy held-out accuracy of ``checkpoint`` (``None``: the recipe's model), with the recipe's tool
    or with no tool available (``environment: null``)."""
    from dataclasses import replace

    from grouprl.cmd.eval import evaluate_checkpoint

    run_cfg = cfg if tool else replace(cfg, environment=None, tools=[])
    result = evaluate_checkpoint(run_cfg, checkpoint, temperature=0.0, num_samples=1, ks=())
    return {"accuracy": result["accuracy"], "completion_length": result["completion_length"],
            "tool_calls_per_traj": result.get("tools/calls_per_traj", 0.0), "env": _env_counters(result, "env/")}


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curve = report["curve"]
    steps = [p["step"] for p in curve]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    decoding = "greedy" if report["eval_temperature"] == 0 else f"T={report['eval_temperature']:g}"
    ax1.plot(steps, [100 * p["accuracy"] for p in curve], marker="o", label=f"with the calculator ({decoding})")
    ax1.axhline(100 * report["baseline_without_tool"]["warm_start"]["accuracy"], color="gray", ls="--",
                label="warm start without the tool (greedy)")
    ax1.set_xlabel("optimizer step")
    ax1.set_ylabel("held-out accuracy (%)")
    ax1.set_ylim(-2, 102)
    ax1.legend(loc="upper left")
    per_step = report["per_step"]
    ax2.plot([p["step"] for p in per_step], [p["tool_calls_per_traj"] for p in per_step], label="train (T=1)")
    ax2.plot(steps, [p["tool_calls_per_traj"] for p in curve], marker="o", label=f"held-out ({decoding})")
    ax2.set_xlabel("optimizer step")
    ax2.set_ylabel("tool calls per trajectory")
    ax2.legend(loc="upper left")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
    fig.suptitle(f"{Path(report['recipe']).name}: GRPO with a calculator tool, {report['cpu_count']} CPU cores")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def cell(config: str, ws_seed: int, rl_seed: int, eval_steps: int, run_dir: Path, overrides: list[str],
         sft_steps: int | None = None, builtin: str = "calculator") -> dict:
    """One (warm-start seed, RL seed) run: the sampled held-out curve, greedy with the tool before/after.
    ``builtin`` names the warm start the seed applies to; ``sft_steps`` replaces its number of SFT steps
    (another cache entry)."""
    from grouprl.builtin.warmstart import builtin_model_path

    spec = {"seed": ws_seed, **({"sft_steps": sft_steps} if sft_steps else {})}
    model = builtin_model_path(builtin, **spec) if ws_seed or sft_steps else f"builtin:{builtin}"
    run = train(config, eval_steps, run_dir, [f"model={model}", f"seed={rl_seed}", *overrides])
    cfg = run.pop("config")
    greedy_runs = {"warm_start": greedy(cfg, None, tool=True), "trained": greedy(cfg, run["final"], tool=True)}
    return {"ws_seed": ws_seed, "rl_seed": rl_seed, "advantage": cfg.advantage,
            "before": run["curve"][0]["accuracy"], "after": run["curve"][-1]["accuracy"],
            "calls_before": run["curve"][0]["tool_calls_per_traj"], "calls_after": run["curve"][-1]["tool_calls_per_traj"],
            "greedy_before": greedy_runs["warm_start"]["accuracy"], "greedy_after": greedy_runs["trained"]["accuracy"],
            "greedy_calls_before": greedy_runs["warm_start"]["tool_calls_per_traj"],
            "greedy_calls_after": greedy_runs["trained"]["tool_calls_per_traj"],
            "env_before": run["curve"][0]["env"], "env_after": run["curve"][-1]["env"],
            "greedy_env_before": greedy_runs["warm_start"]["env"], "greedy_env_after": greedy_runs["trained"]["env"], **run}


def warm_start_info(builtin: str, ws_seed: int, sft_steps: int | None) -> dict:
    """What the cached build of warm-start seed ``ws_seed`` recorded: build seconds, SFT steps (the final
    attempt's and all attempts'), and per attempt its seed, steps and last gate check."""
    from grouprl.builtin.warmstart import INFO_FILE, builtin_model_path

    path = Path(builtin_model_path(builtin, seed=ws_seed, **({"sft_steps": sft_steps} if sft_steps else {})))
    info = json.loads((path / INFO_FILE).read_text())
    attempts = [{"seed": a["seed"], "steps": a["steps"], "last_check": a["checks"][-1] if a["checks"] else None}
                for a in info.get("gate_attempts", [])]
    return {"digest": info["digest"], "build_seconds": info["build_seconds"], "gate_passed": info.get("gate_passed"),
            "sft_steps_run": info.get("sft_steps_run"), "sft_steps_total": info.get("sft_steps_total"),
            "attempts": attempts}


def grid(args) -> int:
    """Every (warm-start seed, RL seed) cell, ``--jobs`` processes at a time (one thread each), then one
    JSON with the per-seed table and its spread, and a PNG of before/after per cell."""
    import subprocess

    cells = ([tuple(int(x) for x in c.split(":")) for c in args.cells] if args.cells
             else [(w, r) for w in args.ws_seeds for r in args.rl_seeds])
    out = Path(args.out)
    parts = out.parent / f"{out.stem}_cells"
    parts.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    todo = [c for c in cells if not (args.reuse and (parts / f"ws{c[0]}_rl{c[1]}.json").exists())]
    running: list = []
    for w, r in todo:
        while len(running) >= args.jobs:
            time.sleep(5)
            running = [p for p in running if p.poll() is None]
        cmd = [sys.executable, __file__, "-c", args.config, "--eval-steps", str(args.eval_steps), "--cell", str(w), str(r),
               "--out", str(parts / f"ws{w}_rl{r}.json"), "--runs-dir", f"{args.runs_dir}/ws{w}_rl{r}",
               *(["--sft-steps", str(args.sft_steps)] if args.sft_steps else []), "--builtin", args.builtin,
               *args.overrides]
        running.append(subprocess.Popen(cmd, env=env))
    for p in running:
        p.wait()
    rows = [json.loads((parts / f"ws{w}_rl{r}.json").read_text()) for w, r in cells
            if (parts / f"ws{w}_rl{r}.json").exists()]
    table = [{k: row[k] for k in ("ws_seed", "rl_seed", "before", "after", "greedy_before", "greedy_after",
                                   "calls_before", "calls_after", "train_seconds", "wall_seconds")}
             | {k: row.get(k) for k in ("env_before", "env_after", "greedy_env_before", "greedy_env_after")}
             for row in rows]
    gains = [t["after"] - t["before"] for t in table]
    greedy_gains = [t["greedy_after"] - t["greedy_before"] for t in table]
    warm_starts = {str(w): warm_start_info(args.builtin, w, args.sft_steps) for w in sorted({t["ws_seed"] for t in table})}
    report = {"recipe": args.config, "overrides": args.overrides, "cells": table, "warm_starts": warm_starts,
              "cpu_count": os.cpu_count(),
              "gain_min": min(gains, default=None), "gain_max": max(gains, default=None),
              "greedy_gain_min": min(greedy_gains, default=None), "greedy_gain_max": max(greedy_gains, default=None),
              "load_average_end": [round(x, 2) for x in os.getloadavg()], "runs": rows}
    out.write_text(json.dumps(report, indent=2) + "\n")
    plot_grid(report, out.with_suffix(".png"))
    print(json.dumps({k: report[k] for k in ("gain_min", "gain_max", "greedy_gain_min", "greedy_gain_max")}
                     | {"cells": table}), file=sys.stderr)
    return 0


def plot_grid(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for run in report["runs"]:
        label = f"ws{run['ws_seed']} rl{run['rl_seed']}"
        ax1.plot([p["step"] for p in run["curve"]], [100 * p["accuracy"] for p in run["curve"]], marker="o", label=label)
    ax1.set_xlabel("optimizer step")
    ax1.set_ylabel("held-out accuracy, sampled (%)")
    ax1.set_ylim(-2, 102)
    ax1.legend(fontsize=7, ncol=3)
    cells = report["cells"]
    x = range(len(cells))
    ax2.bar([i - 0.2 for i in x], [100 * c["greedy_before"] for c in cells], width=0.4, label="greedy, warm start")
    ax2.bar([i + 0.2 for i in x], [100 * c["greedy_after"] for c in cells], width=0.4, label="greedy, trained")
    ax2.set_xticks(list(x), [f"{c['ws_seed']}/{c['rl_seed']}" for c in cells], fontsize=7)
    ax2.set_xlabel("warm-start seed / RL seed")
    ax2.set_ylabel("held-out accuracy, greedy (%)")
    ax2.set_ylim(0, 100)
    ax2.legend(fontsize=7)
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
    fig.suptitle(f"{Path(report['recipe']).name}: every warm-start x RL seed, {report['cpu_count']} CPU cores")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-c", "--config", default=str(ROOT / "recipes" / "agent_calculator.yaml"))
    ap.add_argument("--eval-steps", type=int, default=10)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "agent_calculator.json"))
    ap.add_argument("--runs-dir", default=str(ROOT / "outputs" / "agent_curve"))
    ap.add_argument("--replot", action="store_true", help="only redraw the PNG from the JSON at --out")
    ap.add_argument("--grid", action="store_true", help="every --ws-seeds x --rl-seeds cell (see grid())")
    ap.add_argument("--ws-seeds", type=int, nargs="+", default=[0, 1, 2], help="warm-start (SFT) seeds")
    ap.add_argument("--rl-seeds", type=int, nargs="+", default=[0, 1, 2], help="RL seeds")
    ap.add_argument("--jobs", type=int, default=2, help="grid cells trained at once")
    ap.add_argument("--reuse", action="store_true", help="keep grid cells whose JSON already exists")
    ap.add_argument("--cell", type=int, nargs=2, metavar=("WS", "RL"), help="one grid cell (what --grid runs)")
    ap.add_argument("--sft-steps", type=int, default=None, help="warm-start SFT steps (default: the built-in's)")
    ap.add_argument("--builtin", default="calculator", help="the built-in model the warm-start seeds apply to")
    ap.add_argument("--cells", nargs="+", metavar="WS:RL", help="grid cells to run instead of --ws-seeds x --rl-seeds")
    ap.add_argument("overrides", nargs="*", metavar="key=value", help="recipe overrides")
    args = ap.parse_args(argv)
    if args.grid:
        return grid(args)
    if args.cell:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        result = cell(args.config, args.cell[0], args.cell[1], args.eval_steps, Path(args.runs_dir), args.overrides,
                      sft_steps=args.sft_steps, builtin=args.builtin)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps({k: result[k] for k in ("ws_seed", "rl_seed", "before", "after", "greedy_before",
                                                 "greedy_after")}), file=sys.stderr)
        return 0
    if args.replot:
        plot(json.loads(Path(args.out).read_text()), Path(args.out).with_suffix(".png"))
        return 0

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    load_before = os.getloadavg()
    run = train(args.config, args.eval_steps, Path(args.runs_dir), args.overrides)
    load_after = os.getloadavg()
    cfg = run.pop("config")
    baseline = {"warm_start": greedy(cfg, None, tool=False), "trained": greedy(cfg, run["final"], tool=False)}
    with_tool_greedy = {"warm_start": greedy(cfg, None, tool=True), "trained": greedy(cfg, run["final"], tool=True)}
    import torch

    report = {"recipe": args.config, "overrides": args.overrides, "eval_steps": args.eval_steps,
              "torch_threads": torch.get_num_threads(), "cpu_count": os.cpu_count(),
              "load_average_before": [round(x, 2) for x in load_before],
              "load_average_after": [round(x, 2) for x in load_after],
              "accuracy_before": run["curve"][0]["accuracy"], "accuracy_after": run["curve"][-1]["accuracy"],
              "eval_temperature": cfg.eval_temperature, "eval_num_samples": cfg.eval_num_samples,
              "baseline_without_tool": baseline, "greedy_with_tool": with_tool_greedy, **run}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    png = out.with_suffix(".png")
    plot(report, png)
    print(json.dumps({"json": str(out), "png": str(png), "before": report["accuracy_before"],
                      "after": report["accuracy_after"], "without_tool": baseline, "greedy": with_tool_greedy,
                      "wall_seconds": run["wall_seconds"], "load": report["load_average_after"]}), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
