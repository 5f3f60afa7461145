"""Synchronous vs asynchronous GRPO (``max_staleness: 0 / 1 / 2``) on this machine, and a simulated GPU split.

For each recipe (``default``: single-turn arithmetic; ``agent``: the calculator tool agent), each
``max_staleness`` k and each seed, one ``grouprl train`` child process (``OMP_NUM_THREADS=1``: the trainer
and, for k >= 1, its rollout worker one torch thread each). Per run: the training seconds to the last
step (the sum of the trainer's own ``time/step``: generation or the wait for the worker's round, scoring,
update; the held-out evaluations and checkpoint writes are not counted, the worker's start-up before
step 1 is not either), the child's whole wall time, the held-out accuracy after training, and the
``async/*`` figures. Per recipe:

- ``speedup`` = sync training seconds / async training seconds (means over seeds);
- ``bound`` = step / max(generate, rest) from the synchronous runs' phase times (``time/generate`` and
  the rest of ``time/step``): what perfect overlap of generation with everything else could give;
  ``bound_worker`` counts the worker's whole share (generate + reward) against the trainer's rest;
- ``of_bound`` = (speedup - 1) / (bound - 1): 1.0 = all the overlap the bound allows (the target is >= 0.9).

The GPU split (``--sim``): the default recipe with :class:`PacedEngine`, a rollout backend whose
``generate`` is padded with sleep to ``gen_s`` seconds -- a generation that does not compete for the CPU,
as on a separate device -- chosen so that generation is ``--sim-ratio`` (0.7: verl's 32B DAPO figure,
docs/advance/fully_async.md) of a synchronous step. Its bound is 1 / 0.7 = 1.43x.

    python benchmarks/async_overlap.py                      # the full grid (about 15 min on 2 idle cores)
    python benchmarks/async_overlap.py --smoke              # 2 steps, 1 seed: does every cell run?

Writes ``benchmarks/results/async_overlap.{json,png}`` (``--out``) and prints the JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECIPES = {"default": "recipes/default.yaml", "agent": "recipes/agent_calculator.yaml"}


class PacedEngine:
    """The transformers backend with ``generate`` padded by sleep to ``$GROUPRL_BENCH_GEN_S`` seconds
    (``rollout_backend: "async_overlap:PacedEngine"``): a simulated accelerator-side generation."""

    shared_engine = False

    def __init__(self, model, tokenizer, **kwargs):
        from grouprl.rollout.hf import TransformersBackend

        self.inner, self.gen_s = TransformersBackend(model, tokenizer, **kwargs), float(os.environ["GROUPRL_BENCH_GEN_S"])

    def sync_weights(self, model):
        self.inner.sync_weights(model)

    def generate(self, prompts, n, params):
        t0 = time.perf_counter()
        out = self.inner.generate(prompts, n, params)
        time.sleep(max(0.0, self.gen_s - (time.perf_counter() - t0)))
        return out


def run(recipe: str, k: int, seed: int, steps: int, work: Path, extra: list[str], env: dict | None = None) -> dict:
    """One ``grouprl train`` child; its figures from metrics.jsonl."""
    out = work / f"{Path(recipe).stem}-k{k}-s{seed}-{len(extra)}"
    cmd = [sys.executable, "-m", "grouprl.cli", "train", "-c", str(ROOT / recipe), f"seed={seed}", f"max_staleness={k}",
           f"max_steps={steps}", f"output_dir={out}", "eval_steps=0", "eval_before_train=false",
           "save_steps=100000", "report_to=none",
           "progress_bar=false", "overwrite_output_dir=true", "resume_from_checkpoint=null", *extra]
    child_env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", **(env or {}))
    child_env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "benchmarks"), os.environ.get("PYTHONPATH")) if p)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=child_env, capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps_ = [r for r in records if "time/step" in r]
    after = [r for r in records if r.get("eval/tag") == "after"]

    def mean(key: str) -> float | None:  # over steps 2.. (step 1 warms up: first generation, allocator)
        vals = [r[key] for r in steps_[1:] or steps_ if isinstance(r.get(key), (int, float))]
        return statistics.fmean(vals) if vals else None

    return {"recipe": Path(recipe).stem, "max_staleness": k, "seed": seed, "steps": len(steps_),
            "train_s": sum(r["time/step"] for r in steps_), "wall_s": wall,
            "accuracy": after[-1].get("eval/accuracy") if after else None,
            "step_s": mean("time/step"), "generate_s": mean("time/generate"), "reward_s": mean("time/reward"),
            "staleness_mean": mean("async/staleness_mean"), "staleness_max": max(
                (r.get("async/staleness_max") or 0 for r in steps_), default=None) if k else None,
            "dropped": (steps_[-1].get("async/dropped") or 0) if k else None,  # cumulative
            "trainer_wait_s": mean("async/trainer_wait_s"), "worker_generate_s": mean("async/worker_generate_s"),
            "worker_logp_s": mean("async/worker_logp_s")}


def bounds(sync_runs: list[dict]) -> dict:
    """step / max(generate, rest) from the synchronous runs' mean phase times (steps 2..)."""
    step = statistics.fmean(r["step_s"] for r in sync_runs)
    gen = statistics.fmean(r["generate_s"] for r in sync_runs)
    reward = statistics.fmean(r["reward_s"] or 0.0 for r in sync_runs)
    return {"step_s": step, "generate_s": gen, "reward_s": reward, "generate_frac": gen / step,
            "bound": step / max(gen, step - gen), "bound_worker": step / max(gen + reward, step - gen - reward)}


def summarize(runs: list[dict], staleness: list[int]) -> dict:
    sync = [r for r in runs if r["max_staleness"] == 0]
    out = {"bound": bounds(sync), "by_staleness": {}}
    base = statistics.fmean(r["train_s"] for r in sync)
    for k in staleness:
        rs = [r for r in runs if r["max_staleness"] == k]
        acc = [r["accuracy"] for r in rs if r["accuracy"] is not None]
        train = statistics.fmean(r["train_s"] for r in rs)
        speedup = base / train
        row = {"train_s_mean": train, "train_s": [r["train_s"] for r in rs], "speedup": speedup,
               "wall_s_mean": statistics.fmean(r["wall_s"] for r in rs),
               "accuracy": acc, "accuracy_range": [min(acc), max(acc)] if acc else None}
        if k:
            b = out["bound"]["bound"]
            row["of_bound"] = (speedup - 1) / (b - 1) if b > 1 else None
            row["staleness_mean"] = statistics.fmean(r["staleness_mean"] for r in rs)
            row["dropped"] = sum(r["dropped"] or 0 for r in rs)
            row["trainer_wait_s_mean"] = statistics.fmean(r["trainer_wait_s"] for r in rs)
        out["by_staleness"][str(k)] = row
    return out


def simulate(steps: int, ratio: float, staleness: list[int], sync_default: list[dict], work: Path) -> dict:
    """The default recipe with generation padded to ``ratio`` of a synchronous step (a GPU-side engine)."""
    rest = statistics.fmean(r["step_s"] - r["generate_s"] for r in sync_default)
    gen_s = rest * ratio / (1 - ratio)
    env = {"GROUPRL_BENCH_GEN_S": f"{gen_s:.4f}"}
    runs = [run(RECIPES["default"], k, 0, steps, work, ["rollout_backend=async_overlap:PacedEngine"], env)
            for k in staleness]
    base = runs[0]["train_s"]
    measured = bounds(runs[:1])
    return {"ratio": ratio, "gen_s": gen_s, "rest_s": rest, "bound": 1 / ratio, "measured_bound": measured,
            "runs": runs, "speedup": {str(r["max_staleness"]): base / r["train_s"] for r in runs}}


def plot(report: dict, path: Path) -> str | None:
    try:
        import matplotlib
    except ImportError:
        return "matplotlib is not installed (pip install -e '.[bench]'): no PNG written"
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(name, s) for name, s in report["recipes"].items()]
    if report.get("sim"):
        sim = report["sim"]
        panels.append((f"GPU split sim ({sim['ratio']:.0%} gen)", {"bound": {"bound": sim["bound"]}, "by_staleness": {
            k: {"speedup": v} for k, v in sim["speedup"].items()}}))
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.4), squeeze=False)
    for ax, (name, s) in zip(axes[0], panels):
        ks = list(s["by_staleness"])
        ax.bar([f"k={k}" for k in ks], [s["by_staleness"][k]["speedup"] for k in ks], color="#4c72b0")
        ax.axhline(s["bound"]["bound"], color="#c44e52", ls="--", label=f"bound {s['bound']['bound']:.2f}x")
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_title(name)
        ax.set_ylabel("speedup vs synchronous (training s)")
        ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--recipes", nargs="+", default=list(RECIPES), choices=list(RECIPES))
    p.add_argument("--staleness", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=20, help="max_steps of the default recipe")
    p.add_argument("--agent-steps", type=int, default=10, help="max_steps of the agent recipe")
    p.add_argument("--sim-steps", type=int, default=12)
    p.add_argument("--sim-ratio", type=float, default=0.7)
    p.add_argument("--no-sim", action="store_true")
    p.add_argument("--smoke", action="store_true", help="2 steps, seed 0: a functional check, not a measurement")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "async_overlap")
    a = p.parse_args(argv)
    if a.smoke:
        a.seeds, a.steps, a.agent_steps, a.sim_steps = a.seeds[:1], 2, 2, 2
    assert a.staleness[0] == 0, "the first --staleness must be 0 (the synchronous baseline)"
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    report: dict = {"started_utc": started, "smoke": a.smoke, "settings": {
        "steps": {"default": a.steps, "agent": a.agent_steps, "sim": a.sim_steps}, "seeds": a.seeds,
        "staleness": a.staleness, "threads": "OMP_NUM_THREADS=1 per process"}, "recipes": {}, "runs": []}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    suffix = "_smoke" if a.smoke else ""

    def dump() -> None:  # after each part: a run cut short keeps what it measured
        report["finished_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        Path(f"{a.out}{suffix}.json").write_text(json.dumps(report, indent=1))
        note = plot(report, Path(f"{a.out}{suffix}.png"))
        if note:
            report["plot"] = note

    with tempfile.TemporaryDirectory(prefix="async-overlap-") as tmp:
        work = Path(tmp)
        for name in a.recipes:  # the default recipe first, then the GPU split built on it, then the agent
            steps = a.steps if name == "default" else a.agent_steps
            runs = [run(RECIPES[name], k, s, steps, work, []) for s in a.seeds for k in a.staleness]
            report["runs"] += runs
            report["recipes"][name] = summarize(runs, a.staleness)
            dump()
            if name == "default" and not a.no_sim:
                sync_default = [r for r in runs if r["max_staleness"] == 0]
                report["sim"] = simulate(a.sim_steps, a.sim_ratio, a.staleness, sync_default, work)
                dump()
    print(json.dumps(report, indent=1))
    print(markdown(report))
    return 0


def markdown(report: dict) -> str:
    """The results as the Markdown table of benchmarks/README.md."""
    lines = ["| recipe | k | training s: mean (per seed) | speedup | bound | of bound | held-out accuracy | "
             "staleness mean | dropped | process wall s |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name, s in report["recipes"].items():
        for k, row in s["by_staleness"].items():
            lines.append(_row(name, k, row, s["bound"]["bound"]))
    sim = report.get("sim")
    if sim:
        lines.append("")
        lines.append(f"GPU split (generation padded to {sim['gen_s']:.2f} s = {sim['ratio']:.0%} of a synchronous step, "
                     f"rest {sim['rest_s']:.2f} s; bound {sim['bound']:.3f}x): " +
                     ", ".join(f"k={k} {v:.3f}x" for k, v in sim["speedup"].items()))
    return "\n".join(lines)


def _row(name: str, k: str, row: dict, bound: float) -> str:
    acc, share = row["accuracy_range"], row.get("of_bound")
    per_seed = ", ".join(f"{t:.1f}" for t in row["train_s"])
    return (f"| {name} | {k} | {row['train_s_mean']:.1f} ({per_seed}) | {row['speedup']:.3f}x | {bound:.3f}x | "
            f"{'-' if share is None else f'{share:.0%}'} | {f'{acc[0]:.3f}-{acc[1]:.3f}' if acc else '-'} | "
            f"{row.get('staleness_mean', 0):.2f} | {row.get('dropped', 0)} | {row['wall_s_mean']:.0f} |")


if __name__ == "__main__":
    sys.exit(main())
