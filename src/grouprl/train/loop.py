"""The GRPO-family training loop, top to bottom (DeepSeekMath arXiv:2402.03300 Alg. 1; GSPO arXiv:2507.18071).

    for each generation round:
        prompts      = next B prompts                      (data.stream)
        completions  = G samples per prompt, one batch     (rollout, KV cache)
        rewards      = weighted sum of reward functions    [B, G]          (train.score)
        adv          = advantage_fn(rewards)               [B, G]   (registry: grpo, dr_grpo, rloo)
        ref_logp     = pi_ref(completions)                 only when kl_coef > 0
        old_logp     = pi_old(completions)                 only when the policy moves before the last use
        for each of mu passes, for each optimizer step of the round:
            for each micro-batch:  aggregate(policy_loss(logp, old_logp, adv) + beta * KL)  / step totals
            clip, AdamW step, schedule step; log; evaluate; checkpoint

Round assembly and dynamic sampling live in ``train.round``, the optimizer step in ``train.step``, metrics
in ``train.metrics``. The loop never branches on an algorithm name: the config names registered functions.
Processes: ``accelerate launch`` runs one copy per rank; ``train.dist`` (the only place ranks exist) shares
out the prompts, sums gradients and keeps logging / evaluation / checkpoint writing on rank 0.
The transformers backend generates with the training weights themselves; an engine with its own copy (vLLM)
gets ``sync_weights`` once per generation round, before it generates (and before each evaluation), not
after every optimizer step.
"""

from __future__ import annotations

import math
from contextlib import closing
from functools import partial
from typing import Any

from grouprl.builtins import load_builtins
from grouprl.config import GRPOConfig
from grouprl.data.stream import PromptStream
from grouprl.errors import DataError
from grouprl.registry import ADVANTAGES, AGGREGATIONS, KL_ESTIMATORS, POLICY_LOSSES
from grouprl.rollout import SamplingParams, make_backend
from grouprl.rollout.vllm_backend import options_from as vllm_options
from grouprl.train import checkpoint as ckpt
from grouprl.train import dist, reporting, turn_credit
from grouprl.train.agent import build_agent
from grouprl.train.evaluate import evaluate_model
from grouprl.train.metrics import MetricsLogger, Timers, report_step
from grouprl.train.model import (
    Reference,
    autocast_factory,
    build_optimizer,
    enable_checkpointing,
    save_final,
    upcast_trainable,
)
from grouprl.train.precision import resolve_rollout_dtype
from grouprl.train.resume_config import config_record
from grouprl.train.reward_signal import RewardWatch
from grouprl.train.round import (  # Round: older checkpoints pickled loop.Round
    Round,
    RunContext,
    generate_round,
)
from grouprl.train.score import RewardScorer
from grouprl.train.signals import GracefulStop
from grouprl.train.step import LossSpec, SkipGuard, mismatch_correction, optimizer_step

__all__ = ["Round", "advantage_function", "plan_steps", "save_final", "should_save", "train"]


def train(cfg: GRPOConfig, model: Any, tokenizer: Any, train_rows: Any, eval_rows: Any, reward_funcs: list,
          eval_reward_fn: Any = None, *, resume: Any = None, agent: Any = None) -> dict[str, Any]:
    """Run GRPO on ``model`` (already loaded, on its device) and return a summary dict. ``agent``
    (``grouprl.train.agent.build_agent``; ``None`` = from the config's tools / environment) makes rollouts multi-turn."""
    if cfg.algorithm == "ppo":  # a critic and GAE instead of a group baseline: its own loop, grouprl.train.ppo
        from grouprl.train.ppo import train_ppo

        dist.check_config(cfg, dist.current().world)  # one process only
        return train_ppo(cfg, model, tokenizer, train_rows, eval_rows, reward_funcs, eval_reward_fn, resume=resume,
                         agent=agent)
    load_builtins()
    ranks = join_ranks(cfg, model)  # rank / world size (accelerate launch); no-ops in one process
    agent = agent if agent is not None else build_agent(cfg)
    autocast, reference = prepare_model(cfg, model)  # fp32 master weights; pi_ref = the starting policy
    ranks.shard(model, reference)  # FSDP2 when accelerate is configured for it (train/fsdp.py); else a no-op
    spec = loss_spec(cfg)
    scorer = RewardScorer(reward_funcs, cfg.reward_weights, cfg.missing_reward)
    backend = make_backend(cfg.rollout_backend, model, tokenizer, lean_sampler=cfg.lean_sampler,
                           vllm_options=vllm_options(cfg), rollout_dtype=resolve_rollout_dtype(cfg, model))
    # the global prompt order; this rank generates for its contiguous share of each round
    stream = ranks.shard_stream(PromptStream(len(train_rows), cfg.prompts_per_generation * ranks.world, cfg.seed))
    total_steps, steps_per_round, rounds_per_epoch = plan_steps(cfg, len(train_rows), world=ranks.world)
    optimizer, scheduler = build_optimizer(model, cfg, total_steps)
    ranks.zero_init(model, optimizer, cfg)  # DeepSpeed ZeRO-2/3 when accelerate is configured for it (train/deepspeed.py)

    resume_path, saved = restore(cfg, resume, model, optimizer, scheduler, stream, ranks)
    step, rnd, round_step, history, evals = (saved[k] for k in ("step", "round", "round_step", "history", "evals"))
    guard = SkipGuard(cfg.max_consecutive_skips, saved["skipped_steps"])
    logger = MetricsLogger(cfg.output_dir, cfg.report_targets, run_name=cfg.run_name, total_steps=total_steps,
                           progress=cfg.progress_bar, config=cfg.to_dict(), resume=resume_path is not None,
                           resume_step=step) if ranks.is_main else dist.NullLogger()  # rank 0 logs
    sampling = SamplingParams(cfg.max_new_tokens, cfg.temperature, cfg.top_p, cfg.top_k, cfg.max_prompt_length)
    ctx = RunContext(cfg, model, tokenizer, backend, scorer, advantage_function(cfg), reference, autocast,
                     train_rows, step, total_steps, sampling, agent)
    run_eval = ranks.with_full_weights(  # FSDP: every rank unshards, rank 0 evaluates
        model, partial(_evaluate, ctx, eval_rows if ranks.is_main else None, eval_reward_fn, logger, evals))
    watch = RewardWatch(scorer.names, cfg.max_rounds_without_reward)

    def save(step: int) -> Any:
        state = {"data": stream.state(), "round": rnd if round_step < steps_per_round else None,
                 "round_step": round_step, "history": history, "evals": evals, "skipped_steps": guard.total,
                 "log_bytes": ckpt.log_sizes(cfg.output_dir), "config": config_record(cfg)}
        per_rank = ranks.rank_states({"rng": ckpt.rng_state(), "round": state["round"]})
        sharded = ranks.save_shards(cfg.output_dir, step, model, optimizer)  # FSDP: every rank writes its shards
        if not ranks.is_main:  # rank 0 writes the (replicated) weights and optimizer, and every rank's state
            return None
        if per_rank is not None:
            state.update(round=None, ranks=per_rank)
        path = ckpt.save_checkpoint(cfg.output_dir, step, model, tokenizer, optimizer, scheduler, state,
                                    total_limit=cfg.save_total_limit, sharded=sharded)
        reporting.refresh(cfg.output_dir, cfg.review_window)  # the run report covers what the checkpoint does
        return path

    stop = GracefulStop().install()  # Ctrl-C / SIGTERM: finish this optimizer step, save, stop
    # leaving: every rank stops with an error at its next collective (train/dist.py), handlers back, logs closed
    with stop, closing(logger), ranks.failures():
        if resume_path is None and cfg.eval_before_train:
            run_eval("before", step)
        timers = Timers()
        steps_per_pass, ga = steps_per_round // cfg.num_iterations, cfg.gradient_accumulation_steps
        while step < total_steps:
            if rnd is None or round_step >= steps_per_round:  # a new generation round
                backend.sync_weights(model)  # engines with their own weight copy (vLLM): sample the current policy
                ctx.step = step
                with ranks.full_weights(model):  # FSDP: the whole policy on every rank while it generates
                    rnd, round_step = generate_round(ctx, stream, timers), 0
                rnd.metrics = ranks.mean_metrics(rnd.metrics)  # the round's metrics over every rank
                watch.check(rnd.metrics)  # no sample rewarded for max_rounds_without_reward rounds: stop
            k = round_step % steps_per_pass  # the k-th optimizer step of this pass over the round
            update = optimizer_step(ctx, rnd.micro_batches[k * ga:(k + 1) * ga], spec, optimizer, scheduler, timers)
            step, round_step = step + 1, round_step + 1
            guard.check(update, step)  # a non-finite step was skipped: count it; too many in a row: stop
            metrics = {**rnd.metrics, **update, **timers.pop(), "epoch": stream.epoch}
            report_step(cfg, logger, step, total_steps, metrics, rnd.samples, history)
            if cfg.eval_steps and step % cfg.eval_steps == 0 and step < total_steps:
                run_eval(f"step{step}", step)
            saved_now = save(step) if should_save(cfg, step, steps_per_round * rounds_per_epoch, total_steps) else None
            if ranks.any_true(stop.requested):
                raise stop.interrupted(step, saved_now or save(step))
            timers.restart()  # evaluation and checkpoint writing are not part of the next step's time
        stop.restore()  # the caller's handlers again (also on leaving the `with`, if the loop raised)
        run_eval("after", step)
        ranks.check()  # the other ranks wait for rank 0's evaluation (bounded by the collective timeout)
    return {"global_step": step, "total_steps": total_steps, "history": history, "evals": evals,
            "metrics_path": str(logger.metrics_path), "samples_path": str(logger.samples_path),
            "tensorboard_dir": str(logger.tb_dir) if logger.tb_dir else None,
            "last_checkpoint": str(ckpt.latest_checkpoint(cfg.output_dir) or "")}


def join_ranks(cfg: GRPOConfig, model: Any) -> Any:
    """This process's place among the ranks (``train/dist.py``): config checked for the world size, the
    global batch announced by rank 0, rank 0's weights everywhere, a different sampling seed per rank."""
    ranks = dist.current()
    dist.check_config(cfg, ranks.world)
    ranks.announce(cfg)
    ranks.broadcast_parameters(model)
    ranks.seed_rank(cfg.seed)
    return ranks


def prepare_model(cfg: GRPOConfig, model: Any) -> tuple[Any, Reference | None]:
    """``(autocast, reference)``: fp32 master weights (a bf16 weight loses an lr=1e-6 update to rounding),
    the autocast context, the frozen reference (only when kl_coef > 0: pi_ref = the policy before any update
    or resume), activation checkpointing, train mode."""
    upcast_trainable(model)
    autocast = autocast_factory(cfg.bf16, next(model.parameters()).device)
    reference = Reference(model, cfg.ref_dtype, bf16=cfg.bf16) if cfg.kl_coef > 0 else None
    if cfg.gradient_checkpointing:
        enable_checkpointing(model)
    model.train()
    return autocast, reference


def loss_spec(cfg: GRPOConfig) -> LossSpec:
    """The exact functions and hyper-parameters the config names (``cfg.resolved()``: no silent overrides)."""
    fns = cfg.resolved()
    return LossSpec(POLICY_LOSSES.get(fns["policy_loss"]), fns["loss_hparams"], AGGREGATIONS.get(fns["aggregation"]),
                    KL_ESTIMATORS.get(fns["kl_estimator"]), fns["kl_coef"], cfg.temperature, **mismatch_correction(cfg),
                    logits_chunk_size=cfg.logits_chunk_size, padding_free=cfg.padding_free)


def restore(cfg: GRPOConfig, resume: Any, model: Any, optimizer: Any, scheduler: Any, stream: PromptStream,
            ranks: Any) -> tuple[Any, dict[str, Any]]:
    """``(checkpoint path or None, saved state)``: weights, optimizer, schedule, RNG, data position and the
    unfinished round of the checkpoint to resume from; the logs cut back to what it covers."""
    saved = {"step": 0, "round": None, "round_step": 0, "history": [], "evals": {}, "skipped_steps": 0}
    resume_path = ckpt.resolve_resume(resume if resume is not None else cfg.resume_from_checkpoint, cfg.output_dir)
    if resume_path is not None:
        saved.update(ckpt.load_checkpoint(resume_path, model, optimizer, scheduler))
        ranks.restore_rank_state(saved, cfg.seed)  # this rank's RNG and unfinished round (same world size)
        stream.load_state(saved["data"])
        if ranks.is_main:
            ckpt.truncate_logs(cfg.output_dir, resume_path, saved.get("log_bytes"))  # what the checkpoint covers
        ckpt.set_learning_rate(optimizer, scheduler, cfg.learning_rate)  # a changed lr (resume_config.SAFE)
    return resume_path, saved


def plan_steps(cfg: GRPOConfig, num_rows: int, *, world: int = 1) -> tuple[int, int, int]:
    """(total optimizer steps, steps per generation round, rounds per epoch) on ``world`` processes."""
    P = cfg.prompts_per_generation * world
    if num_rows < P:
        on = f" x {world} processes" if world > 1 else ""
        raise DataError(
            f"the training set has {num_rows} rows but one generation round needs {P} prompts "
            f"(= per_device_train_batch_size {cfg.per_device_train_batch_size} x steps_per_generation "
            f"{cfg.effective_steps_per_generation}{on} / num_generations {cfg.num_generations}). "
            f"Fix: add rows or lower per_device_train_batch_size x steps_per_generation{' or the process count' if on else ''}."
        )
    per_round = cfg.num_iterations * cfg.effective_steps_per_generation // cfg.gradient_accumulation_steps
    rounds_per_epoch = num_rows // P
    if cfg.max_steps > 0:
        return cfg.max_steps, per_round, rounds_per_epoch
    return max(1, math.ceil(cfg.num_train_epochs * rounds_per_epoch)) * per_round, per_round, rounds_per_epoch


def advantage_function(cfg: GRPOConfig):
    """The registered estimator with exactly the hyper-parameters ``cfg.resolved()`` gives it."""
    fns = cfg.resolved()
    fn = partial(ADVANTAGES.get(fns["advantage"]), **fns["advantage_hparams"])
    turn_credit.check_config(cfg, fn)  # a turn-level estimator needs multi-turn rollouts
    return fn


def should_save(cfg: GRPOConfig, step: int, steps_per_epoch: int, total_steps: int) -> bool:
    """Every save_steps (or epoch), and at the last step so that a longer run can --resume from it."""
    if cfg.save_strategy == "no":
        return False
    if step == total_steps:
        return True
    return step % (cfg.save_steps if cfg.save_strategy == "steps" else steps_per_epoch) == 0


def _evaluate(ctx: RunContext, eval_rows: Any, eval_reward_fn: Any, logger: MetricsLogger, evals: dict,
              tag: str, step: int) -> None:
    """Held-out evaluation (``evaluate_model``: the same function as ``grouprl eval``), logged as eval/*."""
    if eval_rows is None or len(eval_rows) == 0 or eval_reward_fn is None:
        return
    rows = [eval_rows[i] for i in range(len(eval_rows))]
    ctx.backend.sync_weights(ctx.model)  # an engine with its own weight copy evaluates the current policy
    result = evaluate_model(ctx.cfg, ctx.model, ctx.tokenizer, rows, eval_reward_fn, backend=ctx.backend,
                            agent=ctx.agent)
    samples = result.pop("samples")
    evals[tag] = {k: v for k, v in result.items()} | {"step": step}
    logger.log(step, {f"eval/{k}": v for k, v in result.items()} | {"eval/tag": tag})
    logger.log_samples(step, [{"eval": tag, **s} for s in samples])
    reporting.refresh(ctx.cfg.output_dir, ctx.cfg.review_window)
