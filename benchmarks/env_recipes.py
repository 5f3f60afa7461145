"""Learning curves of the bring-your-own recipes over seeds: the guess-the-number game and the reasoning-gym task.

    python benchmarks/env_recipes.py guess_number --seeds 0 1 2
    python benchmarks/env_recipes.py reasoning_gym --seeds 0 1

Runs ``grouprl train -c recipes/<recipe>.yaml seed=<s>`` once per seed (one after the other, OMP_NUM_THREADS=1),
then prints one JSON object and writes it to ``benchmarks/results/<recipe>.json``:

- guess_number: the solved rate of the sampled games (``rewards/grouprl.envs.guess_number:solved/mean``, T=1, 64 games per step), mean
  of the first 10 steps -> mean of the last 10 steps, and the curve per 10-step window;
- reasoning_gym: held-out accuracy (greedy, the recipe's eval split) before -> after, and the curve.

Wall time per seed includes the warm start's build on the first run (it is cached afterwards) and whatever
else the machine runs: the load average at start and end is recorded next to it.
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


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]


def _windows(values: list[float], size: int = 10) -> list[float]:
    return [round(sum(values[i:i + size]) / len(values[i:i + size]), 4) for i in range(0, len(values), size)]


def summarize(recipe: str, records: list[dict]) -> dict:
    if recipe == "guess_number":
        solved = [r["rewards/grouprl.envs.guess_number:solved/mean"] for r in records if "rewards/grouprl.envs.guess_number:solved/mean" in r]
        return {"solved_first10": round(sum(solved[:10]) / 10, 4), "solved_last10": round(sum(solved[-10:]) / 10, 4),
                "points": round(100 * (sum(solved[-10:]) - sum(solved[:10])) / 10, 1),
                "solved_per_10_steps": _windows(solved),
                "env_reward_per_10_steps": _windows([r["rewards/GuessNumberEnv/mean"] for r in records]),
                "turns_per_10_steps": _windows([r["turns/mean"] for r in records])}
    evals = [(r["step"], r["eval/accuracy"]) for r in records if isinstance(r.get("eval/accuracy"), float)]
    return {"accuracy_before": evals[0][1], "accuracy_after": evals[-1][1],
            "points": round(100 * (evals[-1][1] - evals[0][1]), 1), "eval_curve": evals}


def run(recipe: str, seed: int) -> dict:
    out = ROOT / "outputs" / f"bench-{recipe}-seed{seed}"
    cmd = [sys.executable, "-m", "grouprl", "train", "-c", str(ROOT / "recipes" / f"{recipe}.yaml"), f"seed={seed}",
           f"output_dir={out}", "progress_bar=false"]
    load0, t0 = os.getloadavg()[0], time.perf_counter()
    subprocess.run(cmd, check=True, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    wall = time.perf_counter() - t0
    return {"seed": seed, "wall_s": round(wall, 1), "load_start": round(load0, 1),
            "load_end": round(os.getloadavg()[0], 1), **summarize(recipe, _records(out))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe", choices=["guess_number", "reasoning_gym"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args()
    runs = [run(args.recipe, s) for s in args.seeds]
    result = {"recipe": f"recipes/{args.recipe}.yaml", "runs": runs,
              "points_range": [min(r["points"] for r in runs), max(r["points"] for r in runs)]}
    path = ROOT / "benchmarks" / "results" / f"{args.recipe}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
