"""How long ``grouprl report`` takes to build a run's HTML report; prints JSON.

Builds from a run folder given with ``--run`` (e.g. the default recipe's output) and from a synthetic
1000-step run with a sample review in every window (written to a temporary folder), ``--repeat`` times
each, and reports the median and max seconds and the page size. Target: under 2 s per report.

    python benchmarks/report_build.py --run runs/default
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path


def synthetic_run(path: Path, steps: int = 1000, per_step: int = 8) -> Path:
    rng = random.Random(0)
    path.mkdir(parents=True, exist_ok=True)
    with (path / "metrics.jsonl").open("w") as f:
        for s in range(1, steps + 1):
            p = 0.2 + 0.6 * (1 - math.exp(-s / 300))
            row = {"step": s, "reward": p + rng.uniform(-0.05, 0.05), "rewards/accuracy/mean": p,
                   "rewards/accuracy/std": 0.4, "kl": 0.01, "entropy": 1.0, "completions/mean_length": 40,
                   "frac_reward_zero_std": 0.2, "lr": 1e-5, "grad_norm": 0.5, "tokens_per_s": 900.0,
                   **{f"time/{k}": 0.1 for k in ("generate", "reward", "ref_forward", "policy_fwd_bwd", "step")}}
            if s % 50 == 0:
                row["eval/accuracy"] = p
            f.write(json.dumps(row) + "\n")
    with (path / "samples.jsonl").open("w") as f:
        for s in range(10, steps + 1, 10):
            for i in range(per_step):
                r = float(rng.random() < 0.5)
                f.write(json.dumps({"step": s, "prompt": f"question {s}/{i} " * 5, "completion": "answer " * 30,
                                    "reward": r, "rewards": {"accuracy": r}, "advantage": r - 0.5}) + "\n")
    return path


def timed(run: Path, out: Path, repeat: int) -> dict:
    from grouprl.report import build_report

    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        build_report(run, out)
        times.append(time.perf_counter() - t)
    steps = sum(1 for _ in (run / "metrics.jsonl").open())
    return {"run": str(run), "logged_steps": steps, "median_s": round(statistics.median(times), 3),
            "max_s": round(max(times), 3), "html_mb": round(out.stat().st_size / 1e6, 2), "under_2s": max(times) < 2.0}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", action="append", default=[], help="a run folder to time (repeatable)")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        runs = [Path(r) for r in args.run] + [synthetic_run(Path(d) / "synthetic-1000")]
        results = [timed(r, Path(d) / f"report-{i}.html", args.repeat) for i, r in enumerate(runs)]
    print(json.dumps({"benchmark": "report_build", "python": sys.version.split()[0], "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
