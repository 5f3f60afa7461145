"""Learning curves of the bring-your-own recipes over seeds: the guess-the-number game and the reasoning-gym task.

    python benchmarks/env_recipes.py guess_number --seeds 0 1 2     # -> benchmarks/results/guess_number.{json,png}
    python benchmarks/env_recipes.py reasoning_gym --seeds 0 1 2    # -> benchmarks/results/reasoning_gym.{json,png}
    python benchmarks/env_recipes.py guess_number --replot          # only redraw the PNG from the JSON

Runs ``grouprl train -c recipes/<recipe>.yaml seed=<s>`` once per seed (one after the other, OMP_NUM_THREADS=1;
``key=value`` overrides go to every run), then prints one JSON object and writes it to ``--out``
(``benchmarks/results/<recipe>.json``), and the curves of every seed to the PNG next to it (drawn by
``benchmarks/learning_curve.py``'s ``plot``: against the optimizer step and against the training seconds):

- guess_number: the solved rate of the sampled games (``rewards/grouprl.envs.guess_number:solved/mean``, T=1, one
  per game played), mean of the first 10 steps -> mean of the last 10 steps, and the curve per 10-step window;
- reasoning_gym: held-out accuracy (greedy, the recipe's eval split) before -> after, and the curve.

Wall time per seed includes the warm start's build on the first run (it is cached afterwards) and whatever
else the machine runs: the load average at start and end is recorded next to it; ``train_s`` is the sum of
the steps' own times (``time/step``), evaluations excluded.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOLVED = "rewards/grouprl.envs.guess_number:solved/mean"


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]


def _windows(values: list[float], size: int = 10) -> list[float]:
    return [round(sum(values[i:i + size]) / len(values[i:i + size]), 4) for i in range(0, len(values), size)]


def _train_seconds(records: list[dict]) -> dict[int, float]:
    """Cumulative ``time/step`` at each training step (evaluation rows carry no step time)."""
    total, out = 0.0, {0: 0.0}
    for r in records:
        if "time/step" in r:
            total += r["time/step"]
            out[r["step"]] = round(total, 1)
    return out


def summarize(recipe: str, records: list[dict]) -> dict:
    seconds = _train_seconds(records)
    if recipe == "guess_number":
        rows = [r for r in records if SOLVED in r]
        solved = [r[SOLVED] for r in rows]
        windows = _windows(solved)
        ends = [rows[min(i + 9, len(rows) - 1)]["step"] for i in range(0, len(rows), 10)]
        return {"solved_first10": round(sum(solved[:10]) / 10, 4), "solved_last10": round(sum(solved[-10:]) / 10, 4),
                "points": round(100 * (sum(solved[-10:]) - sum(solved[:10])) / 10, 1), "train_s": max(seconds.values()),
                "solved_per_10_steps": windows,
                "env_reward_per_10_steps": _windows([r["rewards/GuessNumberEnv/mean"] for r in rows]),
                "turns_per_10_steps": _windows([r["turns/mean"] for r in rows]),
                "curve": [{"step": s, "train_seconds": seconds.get(s, 0.0), "accuracy": a} for s, a in zip(ends, windows)]}
    evals = [(r["step"], r["eval/accuracy"]) for r in records if isinstance(r.get("eval/accuracy"), float)]
    return {"accuracy_before": evals[0][1], "accuracy_after": evals[-1][1], "train_s": max(seconds.values()),
            "points": round(100 * (evals[-1][1] - evals[0][1]), 1), "eval_curve": evals,
            "curve": [{"step": s, "train_seconds": seconds.get(s, 0.0), "accuracy": a} for s, a in evals]}


def run(recipe: str, seed: int, overrides: list[str]) -> dict:
    out = ROOT / "outputs" / f"bench-{recipe}-seed{seed}"
    cmd = [sys.executable, "-m", "grouprl", "train", "-c", str(ROOT / "recipes" / f"{recipe}.yaml"), f"seed={seed}",
           f"output_dir={out}", "progress_bar=false", *overrides]
    load0, t0 = os.getloadavg()[0], time.perf_counter()
    subprocess.run(cmd, check=True, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    wall = time.perf_counter() - t0
    return {"seed": seed, "wall_s": round(wall, 1), "load_start": round(load0, 1),
            "load_end": round(os.getloadavg()[0], 1), **summarize(recipe, _records(out))}


def plot(result: dict, path: Path) -> None:
    """Every seed's curve, with the plotting helper of benchmarks/learning_curve.py."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from learning_curve import plot as plot_curves

    game = result["recipe"].endswith("guess_number.yaml")
    runs = [{"algorithm": f"seed {r['seed']} ({r['points']:+.1f} points)", "curve": r["curve"]} for r in result["runs"]]
    ylabel = "solved games, sampled at T=1 (%, mean of 10 steps)" if game else "held-out accuracy, greedy (%)"
    plot_curves(runs, path, f"{result['recipe']}: {result['points_range'][0]:+.1f} to {result['points_range'][1]:+.1f}"
                " points over seeds", ylabel=ylabel)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe", choices=["guess_number", "reasoning_gym"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", default=None, help="JSON path (default benchmarks/results/<recipe>.json); PNG beside it")
    parser.add_argument("--replot", action="store_true", help="only redraw the PNG from the JSON at --out")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="recipe overrides for every run")
    args = parser.parse_args(argv)
    path = Path(args.out) if args.out else ROOT / "benchmarks" / "results" / f"{args.recipe}.json"
    if args.replot:
        plot(json.loads(path.read_text()), path.with_suffix(".png"))
        return
    runs = [run(args.recipe, s, args.overrides) for s in args.seeds]
    result = {"recipe": f"recipes/{args.recipe}.yaml", "overrides": args.overrides, "runs": runs,
              "points_range": [min(r["points"] for r in runs), max(r["points"] for r in runs)]}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    plot(result, path.with_suffix(".png"))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
