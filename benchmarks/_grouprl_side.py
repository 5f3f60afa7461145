"""The grouprl side of the benchmark: one ``grouprl.GRPOTrainer`` run of a :class:`Workload`.

The per-step breakdown is the trainer's own: it logs ``time/generate``, ``time/reward``,
``time/ref_forward``, ``time/old_logp_forward``, ``time/policy_fwd_bwd``, ``time/optimizer``,
``time/other`` and ``time/step`` for every optimizer step into ``metrics.jsonl``; this module reads them
back. The harness adds only what the trainer does not log: process CPU time per step, the number of
completion tokens generated, and forcing every completion to ``max_new_tokens`` (as on the TRL side).
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

from _common import StepClock, Workload, dtype_probe, make_dataset_rows, number_reward

# trainer metric -> benchmark phase
TIMERS = {"generate": "time/generate", "reward": "time/reward", "ref_logp": "time/ref_forward",
          "old_logp": "time/old_logp_forward", "policy_fwd_bwd": "time/policy_fwd_bwd",
          "optimizer": "time/optimizer"}


def grouprl_config(w: Workload, output_dir: str):
    """``grouprl.GRPOConfig`` equal to ``w`` and to :func:`_trl_side.trl_config_kwargs` (same conventions).

    ``w.grouprl_opts`` (``vs_trl.py --grouprl-opt key=value``) is applied last, over these fields.
    """
    from grouprl import GRPOConfig

    fields = dict(
        output_dir=output_dir,
        device="cpu",
        bf16=w.precision == "bf16",  # on a bf16 CPU: autocast; rollout_dtype / ref_dtype auto follow
        gradient_checkpointing=False,
        report_to="none",
        logging_steps=1,
        progress_bar=False,
        save_strategy="no",
        log_completions_steps=0,
        eval_split=None,
        eval_before_train=False,
        seed=w.seed,
        max_steps=w.steps,
        learning_rate=w.learning_rate,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        adam_beta1=0.9,
        adam_beta2=0.999,  # TRL/transformers' default
        adam_epsilon=1e-8,
        max_grad_norm=w.max_grad_norm,
        num_generations=w.num_generations,
        per_device_train_batch_size=w.micro_batch,
        gradient_accumulation_steps=w.grad_accum,
        steps_per_generation=w.steps_per_generation,
        num_iterations=1,
        max_new_tokens=w.max_new_tokens,
        max_prompt_length=None,
        temperature=w.temperature,
        top_p=1.0,
        top_k=0,
        algorithm="gspo" if w.level == "sequence" else "grpo",
        importance_sampling_level=w.level,
        loss_aggregation="token_mean",  # TRL's loss_type="dapo"
        advantage="grpo",
        scale_rewards="group",
        epsilon=w.eps_low,
        epsilon_high=w.eps_high,
        kl_coef=w.beta,
        kl_estimator="k3",  # TRL's estimator
        dynamic_sampling="none",
        mask_truncated_completions=False,
        rollout_backend=w.rollout_backend,
    )
    return GRPOConfig(**{**fields, **w.grouprl_opts})


def _force_length(model: Any, max_new_tokens: int) -> None:
    """Every completion exactly ``max_new_tokens`` long: ``min_new_tokens`` on whatever samples.

    Uses the rollout's own ``SamplingParams.min_new_tokens`` when it has one, otherwise sets
    ``min_new_tokens`` on the ``GenerationConfig`` handed to ``model.generate`` (what TRL gets through
    ``generation_kwargs``).
    """
    import grouprl.train.algorithms.grpo as loop
    from grouprl.rollout import SamplingParams

    if "min_new_tokens" in {f.name for f in dataclasses.fields(SamplingParams)}:
        def params(*args, **kwargs):
            return dataclasses.replace(SamplingParams(*args, **kwargs), min_new_tokens=max_new_tokens)

        loop.SamplingParams = params
        return
    generate = model.generate

    def forced(*args, generation_config=None, **kwargs):
        if generation_config is not None:  # the backend builds a fresh config per call
            generation_config.min_new_tokens = max_new_tokens
        return generate(*args, generation_config=generation_config, **kwargs)

    model.generate = forced


def _count_tokens(counts: list[int]) -> None:
    """Record the real completion tokens of every rollout (sum of ``completion_mask``)."""
    import grouprl.train.algorithms.grpo as loop
    from grouprl.rollout import make_backend

    def make(*args, **kwargs):
        backend = make_backend(*args, **kwargs)
        generate = backend.generate

        def counted(*a, **kw):
            rollout = generate(*a, **kw)
            counts.append(int(rollout.completion_mask.sum()))
            return rollout

        backend.generate = counted
        return backend

    loop.make_backend = make


def _cpu_per_step(cpu: list[float]) -> None:
    """Process CPU time at each ``Timers.pop`` (the trainer pops once per optimizer step)."""
    from grouprl.train import metrics

    pop = metrics.Timers.pop

    def timed_pop(self):
        cpu.append(time.process_time())
        return pop(self)

    metrics.Timers.pop = timed_pop


def _mismatch(records: list[dict[str, Any]]) -> dict[str, float]:
    """Mean over the optimizer steps of each ``mismatch/*`` metric (sampler vs trainer log-probs; logged
    when the sampler reports its own log-probs, e.g. ``rollout_dtype: bfloat16``); max of ``*_max``."""
    keys = sorted({k for r in records for k in r if k.startswith("mismatch/")})
    out = {}
    for k in keys:
        values = [float(r[k]) for r in records if r.get(k) is not None]
        out[k] = max(values) if k.endswith("_max") else sum(values) / len(values)
    return out


def run_grouprl(w: Workload, model_dir: str, work_dir: str) -> dict[str, Any]:
    """Train ``w.steps`` optimizer steps with grouprl; return the step summary."""
    import torch

    torch.set_num_threads(w.threads)
    from grouprl import GRPOTrainer

    rewards: list[float] = []

    def reward(completions, answer, **kwargs):
        values = number_reward(completions, answer)
        rewards.extend(values)
        return values

    reward.__name__ = "number_reward"
    out_dir = Path(work_dir) / "grouprl_out"
    trainer = GRPOTrainer(model=model_dir, config=grouprl_config(w, str(out_dir)),
                          train_dataset=make_dataset_rows(w.num_prompts, w.seed), reward_funcs=reward)
    counts: list[int] = []
    cpu: list[float] = [time.process_time()]
    _force_length(trainer.model, w.max_new_tokens)
    _count_tokens(counts)
    _cpu_per_step(cpu)
    dtypes = dtype_probe(trainer.model)  # the reference is a deep copy made in train(): it shares the hook
    trainer.train()
    records = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    records = [r for r in records if "time/step" in r]
    clock = StepClock()
    clock.rewards = rewards
    gen_steps = [i for i, r in enumerate(records) if (r.get("time/generate") or 0) > 0]
    tokens = dict(zip(gen_steps, counts))
    for i, r in enumerate(records):
        row = {k: float(r.get(key) or 0.0) for k, key in TIMERS.items()}
        row["step_time"] = float(r["time/step"])
        row["other"] = row["step_time"] - sum(row[k] for k in TIMERS)
        row["completion_tokens"] = float(tokens.get(i, 0))
        row["cpu_time"] = cpu[i + 1] - cpu[i] if i + 1 < len(cpu) else float("nan")
        clock.steps.append(row)
        loss = r.get("loss/total")
        clock.losses.append(float("nan") if loss is None else float(loss))
    out = clock.summary(w.warmup_steps, w.optimizer_steps_per_generation)
    out["steps_rows"] = clock.steps
    out["generate_calls"] = len(counts)
    out["dtypes"] = dict(dtypes)
    out["mismatch"] = _mismatch(records)
    return out
