"""Held-out accuracy against optimizer step and against training seconds, for GRPO and GSPO.

Runs a recipe once per algorithm through the real ``GRPOTrainer`` (evaluating every ``--eval-steps``
steps), then writes the curves to JSON and plots them to a PNG::

    python benchmarks/learning_curve.py                                  # recipes/default.yaml, grpo + gspo
    python benchmarks/learning_curve.py -c recipes/noisy_demos.yaml --algorithms grpo max_steps=100

Seconds are training seconds: the sum of the trainer's own ``time/step`` (generation, scoring, update)
up to that step, so the time spent on the held-out evaluations themselves is not counted. The model
is the recipe's (built-in warm starts are built once and cached first, outside the timing).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_one(recipe: str, algorithm: str, eval_steps: int, out_dir: Path, overrides: list[str]) -> dict:
    """Train ``recipe`` with ``algorithm``; return its eval curve with steps and training seconds."""
    from grouprl.config import GRPOConfig
    from grouprl.train import GRPOTrainer

    run_dir = out_dir / algorithm
    cfg = GRPOConfig.from_yaml(recipe, [*overrides, f"algorithm={algorithm}", f"eval_steps={eval_steps}",
                                        f"output_dir={run_dir}", "overwrite_output_dir=true", "progress_bar=false",
                                        "report_to=none"])
    t0 = time.perf_counter()
    trainer = GRPOTrainer(config=cfg)
    setup_s = time.perf_counter() - t0
    result = trainer.train()
    total_s = time.perf_counter() - t0

    step_seconds: dict[int, float] = {}
    rewards: dict[int, float] = {}
    with open(result["metrics_path"]) as f:
        for line in f:
            rec = json.loads(line)
            if "time/step" in rec:
                step_seconds[rec["step"]] = rec["time/step"]
                rewards[rec["step"]] = rec.get("reward")
    cumulative, elapsed = {0: 0.0}, 0.0
    for step in sorted(step_seconds):
        elapsed += step_seconds[step]
        cumulative[step] = elapsed
    curve = sorted(
        ({"step": e["step"], "train_seconds": round(cumulative.get(e["step"], elapsed), 2),
          "accuracy": e["accuracy"]} for e in result["evals"].values()),
        key=lambda p: p["step"],
    )
    return {
        "algorithm": algorithm,
        "curve": curve,
        "accuracy_before": curve[0]["accuracy"] if curve else None,
        "accuracy_after": curve[-1]["accuracy"] if curve else None,
        "train_reward": [{"step": s, "reward": rewards[s]} for s in sorted(rewards)],
        "train_seconds": round(elapsed, 1),
        "wall_seconds_total": round(total_s, 1),
        "setup_seconds": round(setup_s, 1),
        "steps": result["global_step"],
    }


def plot(runs: list[dict], path: Path, title: str, ylabel: str = "held-out accuracy (%)") -> None:
    """Each run's ``curve`` (``step``, ``train_seconds``, ``accuracy`` in 0..1) against steps and seconds, labelled by
    its ``algorithm``; also used by benchmarks/env_recipes.py (seeds as the labels)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for run in runs:
        steps = [p["step"] for p in run["curve"]]
        secs = [p["train_seconds"] for p in run["curve"]]
        acc = [100 * p["accuracy"] for p in run["curve"]]
        ax1.plot(steps, acc, marker="o", label=run["algorithm"])
        ax2.plot(secs, acc, marker="o", label=run["algorithm"])
    ax1.set_xlabel("optimizer step")
    ax2.set_xlabel("training seconds (CPU)")
    ax1.set_ylabel(ylabel)
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-c", "--config", default=str(ROOT / "recipes" / "default.yaml"))
    ap.add_argument("--algorithms", nargs="+", default=["grpo", "gspo"])
    ap.add_argument("--eval-steps", type=int, default=25)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "learning_curve.json"))
    ap.add_argument("--png", default=None, help="plot path (default: --out with .png)")
    ap.add_argument("--runs-dir", default=str(ROOT / "outputs" / "learning_curve"))
    ap.add_argument("overrides", nargs="*", metavar="key=value", help="recipe overrides for every run")
    args = ap.parse_args(argv)

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    runs = []
    for algorithm in args.algorithms:
        print(f"[learning_curve] {algorithm}: training {args.config}", file=sys.stderr, flush=True)
        runs.append(run_one(args.config, algorithm, args.eval_steps, Path(args.runs_dir), args.overrides))
        print(json.dumps({k: v for k, v in runs[-1].items() if k not in ("train_reward",)}), file=sys.stderr)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    import torch

    report = {"recipe": args.config, "overrides": args.overrides, "eval_steps": args.eval_steps,
              "torch_threads": torch.get_num_threads(), "cpu_count": os.cpu_count(), "runs": runs}
    out.write_text(json.dumps(report, indent=2) + "\n")
    png = Path(args.png) if args.png else out.with_suffix(".png")
    plot(runs, png, f"{Path(args.config).name}: held-out accuracy")
    print(json.dumps({"json": str(out), "png": str(png),
                      **{r["algorithm"]: {"before": r["accuracy_before"], "after": r["accuracy_after"],
                                          "train_seconds": r["train_seconds"]} for r in runs}}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
