"""Which old log-probs should the clipped ratio of asynchronous GRPO use? Measured on a recipe.

Under ``max_staleness: k`` a round is sampled by weights up to k optimizer steps older than those that train
on it. Two objectives (docs/ALGORITHMS.md, "Asynchronous GRPO"):

* ``decoupled`` (what grouprl does; AReaL, arXiv 2505.24298, Eq. 5): the clipped ratio is pi_theta / pi_prox,
  pi_prox = the trainer's weights at the round's first step (recomputed by the trainer, or logp.detach() at
  that step), times the truncated behaviour weight min(pi_prox / pi_behav, rollout_is_cap) (TIS);
* ``behaviour``: the standard off-policy PPO ratio pi_theta / pi_behav, clipped, no extra weight.

For each, this script runs the recipe asynchronously and prints, as JSON per variant: the held-out accuracy
at each evaluation, the mean |log pi_prox - log pi_behav| per token, the fraction of tokens whose behaviour
ratio pi_prox / pi_behav already lies outside the clip range [1 - eps, 1 + eps_high] at the round's first
step (gradient the ``behaviour`` objective throws away before the policy moved at all), the clip fraction
the loss saw, and the wall time. ``sync`` is the synchronous baseline.

    OMP_NUM_THREADS=1 python benchmarks/async_objective.py --steps 30 --variants sync decoupled:1 behaviour:1
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time


def _instrument(variant: str, seen: dict) -> None:
    """Patch the loop's loss spec (in this, the trainer's, process) to record the behaviour ratio and,
    for ``behaviour``, to use pi_behav as the old policy without the TIS weight."""
    import torch

    import grouprl.train.algorithms.grpo as grpo
    import grouprl.train.engine.step as step

    real_spec, real_loss = grpo.loss_spec, step.micro_batch_loss

    def spec_with_probe(cfg):
        spec = real_spec(cfg)
        lo, hi = 1 - (cfg.epsilon or 0.2), 1 + (cfg.epsilon_high or cfg.epsilon or 0.2)
        inner = spec.correction

        def probe(old_logp, rollout_logp, mask, **kw):
            real = mask > 0
            d = (old_logp.detach() - rollout_logp)[real]
            ratio = d.exp()
            seen.setdefault("gap", []).append(float(d.abs().mean()) if d.numel() else 0.0)
            seen.setdefault("outside", []).append(float(((ratio < lo) | (ratio > hi)).float().mean()) if d.numel() else 0.0)
            if inner is None:
                return torch.ones_like(old_logp), {}
            return inner(old_logp, rollout_logp, mask, **kw)

        return dataclasses.replace(spec, correction=probe)

    def behaviour_loss(model, mb, spec, totals):
        if mb.rollout_logp is not None:
            spec.correction(mb.old_logp if mb.old_logp is not None else _current(model, mb, spec),
                            mb.rollout_logp, mb.loss_mask)  # record only
            mb = dataclasses.replace(mb, old_logp=mb.rollout_logp)
            spec = dataclasses.replace(spec, correction=None)
        return real_loss(model, mb, spec, totals)

    def _current(model, mb, spec):
        with torch.no_grad():
            lp, _ = step.completion_logps(model, mb.prompt_ids, mb.prompt_mask, mb.completion_ids, mb.completion_mask,
                                          spec.temperature, chunk_size=spec.logits_chunk_size,
                                          padding_free=spec.padding_free)
        return lp

    grpo.loss_spec = spec_with_probe
    if variant == "behaviour":
        step.micro_batch_loss = behaviour_loss


def run(recipe: str, variant: str, k: int, steps: int, seed: int, out: str) -> dict:
    from grouprl.config import GRPOConfig
    from grouprl.train import GRPOTrainer

    seen: dict = {}
    if variant != "sync":
        _instrument(variant, seen)
    overrides = [f"max_steps={steps}", f"seed={seed}", f"output_dir={out}", "eval_steps=10", "save_strategy=no",
                 "report_to=none", "progress_bar=false", "resume_from_checkpoint=null", f"max_staleness={k}",
                 "overwrite_output_dir=true"]
    cfg = GRPOConfig.from_yaml(recipe, overrides)
    t0 = time.perf_counter()
    result = GRPOTrainer(config=cfg).train()
    wall = time.perf_counter() - t0
    recs = [json.loads(x) for x in open(f"{out}/metrics.jsonl")]
    evals = {e["step"]: e["accuracy"] for e in result["evals"].values()}
    clip = [r["policy/clip_frac"] for r in recs if "policy/clip_frac" in r]
    return {"variant": variant, "max_staleness": k, "seed": seed, "steps": steps, "wall_s": round(wall, 1),
            "eval_accuracy": evals,
            "logp_gap_mean": _mean(seen.get("gap")), "behaviour_ratio_outside_clip": _mean(seen.get("outside")),
            "loss_clip_frac_mean": _mean(clip)}


def _mean(xs):
    return round(sum(xs) / len(xs), 5) if xs else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", default="recipes/default.yaml")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--variants", nargs="+", default=["sync", "decoupled:1", "behaviour:1"],
                    help="sync, decoupled:K or behaviour:K")
    ap.add_argument("--out", default="runs/async_objective")
    a = ap.parse_args()
    import subprocess
    import sys

    for v in a.variants:  # one process per variant: the patches stay in their run
        name, _, k = v.partition(":")
        cmd = [sys.executable, __file__, "--one", name, k or "0", str(a.steps), str(a.seed), a.recipe,
               f"{a.out}/{name}{k}_s{a.seed}"]
        subprocess.run(cmd, check=True)


if __name__ == "__main__":
    import sys

    if len(sys.argv) > 1 and sys.argv[1] == "--one":
        _, _, name, k, steps, seed, recipe, out = sys.argv
        print(json.dumps(run(recipe, name, int(k), int(steps), int(seed), out)), flush=True)
    else:
        main()
