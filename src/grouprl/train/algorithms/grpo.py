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

Round assembly and dynamic sampling live in ``train.algorithms.rounds``, the optimizer step in ``train.engine.step``, metrics
in ``train.metrics``. The loop never branches on an algorithm name: the config names registered functions.
Processes: ``accelerate launch`` runs one copy per rank; ``train.parallel.ranks`` (the only place ranks exist) shares
out the prompts, sums gradients and keeps logging / evaluation / checkpoint writing on rank 0.
The transformers backend generates with the training weights themselves; an engine with its own copy (vLLM)
gets ``sync_weights`` once per generation round, before it generates (and before each evaluation), not
after every optimizer step. With ``max_staleness`` >= 1 a rollout worker process (``train.pipeline``) runs the
generate-and-score half of each round (``rounds.sample_round``) while this loop trains, and this loop runs the
other half (``rounds.finish_round``) and pushes its weights every ``weight_sync_steps``.
"""

from __future__ import annotations

import math
from contextlib import ExitStack, closing
from dataclasses import dataclass
from functools import partial
from typing import Any

from grouprl.builtins import load_builtins
from grouprl.config import GRPOConfig
from grouprl.data.stream import PromptStream
from grouprl.errors import DataError
from grouprl.registry import ADVANTAGES, AGGREGATIONS, KL_ESTIMATORS, POLICY_LOSSES
from grouprl.rollout import make_backend
from grouprl.rollout.vllm_backend import options_from as vllm_options
from grouprl.run import reporting
from grouprl.run.resume_config import config_record
from grouprl.run.reward_signal import RewardWatch
from grouprl.run.signals import GracefulStop
from grouprl.train import checkpoint as ckpt
from grouprl.train import turn_credit
from grouprl.train.agent import build_agent
from grouprl.train.algorithms.base import Algorithm, register_algorithm
from grouprl.train.algorithms.rounds import Round, RunContext, generate_round, sampling_params
from grouprl.train.algorithms.shared import evaluate_and_log, open_logger, should_save, summary
from grouprl.train.algorithms.shared import resume_path as resolve
from grouprl.train.engine.model import (
    Reference,
    autocast_factory,
    build_optimizer,
    enable_checkpointing,
    save_final,
    upcast_trainable,
)
from grouprl.train.engine.precision import resolve_rollout_dtype
from grouprl.train.engine.step import LossSpec, SkipGuard, mismatch_correction, optimizer_step
from grouprl.train.metrics import Timers, report_step
from grouprl.train.parallel import ranks as dist
from grouprl.train.pipeline import eval_backend, open_pipeline
from grouprl.train.score import RewardScorer

__all__ = ["Round", "advantage_function", "plan_steps", "save_final", "should_save", "train"]


@dataclass
class Progress:
    """Where the loop stands: the optimizer step, the generation round in use and how far into it, the
    reward history and the evaluations (what a checkpoint saves; ``restore`` reads it back)."""

    step: int
    rnd: Round | None
    round_step: int
    history: list
    evals: dict


def train(cfg: GRPOConfig, model: Any, tokenizer: Any, train_rows: Any, eval_rows: Any, reward_funcs: list,
          eval_reward_fn: Any = None, *, resume: Any = None, agent: Any = None) -> dict[str, Any]:
    """Run GRPO on ``model`` (already loaded, on its device) and return a summary dict. ``agent``
    (``grouprl.train.agent.build_agent``; ``None`` = from the config's tools / environment) makes rollouts multi-turn."""
    load_builtins()
    ranks = join_ranks(cfg, model)  # rank / world size (accelerate launch); no-ops in one process
    ctx, spec, stream, plan, optimizer, scheduler = setup(cfg, model, tokenizer, train_rows, reward_funcs, ranks,
                                                          agent if agent is not None else build_agent(cfg))
    total_steps, steps_per_round, rounds_per_epoch = plan
    path, saved = restore(cfg, resume, model, optimizer, scheduler, stream, ranks)
    run = _progress(saved)
    guard = SkipGuard(cfg.max_consecutive_skips, saved["skipped_steps"])
    logger = open_logger(cfg, total_steps, resumed=path is not None, step=run.step, is_main=ranks.is_main)
    ctx.step = run.step
    run_eval = ranks.sharding.with_full_weights(  # FSDP: every rank unshards, rank 0 evaluates
        model, partial(evaluate_and_log, cfg, model, tokenizer, eval_rows if ranks.is_main else None,
                       eval_reward_fn, logger, run.evals, backend=eval_backend(ctx), agent=ctx.agent))
    watch = RewardWatch(ctx.scorer.names, cfg.max_rounds_without_reward)
    save = partial(save_state, ctx, ranks, stream, optimizer, scheduler, run, guard, steps_per_round)
    stop = GracefulStop().install()  # Ctrl-C / SIGTERM: finish this optimizer step, save, stop
    # leaving: every rank stops with an error at its next collective (train/parallel/ranks.py), handlers back, logs closed
    with stop, closing(logger), ranks.failures(), ExitStack() as stack:
        # max_staleness >= 1: a rollout worker samples the next rounds while this process trains (train/pipeline)
        pipe = stack.enter_context(closing(open_pipeline(ctx, ranks, stream, run.step, steps_per_round, total_steps))
                                   ) if cfg.max_staleness else None
        if path is None and cfg.eval_before_train:
            run_eval("before", run.step)
        timers = Timers()
        while run.step < total_steps:
            if run.rnd is None or run.round_step >= steps_per_round:  # a new generation round
                if pipe is None:
                    new_round(ctx, ranks, stream, timers, watch, run)
                else:
                    pipe.new_round(ranks, stream, timers, watch, run)
            update = take_step(ctx, spec, optimizer, scheduler, timers, run, steps_per_round)
            if pipe is not None:
                pipe.after_step(run.step)  # every weight_sync_steps: the new weights to the worker
            guard.check(update, run.step)  # a non-finite step was skipped: count it; too many in a row: stop
            metrics = {**run.rnd.metrics, **update, **timers.pop(), "epoch": stream.epoch}
            report_step(cfg, logger, run.step, total_steps, metrics, run.rnd.samples, run.history)
            if cfg.eval_steps and run.step % cfg.eval_steps == 0 and run.step < total_steps:
                run_eval(f"step{run.step}", run.step)
            saved_now = save() if should_save(cfg, run.step, steps_per_round * rounds_per_epoch, total_steps) else None
            if ranks.any_true(stop.requested):
                raise stop.interrupted(run.step, saved_now or save())
            timers.restart()  # evaluation and checkpoint writing are not part of the next step's time
        stop.restore()  # the caller's handlers again (also on leaving the `with`, if the loop raised)
        run_eval("after", run.step)
        ranks.check()  # the other ranks wait for rank 0's evaluation (bounded by the collective timeout)
    return summary(cfg, logger, run.step, total_steps, run.history, run.evals)


def _progress(saved: dict[str, Any]) -> Progress:
    return Progress(saved["step"], saved["round"], saved["round_step"], saved["history"], saved["evals"])


def setup(cfg: GRPOConfig, model: Any, tokenizer: Any, train_rows: Any, reward_funcs: list, ranks: Any,
          agent: Any) -> tuple[RunContext, LossSpec, Any, tuple[int, int, int], Any, Any]:
    """The run's pieces, in this order (the RNG draws of a seed depend on it): model prepared and sharded,
    the loss functions, the scorer, the rollout backend, this rank's prompt stream, the step plan, the
    optimizer (wrapped by DeepSpeed ZeRO when accelerate is configured for it)."""
    autocast, reference = prepare_model(cfg, model)  # fp32 master weights; pi_ref = the starting policy
    ranks.shard(model, reference)  # FSDP2 when accelerate is configured for it (train/parallel/fsdp.py); else a no-op
    spec = loss_spec(cfg)
    scorer = RewardScorer(reward_funcs, cfg.reward_weights, cfg.missing_reward)
    backend = make_backend(cfg.rollout_backend, model, tokenizer, lean_sampler=cfg.lean_sampler,
                           vllm_options=vllm_options(cfg), rollout_dtype=resolve_rollout_dtype(cfg, model))
    # the global prompt order; this rank generates for its contiguous share of each round
    stream = ranks.shard_stream(PromptStream(len(train_rows), cfg.prompts_per_generation * ranks.world, cfg.seed))
    plan = plan_steps(cfg, len(train_rows), world=ranks.world)
    optimizer, scheduler = build_optimizer(model, cfg, plan[0])
    ranks.zero_init(model, optimizer, cfg)  # DeepSpeed ZeRO-2/3 when accelerate is configured for it
    ctx = RunContext(cfg, model, tokenizer, backend, scorer, advantage_function(cfg), reference, autocast,
                     train_rows, 0, plan[0], sampling_params(cfg), agent)
    return ctx, spec, stream, plan, optimizer, scheduler


def new_round(ctx: RunContext, ranks: Any, stream: Any, timers: Timers, watch: RewardWatch, run: Progress) -> None:
    """Generate, score and assemble the next round (every rank its share), with the current policy."""
    ctx.backend.sync_weights(ctx.model)  # engines with their own weight copy (vLLM): sample the current policy
    ctx.step = run.step
    with ranks.sharding.full_weights(ctx.model):  # FSDP: the whole policy on every rank while it generates
        run.rnd, run.round_step = generate_round(ctx, stream, timers), 0
    run.rnd.metrics = ranks.mean_metrics(run.rnd.metrics)  # the round's metrics over every rank
    watch.check(run.rnd.metrics)  # no sample rewarded for max_rounds_without_reward rounds: stop


def take_step(ctx: RunContext, spec: LossSpec, optimizer: Any, scheduler: Any, timers: Timers, run: Progress,
              steps_per_round: int) -> dict[str, Any]:
    """The k-th optimizer step of this pass over the round: its micro-batches, accumulated, clipped, stepped."""
    steps_per_pass, ga = steps_per_round // ctx.cfg.num_iterations, ctx.cfg.gradient_accumulation_steps
    k = run.round_step % steps_per_pass
    update = optimizer_step(ctx, run.rnd.micro_batches[k * ga:(k + 1) * ga], spec, optimizer, scheduler, timers)
    run.step, run.round_step = run.step + 1, run.round_step + 1
    return update


def save_state(ctx: RunContext, ranks: Any, stream: Any, optimizer: Any, scheduler: Any, run: Progress,
               guard: SkipGuard, steps_per_round: int) -> Any:
    """Checkpoint ``run.step``: weights, optimizer, schedule, data position, the training frontier, the
    unfinished round, every rank's RNG; the run report refreshed to cover it. Returns the checkpoint's path
    (rank 0) or None."""
    cfg, model = ctx.cfg, ctx.model
    frontier = training_frontier(run, stream)
    data = stream.state() if frontier == stream.drawn else stream.position(frontier)  # rounds drawn ahead: redrawn
    state = {"data": data, "frontier": frontier, "round": run.rnd if run.round_step < steps_per_round else None,
             "round_step": run.round_step, "history": run.history, "evals": run.evals, "skipped_steps": guard.total,
             "log_bytes": ckpt.log_sizes(cfg.output_dir), "config": config_record(cfg)}
    per_rank = ranks.rank_states({"rng": ckpt.rng_state(), "round": state["round"]})
    sharded = ranks.sharding.save_shards(cfg.output_dir, run.step, model, optimizer)  # FSDP / ZeRO: every rank
    if not ranks.is_main:  # rank 0 writes the (replicated) weights and optimizer, and every rank's state
        return None
    if per_rank is not None:
        state.update(round=None, ranks=per_rank)
    path = ckpt.save_checkpoint(cfg.output_dir, run.step, model, ctx.tokenizer, optimizer, scheduler, state,
                                total_limit=cfg.save_total_limit, sharded=sharded)
    reporting.refresh(cfg.output_dir, cfg.review_window)  # the run report covers what the checkpoint does
    return path


def training_frontier(run: Progress, stream: Any) -> int:
    """The prompt ordinals training has consumed (``data/stream.py``): ``0 .. frontier - 1`` are those of every
    round taken for training -- finished, or unfinished and saved with the checkpoint -- and of the groups
    dynamic sampling filtered out of them. A round generated ahead but not yet taken is not consumed: a
    resume draws it again from the frontier (OpenRLHF #1322, NeMo-RL #3599: prompts skipped when a
    checkpoint saved the cursor past generated-but-untrained rollouts). Synchronously it is the stream's count."""
    if run.rnd is not None and run.rnd.frontier is not None:
        return run.rnd.frontier
    return stream.drawn


def join_ranks(cfg: GRPOConfig, model: Any) -> Any:
    """This process's place among the ranks (``train/parallel/ranks.py``): config checked for the world size, the
    global batch announced by rank 0, rank 0's weights everywhere, a different sampling seed per rank."""
    ranks = dist.current()  # the config was checked for this world size at start-up (GRPOTrainer)
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
    resume_path = resolve(cfg, resume)
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


register_algorithm("grpo", Algorithm(train=train))
