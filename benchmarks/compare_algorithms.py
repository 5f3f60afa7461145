"""PPO, DPO, GRPO and GSPO from the same warm start on builtin:arithmetic: accuracy, time and memory.

Every run is the real trainer (``grouprl train`` with a recipe) in its own child process, so peak RSS
belongs to one run. Each algorithm makes the same number of policy updates (``--steps``) from the same
warm-start model (builtin:arithmetic, cached) on the same task, with each algorithm's own recipe:

    grpo  recipes/default.yaml                     G = 8, 128 completions per update, on-policy
    gspo  recipes/default.yaml, algorithm=gspo,    64 x 2 micro-batches per update, steps_per_generation 4:
          off-policy                               one round feeds 2 updates, so the second update's
                                                   sequence ratio moves and the 3e-4 / 4e-4 clip binds
    ppo   recipes/ppo.yaml                         G = 1, 128 prompts per update, critic + GAE, KL reward
    dpo   recipes/dpo.yaml (builtin:arithmetic_prefs, offline pairs from the warm start's own samples),
          skipped with a note when ``algorithm: dpo`` is not available in this checkout

Reported per algorithm (mean over ``--seeds``): held-out accuracy before / after (greedy, the recipe's 200
held-out prompts), training seconds per update (the trainer's ``time/step``, evaluation excluded), the
sample budget (completions generated, or preference pairs read), and memory. Memory is measured, not
computed: bytes of parameters of each model the run holds (policy = the first optimizer to step, reference = the
frozen copy ``train.engine.model.Reference`` makes, critic = the parameters of a second optimizer), bytes of gradients (summed
over ``p.grad`` just before each optimizer step) and of optimizer states (summed over ``optimizer.state``
just after), and the process's peak RSS (``ru_maxrss``) and its rise over the RSS after the imports,
each also as a multiple of the policy's parameter bytes.

    python benchmarks/compare_algorithms.py                     # 30 updates, seeds 0 1
    python benchmarks/compare_algorithms.py --steps 20 --seeds 0 1 --algorithms grpo ppo
    python benchmarks/compare_algorithms.py --steps 20 --reuse benchmarks/results/compare_algorithms.json
                                                                # rerun only what failed or is missing

Writes ``benchmarks/results/compare_algorithms.{json,md,png}`` (``--out``). The PNG needs matplotlib
(``pip install -e ".[bench]"``); without it the JSON and markdown are still written.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMON = ["eval_steps=0", "save_strategy='no'", "report_to=none", "progress_bar=false", "overwrite_output_dir=true",
          "log_completions_steps=0", "torch_num_threads=1"]
RUNS = {
    "grpo": ("default.yaml", ["algorithm=grpo"]),
    "gspo": ("default.yaml", ["algorithm=gspo", "per_device_train_batch_size=64", "gradient_accumulation_steps=2",
                              "steps_per_generation=4"]),
    "ppo": ("ppo.yaml", []),
    "dpo": ("dpo.yaml", []),
}


# ---- the child: one training run, instrumented ------------------------------------------------------
def _rss_now() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _nbytes(tensors) -> int:
    return int(sum(t.numel() * t.element_size() for t in tensors))


def child(algorithm: str, seed: int, steps: int, out_dir: str) -> dict:
    """Train one algorithm once; return accuracies, time per update, sample budget and memory."""
    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    from grouprl.config import GRPOConfig
    from grouprl.train import GRPOTrainer
    from grouprl.train.engine import model as model_mod

    recipe, extra = RUNS[algorithm]
    cfg = GRPOConfig.from_yaml(ROOT / "recipes" / recipe, [*extra, *COMMON, f"max_steps={steps}", f"seed={seed}",
                                                           f"output_dir={out_dir}"])
    frozen, seen = [], {}

    def frozen_copy(model, _orig=model_mod._frozen_copy):
        ref = _orig(model)
        frozen.append(ref)
        return ref

    model_mod._frozen_copy = frozen_copy  # Reference() looks it up at call time

    def pre(opt, args, kwargs):
        params = [p for g in opt.param_groups for p in g["params"]]
        rec = seen.setdefault(id(opt), {"opt": opt, "params": params, "grads": 0, "states": 0})
        rec["grads"] = max(rec["grads"], _nbytes(p.grad for p in params if p.grad is not None))

    def post(opt, args, kwargs):
        rec = seen[id(opt)]
        states = [v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
        rec["states"] = max(rec["states"], _nbytes(states))

    register_optimizer_step_pre_hook(pre)
    register_optimizer_step_post_hook(post)
    rss_base = _rss_now()  # after the imports, before any model loads
    t0 = time.perf_counter()
    if algorithm == "dpo":  # offline pairs: its own loop, as `grouprl train` runs it
        from grouprl.train.algorithms.dpo_run import run_dpo

        result = run_dpo(cfg)
    else:
        result = GRPOTrainer(config=cfg).train()
    wall = time.perf_counter() - t0
    models = {}
    for i, rec in enumerate(seen.values()):  # the policy's optimizer steps first (PPO: then the critic's)
        models["policy" if i == 0 else "critic"] = {"params": _nbytes(rec["params"]), "grads": rec["grads"],
                                                    "optimizer": rec["states"]}
    if frozen:
        models["reference"] = {"params": sum(_nbytes(m.parameters()) for m in frozen), "grads": 0, "optimizer": 0}
    records = [json.loads(line) for line in open(result["metrics_path"])]
    step_times = [r["time/step"] for r in records if isinstance(r.get("time/step"), (int, float))]
    clip = [r["policy/clip_frac"] for r in records if isinstance(r.get("policy/clip_frac"), (int, float))]
    evals = result["evals"]
    return {"algorithm": algorithm, "seed": seed, "steps": result["global_step"],
            "before": evals.get("before", {}).get("accuracy"), "after": evals.get("after", {}).get("accuracy"),
            "eval_prompts": evals.get("after", {}).get("num_prompts"),
            "seconds_per_update": sum(step_times) / max(1, len(step_times)), "wall_seconds": round(wall, 1),
            "clip_frac_mean": sum(clip) / max(1, len(clip)), "clip_frac_max": max(clip, default=0.0),
            "budget": budget(cfg, result["global_step"], result.get("prefs")), "models": models,
            "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "rss_base": rss_base,
            "prefs": result.get("prefs")}


def budget(cfg, steps: int, prefs: dict | None = None) -> dict:
    """What the run consumed: completions generated (online), or preference pairs read (offline) and the
    samples drawn once, before training, to build them (``prefs``: builtin:arithmetic_prefs' record)."""
    if cfg.algorithm == "dpo":
        per_update = cfg.per_device_train_batch_size * cfg.gradient_accumulation_steps
        return {"kind": "preference pairs", "per_update": per_update, "total": per_update * steps,
                "offline_samples": (prefs or {}).get("samples_drawn"), "pairs_built": (prefs or {}).get("num_pairs")}
    per_round = cfg.num_iterations * cfg.effective_steps_per_generation // cfg.gradient_accumulation_steps
    rounds = -(-steps // per_round)
    return {"kind": "completions", "per_update": cfg.generation_batch_size / per_round,
            "total": rounds * cfg.generation_batch_size, "prompts": rounds * cfg.prompts_per_generation,
            "num_generations": cfg.num_generations, "updates_per_round": per_round}


# ---- the parent ---------------------------------------------------------------------------------------
def dpo_available() -> str | None:
    """None when ``algorithm: dpo`` trains in this checkout, else why not."""
    if not (ROOT / "recipes" / "dpo.yaml").is_file():
        return "recipes/dpo.yaml is missing: algorithm: dpo has not landed in this checkout"
    try:
        from grouprl.config import GRPOConfig

        GRPOConfig.from_yaml(ROOT / "recipes" / "dpo.yaml")
    except Exception as e:  # any config error means DPO cannot run here
        return f"recipes/dpo.yaml does not load ({type(e).__name__}: {e})"
    return None


def run_child(algorithm: str, seed: int, steps: int, timeout: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        cmd = [sys.executable, __file__, "--child", algorithm, "--seed", str(seed), "--steps", str(steps),
               "--child-out", str(out), "--child-dir", str(Path(tmp) / "run")]
        env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))
        try:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"algorithm": algorithm, "seed": seed, "error": f"timed out after {timeout} s (raise --timeout)"}
        if proc.returncode != 0 or not out.is_file():
            return {"algorithm": algorithm, "seed": seed, "error": proc.stderr.strip().splitlines()[-1:]}
        return json.loads(out.read_text())


def summarize(runs: list[dict]) -> dict:
    """Per algorithm: means over seeds; memory of the first seed (it does not depend on the seed)."""
    out = {}
    for alg in dict.fromkeys(r["algorithm"] for r in runs):
        ok = [r for r in runs if r["algorithm"] == alg and "error" not in r]
        if not ok:
            out[alg] = {"error": next(r["error"] for r in runs if r["algorithm"] == alg)}
            continue
        p = ok[0]["models"]["policy"]["params"]
        models = {name: {**m, "total": sum(m.values()), "x_policy_params": round(sum(m.values()) / p, 2)}
                  for name, m in ok[0]["models"].items()}
        state = sum(m["total"] for m in models.values())
        out[alg] = {
            "seeds": [r["seed"] for r in ok], "steps": ok[0]["steps"],
            "before": statistics.mean(r["before"] for r in ok), "after": statistics.mean(r["after"] for r in ok),
            "after_per_seed": [r["after"] for r in ok], "eval_prompts": ok[0]["eval_prompts"],
            "seconds_per_update": statistics.mean(r["seconds_per_update"] for r in ok), "budget": ok[0]["budget"],
            # DPO has no importance ratio (offline pairs): no clip fraction to report
            "clip_frac_mean": None if alg == "dpo" else statistics.mean(r.get("clip_frac_mean", 0.0) for r in ok),
            "models": models, "policy_param_bytes": p, "weights_x": round(sum(m["params"] for m in models.values()) / p, 2),
            "train_state_x": round(state / p, 2),
            "peak_rss": max(r["peak_rss"] for r in ok), "peak_rss_x": round(max(r["peak_rss"] for r in ok) / p, 1),
            "rss_rise_x": round(max(r["peak_rss"] - r.get("rss_base", r.get("rss_after_load", 0)) for r in ok) / p, 1),
        }
    return out


def markdown(summary: dict, notes: list[str]) -> str:
    mib = lambda b: f"{b / 2**20:.2f}"  # noqa: E731
    lines = ["| algorithm | held-out acc. before → after | updates | sample budget | s / update | "
             "policy clip frac. (mean) | weights (× policy params) | "
             "params + grads + Adam states, per model (× policy params) | "
             "all training state (×) | peak RSS MiB (×) | RSS rise over imports MiB (×) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for alg, s in summary.items():
        if "error" in s:
            lines.append(f"| {alg} | failed: {s['error']} | | | | | | | | | |")
            continue
        b = s["budget"]
        budget_text = (f"{b['total']} pairs (of {b.get('pairs_built')} built from {b.get('offline_samples')} "
                       f"samples drawn once before training)" if b["kind"] == "preference pairs" else
                       f"{b['total']} completions ({b['prompts']} prompts × G={b['num_generations']})")
        per_model = "; ".join(f"{n} {mib(m['params'])}+{mib(m['grads'])}+{mib(m['optimizer'])} MiB "
                              f"({m['x_policy_params']}×)" for n, m in s["models"].items())
        p = s["policy_param_bytes"]
        seeds = ", ".join(f"{100 * a:.1f}" for a in s["after_per_seed"])
        clip = "–" if s.get("clip_frac_mean") is None else f"{s['clip_frac_mean']:.4f}"
        lines.append(f"| {alg} | {100 * s['before']:.1f}% → **{100 * s['after']:.1f}%** (seeds: {seeds}) | "
                     f"{s['steps']} | {budget_text} | {s['seconds_per_update']:.2f} | {clip} | "
                     f"{s['weights_x']}× | {per_model} | "
                     f"{s['train_state_x']}× | {mib(s['peak_rss'])} ({s['peak_rss_x']}×) | "
                     f"{mib(s['rss_rise_x'] * p)} ({s['rss_rise_x']}×) |")
    return "\n".join(lines + [""] + [f"- {n}" for n in notes]) + "\n"


def plot(summary: dict, path: Path) -> str | None:
    try:
        import matplotlib
    except ImportError:
        return "matplotlib is not installed (pip install -e '.[bench]'): no PNG written"
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    algs = [a for a, s in summary.items() if "error" not in s]
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(14, 4))
    x = range(len(algs))
    ax1.bar([i - 0.2 for i in x], [100 * summary[a]["before"] for a in algs], 0.4, label="before")
    ax1.bar([i + 0.2 for i in x], [100 * summary[a]["after"] for a in algs], 0.4, label="after")
    ax1.set_ylabel("held-out accuracy (%)")
    ax1.set_ylim(0, 100)
    ax2.bar(x, [summary[a]["seconds_per_update"] for a in algs])
    ax2.set_ylabel("seconds per policy update (CPU)")
    bottom = [0.0] * len(algs)
    for name in ("policy", "reference", "critic"):
        for part in ("params", "grads", "optimizer"):
            h = [summary[a]["models"].get(name, {}).get(part, 0) / summary[a]["policy_param_bytes"] for a in algs]
            if any(h):
                ax3.bar(x, h, bottom=bottom, label=f"{name} {part}")
                bottom = [b + v for b, v in zip(bottom, h)]
    ax3.set_ylabel("training state (× policy parameter bytes)")
    for ax in (ax1, ax2, ax3):
        ax.set_xticks(list(x), algs)
        ax.grid(alpha=0.3, axis="y")
    ax1.legend(loc="upper left")
    ax3.legend(fontsize=7)
    fig.suptitle("builtin:arithmetic, same warm start, same number of policy updates")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--algorithms", nargs="+", default=["ppo", "dpo", "grpo", "gspo"], choices=list(RUNS))
    ap.add_argument("--steps", type=int, default=30, help="policy updates per run (the same for every algorithm)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--timeout", type=int, default=3600, help="seconds per run")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "compare_algorithms.json"))
    ap.add_argument("--reuse", help="an earlier JSON of this script: its successful runs with the same "
                    "algorithm, seed and --steps are kept, only the others are run")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--child-out", help=argparse.SUPPRESS)
    ap.add_argument("--child-dir", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        Path(args.child_out).write_text(json.dumps(child(args.child, args.seed, args.steps, args.child_dir)))
        return 0
    if len(args.seeds) < 2:
        print("note: fewer than 2 seeds; the accuracy is one run, not a mean", file=sys.stderr)
    notes, runs = [], []
    algorithms = list(args.algorithms)
    if "dpo" in algorithms and (why := dpo_available()):
        notes.append(f"dpo skipped: {why}.")
        algorithms.remove("dpo")
    earlier = {(r["algorithm"], r["seed"]): r for r in json.loads(Path(args.reuse).read_text())["runs"]
               if "error" not in r and r["steps"] == args.steps} if args.reuse else {}
    for alg in algorithms:
        for seed in args.seeds:
            if (alg, seed) in earlier:
                print(f"reusing {alg} seed {seed} from {args.reuse}", file=sys.stderr, flush=True)
                runs.append(earlier[(alg, seed)])
                continue
            print(f"running {alg} seed {seed} ({args.steps} updates) ...", file=sys.stderr, flush=True)
            runs.append(run_child(alg, seed, args.steps, args.timeout))
    summary = summarize(runs)
    notes.append(f"{args.steps} policy updates per run, seeds {args.seeds}, 1 torch thread per run, CPU; "
                 f"accuracy = greedy on the recipe's held-out prompts, mean over seeds.")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if (why := plot(summary, out.with_suffix(".png"))):
        notes.append(why)
    out.write_text(json.dumps({"args": vars(args), "summary": summary, "runs": runs, "notes": notes}, indent=1))
    out.with_suffix(".md").write_text(markdown(summary, notes))
    print(markdown(summary, notes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
