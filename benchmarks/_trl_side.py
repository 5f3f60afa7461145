"""The TRL side of the benchmark: one ``trl.GRPOTrainer`` run of a :class:`Workload`, instrumented.

Runs only inside a benchmark child process (TRL is a ``bench`` extra, never a grouprl dependency).
The per-step breakdown wraps TRL's own methods on the trainer instance:

- ``generate``: ``_generate_single_turn`` (left-padding + ``model.generate`` + EOS masking);
- ``reward``: ``_calculate_rewards``;
- ``ref_logp`` / ``old_logp``: ``_get_per_token_logps_and_entropies`` under ``no_grad`` with the reference
  / policy model;
- ``policy_fwd_bwd``: ``compute_loss`` (policy forward with grad, log-prob gather and the loss math;
  reported alone as ``policy_fwd``) plus ``accelerator.backward`` (``policy_bwd``);
- ``optimizer``: ``optimizer.step()`` (between the ``on_pre_optimizer_step`` / ``on_optimizer_step``
  callbacks);
- ``other``: the rest of the wall time of the optimizer step (data loading, advantage and loss math,
  tokenisation, grad clipping, logging, Trainer bookkeeping).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from _common import StepClock, Workload, dtype_probe, make_dataset_rows, number_reward


def trl_config_kwargs(w: Workload, output_dir: str) -> dict[str, Any]:
    """``trl.GRPOConfig`` keyword arguments equivalent to ``w`` (TRL 1.16 field names).

    TRL counts ``per_device_train_batch_size`` in completions, and ``steps_per_generation`` in
    micro-batches; ``loss_type="dapo"`` is token-mean over the whole optimizer step.
    ``w.trl_opts`` (``vs_trl.py --trl-opt key=value``) is applied last, over these fields.
    """
    fields = dict(
        output_dir=output_dir,
        use_cpu=True,  # needed for bf16 without a GPU; accelerate then autocasts model.forward on the CPU
        bf16=w.precision == "bf16",
        fp16=False,
        gradient_checkpointing=False,
        report_to="none",
        logging_steps=1,
        save_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
        seed=w.seed,
        max_steps=w.steps,
        learning_rate=w.learning_rate,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=w.max_grad_norm,
        num_generations=w.num_generations,
        per_device_train_batch_size=w.micro_batch,
        gradient_accumulation_steps=w.grad_accum,
        steps_per_generation=w.steps_per_generation,
        num_iterations=1,
        max_completion_length=w.max_new_tokens,
        generation_kwargs={"min_new_tokens": w.max_new_tokens},
        temperature=w.temperature,
        top_p=1.0,
        top_k=0,
        beta=w.beta,
        epsilon=w.eps_low,
        epsilon_high=w.eps_high,
        importance_sampling_level=w.level,
        loss_type="dapo",
        scale_rewards="group",
        log_completions=False,
        disable_dropout=True,
    )
    return {**fields, **w.trl_opts}


def _instrument(trainer: Any, clock: StepClock) -> None:
    """Wrap TRL's methods on this trainer instance so each call's time lands in ``clock``."""
    import torch

    gen = trainer._generate_single_turn

    def generate(*args, **kwargs):
        t = time.perf_counter()
        completion_ids, logprobs = gen(*args, **kwargs)
        clock.add("generate", time.perf_counter() - t)
        clock.tokens += sum(len(ids) for ids in completion_ids)
        return completion_ids, logprobs

    trainer._generate_single_turn = generate
    trainer._calculate_rewards = clock.timed("reward", trainer._calculate_rewards)

    logps = trainer._get_per_token_logps_and_entropies

    def per_token_logps(model, *args, **kwargs):
        if torch.is_grad_enabled():  # the policy forward inside compute_loss, timed there
            return logps(model, *args, **kwargs)
        name = "ref_logp" if model is trainer.ref_model else "old_logp"
        return clock.timed(name, logps)(model, *args, **kwargs)

    trainer._get_per_token_logps_and_entropies = per_token_logps
    trainer.compute_loss = clock.timed("policy_fwd", trainer.compute_loss)
    trainer.accelerator.backward = clock.timed("policy_bwd", trainer.accelerator.backward)


def run_trl(w: Workload, model_dir: str, work_dir: str) -> dict[str, Any]:
    """Train ``w.steps`` optimizer steps with TRL; return the step summary."""
    import torch

    torch.set_num_threads(w.threads)
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    clock = StepClock()

    def reward(completions, answer, **kwargs):
        values = number_reward(completions, answer)
        clock.rewards.extend(values)
        return values

    reward.__name__ = "number_reward"

    class Timing(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            clock.start()

        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            self.t = time.perf_counter()

        def on_optimizer_step(self, args, state, control, **kwargs):
            clock.add("optimizer", time.perf_counter() - self.t)

        def on_step_end(self, args, state, control, **kwargs):
            clock.end_step()

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                clock.losses.append(float(logs["loss"]))

    dataset = Dataset.from_list(make_dataset_rows(w.num_prompts, w.seed))
    config = GRPOConfig(**trl_config_kwargs(w, str(Path(work_dir) / "trl_out")))
    trainer = GRPOTrainer(
        model=model_dir,
        reward_funcs=reward,
        args=config,
        train_dataset=dataset,
        callbacks=[Timing()],
    )
    _instrument(trainer, clock)
    dtypes = dtype_probe(*[m for m in (trainer.model, trainer.ref_model) if m is not None])
    trainer.train()
    out = clock.summary(w.warmup_steps, w.optimizer_steps_per_generation)
    out["steps_rows"] = clock.steps
    out["dtypes"] = dict(dtypes)
    out["autocast_cpu"] = bool(getattr(trainer.accelerator, "native_amp", False))  # accelerate's bf16 autocast
    return out
