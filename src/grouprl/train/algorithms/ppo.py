"""PPO with a critic (Schulman et al. 2017, arXiv:1707.06347) on the GRPO loop's sampler, rewards and logs.

    for each generation round:
        completions = G samples per prompt (G = 1 is fine)    (algorithms.rounds.sample_and_score)
        rewards     = reward functions                         [B, G] -> one number per completion
        V           = critic(completions)                      [N, T]   (train.critic; value at rollout)
        r_t         = -kl_coef * KL_t (kl_mode=reward) + the sequence reward at its last token
                      (InstructGPT, arXiv:2203.02155, Eq. 2)
        A, R        = GAE(r, V; gamma, lam)                    [N, T]   (arXiv:1506.02438, Eq. 16), A whitened
        for each of mu passes, for each optimizer step of the round:
            policy: aggregate(policy_loss(logp, old_logp, A [N, T], mask)) (+ kl_coef * KL, kl_mode=loss)
                    -- the same registered loss and optimizer step as GRPO (train.engine.step.optimizer_step)
            critic: vf_coef * token-mean of the clipped value loss (algo.losses.ppo_value_loss), its own
                    AdamW, clip and schedule
        log, evaluate, checkpoint (the critic, its optimizer and schedule inside trainer_state.pt)

What differs from GRPO is only where the advantage comes from: a learned value per token instead of the
group's mean, so one completion per prompt is enough. Everything else -- micro-batches, reference and old
log-probs, the policy loss and its aggregation, skipping non-finite steps, metrics, evaluation, exact resume
-- is the GRPO loop's own code (``train.algorithms.rounds``, ``train.engine.step``, ``train.algorithms.grpo``).
Simplifications: the critic is a separate model (no shared backbone), updated on the same micro-batches as
the policy; no adaptive KL controller (kl_coef is fixed); no reward whitening.
"""

from __future__ import annotations

from contextlib import closing
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch

from grouprl.algo.advantages import compute_gae
from grouprl.algo.losses import ppo_value_loss
from grouprl.algo.ops import masked_mean, masked_sum
from grouprl.builtins import load_builtins
from grouprl.data.stream import PromptStream
from grouprl.registry import AGGREGATIONS, KL_ESTIMATORS, POLICY_LOSSES
from grouprl.rollout import make_backend
from grouprl.rollout.vllm_backend import options_from as vllm_options
from grouprl.run import reporting
from grouprl.run.resume_config import config_record
from grouprl.run.reward_signal import RewardWatch
from grouprl.run.signals import GracefulStop
from grouprl.train import checkpoint as ckpt
from grouprl.train.agent import build_agent
from grouprl.train.algorithms.base import Algorithm, register_algorithm
from grouprl.train.algorithms.critic import build_critic, critic_values
from grouprl.train.algorithms.grpo import Progress, plan_steps
from grouprl.train.algorithms.grpo import _progress as progress
from grouprl.train.algorithms.rounds import (
    Round,
    RoundBatch,
    RunContext,
    micro_batches,
    sample_and_score,
    sampling_params,
)
from grouprl.train.algorithms.shared import evaluate_and_log, open_logger, resume_path, should_save, summary
from grouprl.train.checkpoint.unpickle import moved_from
from grouprl.train.engine.model import (
    Reference,
    autocast_factory,
    build_optimizer,
    enable_checkpointing,
    upcast_trainable,
)
from grouprl.train.engine.step import (
    LossSpec,
    MicroBatch,
    SkipGuard,
    batched_logps,
    mismatch_correction,
    optimizer_step,
)
from grouprl.train.metrics import Timers, report_step, round_metrics, round_samples

__all__ = ["Critic", "PPORound", "ValueTargets", "critic_step", "ppo_round", "token_rewards", "train_ppo",
           "whiten_round"]


@dataclass
class ValueTargets:
    """The critic's regression targets for one micro-batch (fixed for the round)."""

    old_values: torch.Tensor  # [n,T] V at rollout (the centre of the value clip)
    returns: torch.Tensor  # [n,T] R = A + V, before whitening


@dataclass
class PPORound(Round):
    """A GRPO ``Round`` whose micro-batches carry token advantages ``[n, T]``, plus the value targets."""

    targets: list[ValueTargets] = field(default_factory=list)


@dataclass
class Critic:
    """The value model and its own optimizer and schedule."""

    model: Any
    optimizer: Any
    scheduler: Any

    def state_dict(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])


class _CriticHP:
    """The policy's optimizer settings with the critic's learning rate (for ``build_optimizer``)."""

    def __init__(self, cfg: Any) -> None:
        self._cfg = cfg
        self.learning_rate = cfg.critic_learning_rate or cfg.learning_rate

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cfg, name)


# ---- rewards, advantages, targets -------------------------------------------------------------------
def token_rewards(rewards: torch.Tensor, mask: torch.Tensor, kl: torch.Tensor | None = None,
                  kl_coef: float = 0.0) -> torch.Tensor:
    """r_t = -kl_coef * KL_t on every real token, plus the sequence reward on the last real token.

    InstructGPT (arXiv:2203.02155, Eq. 2) spread over tokens. A NaN reward (no opinion) adds 0; a row
    without real tokens gets no reward. Shapes: ``rewards [n]``, ``mask [n,T]``, ``kl [n,T]`` -> ``[n,T]``.
    """
    m = mask.to(torch.float32)
    r = torch.zeros_like(m)
    if kl is not None and kl_coef > 0:
        r = r - kl_coef * torch.where(m > 0, kl.float(), torch.zeros_like(r))
    T = m.shape[1]
    last = (m * torch.arange(1, T + 1, device=m.device)).argmax(dim=1)  # last real position
    has = m.sum(dim=1) > 0
    seq = torch.nan_to_num(rewards.to(r).reshape(-1), nan=0.0) * has
    r[torch.arange(len(r), device=r.device), last] += seq
    return r


def whiten_round(advs: list[torch.Tensor], masks: list[torch.Tensor], eps: float = 1e-8) -> list[torch.Tensor]:
    """(A - mean) / sqrt(var + eps) over every real token of the round (micro-batches of different T)."""
    flat = torch.cat([a[m > 0] for a, m in zip(advs, masks)])
    if flat.numel() < 2:
        return advs
    mean, var = flat.mean(), flat.var(unbiased=True)
    return [(a - mean) * torch.rsqrt(var + eps) * (m > 0) for a, m in zip(advs, masks)]


@torch.no_grad()
def _values(critic: Any, mb: MicroBatch, autocast: Any) -> torch.Tensor:
    was = critic.training
    critic.eval()
    try:
        with autocast():
            return critic_values(critic, mb.prompt_ids, mb.prompt_mask, mb.completion_ids, mb.completion_mask)
    finally:
        critic.train(was)


def ppo_round(ctx: RunContext, stream: PromptStream, timers: Timers, critic: Critic) -> PPORound:
    """Sample, score, values, token rewards, GAE (whitened): the micro-batches of one PPO round."""
    cfg = ctx.cfg
    scored = sample_and_score(ctx, stream.next(), timers)
    N = len(scored.rollout)
    mbs = micro_batches(ctx, RoundBatch(scored.rollout, torch.zeros(N), scored.rewards, scored.components), timers)
    seq_rewards = torch.split(scored.rewards.reshape(-1), [mb.prompt_ids.shape[0] for mb in mbs])
    kl_fn = KL_ESTIMATORS.get(cfg.kl_estimator)
    in_reward = cfg.kl_mode == "reward" and ctx.reference is not None
    advs, targets, kls = [], [], []
    for mb, rew in zip(mbs, seq_rewards):
        with timers("value_forward"):
            values = _values(critic.model, mb, ctx.autocast)
        kl = None
        if in_reward:  # KL of the policy that sampled (old log-probs) to the reference, per token
            with timers("old_logp_forward"):
                lp = mb.old_logp if mb.old_logp is not None else batched_logps(
                    ctx.model, [mb], cfg.temperature, ctx.autocast, chunk_size=cfg.logits_chunk_size,
                    padding_free=cfg.padding_free)[0]
            kl = kl_fn(lp, mb.ref_logp).detach()
            kls.append(kl[mb.loss_mask > 0])
        r = token_rewards(rew.to(values.device), mb.loss_mask, kl, cfg.kl_coef)
        adv, ret = compute_gae(r, values, mb.loss_mask, gamma=cfg.gamma, lam=cfg.lam)
        advs.append(adv)
        targets.append(ValueTargets(values, ret))
    if cfg.whiten_advantages:
        advs = whiten_round(advs, [mb.loss_mask for mb in mbs])
    for mb, adv in zip(mbs, advs):
        mb.adv = adv
    seq_adv = torch.cat([masked_mean(mb.adv, mb.loss_mask, dim=-1) for mb in mbs]).cpu()
    metrics = round_metrics(ctx.scorer.names, scored.rewards, scored.components, scored.rollout, seq_adv,
                            torch.zeros(scored.rewards.shape[0], dtype=torch.bool))
    metrics.pop("frac_reward_zero_std")  # a group statistic: PPO's baseline is the critic
    metrics.update(_value_metrics(mbs, targets, kls))
    samples = round_samples(ctx.scorer.names, scored.rollout, scored.rewards, scored.components, seq_adv,
                            cfg.num_completions_to_log)
    return PPORound(mbs, metrics, samples, targets)


def _value_metrics(mbs: list[MicroBatch], targets: list[ValueTargets], kls: list[torch.Tensor]) -> dict[str, float]:
    """Mean value and return, explained variance 1 - Var(R - V) / Var(R), token advantage spread, KL reward."""
    v = torch.cat([t.old_values[mb.loss_mask > 0] for mb, t in zip(mbs, targets)])
    ret = torch.cat([t.returns[mb.loss_mask > 0] for mb, t in zip(mbs, targets)])
    adv = torch.cat([mb.adv[mb.loss_mask > 0] for mb in mbs])
    out = {"value/mean": float(v.mean()) if v.numel() else float("nan"),
           "value/returns_mean": float(ret.mean()) if ret.numel() else float("nan"),
           "advantage/token_std": float(adv.std(unbiased=False)) if adv.numel() else float("nan")}
    var = float(ret.var(unbiased=False)) if ret.numel() > 1 else 0.0
    out["value/explained_variance"] = 1.0 - float((ret - v).var(unbiased=False)) / var if var > 0 else float("nan")
    if kls:
        out["kl_reward"] = float(torch.cat(kls).mean())
    return out


# ---- the critic's update ------------------------------------------------------------------------------
def critic_step(cfg: Any, critic: Critic, mbs: list[MicroBatch], targets: list[ValueTargets], autocast: Any,
                timers: Timers) -> dict[str, float]:
    """One critic optimizer step on the micro-batches of one policy step (token mean over the whole step).

    loss = vf_coef * sum_t 0.5 max((V - R)^2, (clip(V, V_old +- cliprange_value) - R)^2) / num_tokens.
    A non-finite loss or gradient norm skips the step (gradients dropped, no optimizer or schedule step).
    """
    pairs = [(mb, t) for mb, t in zip(mbs, targets) if mb.prompt_ids.shape[0] > 0]
    num_tokens = max(1, sum(int(mb.loss_mask.sum()) for mb, _ in pairs))
    value_loss, clip_frac = torch.zeros(()), torch.zeros(())
    with timers("critic_update"):
        for mb, t in pairs:
            with autocast():
                v = critic_values(critic.model, mb.prompt_ids, mb.prompt_mask, mb.completion_ids,
                                  mb.completion_mask)
            per_token, m = ppo_value_loss(v, t.old_values, t.returns, mb.loss_mask, clip_eps=cfg.cliprange_value)
            loss = masked_sum(per_token, mb.loss_mask) / num_tokens
            (cfg.vf_coef * loss).backward()
            weight = mb.loss_mask.sum().float().cpu() / num_tokens
            value_loss = value_loss + loss.detach().cpu()
            clip_frac = clip_frac + m["vf_clip_frac"].detach().cpu() * weight
        params = [p for p in critic.model.parameters() if p.requires_grad]
        grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm if cfg.max_grad_norm > 0 else float("inf"))
        lr = critic.scheduler.get_last_lr()[0]
        finite = bool(torch.isfinite(value_loss)) and bool(torch.isfinite(grad_norm))
        if finite:
            critic.optimizer.step()
            critic.scheduler.step()
        critic.optimizer.zero_grad(set_to_none=True)
    return {"loss/value": float(value_loss), "value/clip_frac": float(clip_frac), "value/grad_norm": float(grad_norm),
            "value/lr": lr, "value/skipped": float(not finite)}


# ---- the loop ---------------------------------------------------------------------------------------
def _setup(cfg: Any, model: Any, tokenizer: Any, train_rows: Any, reward_funcs: list):
    """Everything GRPO's loop builds, plus the critic; the loss spec's KL is 0 when KL is a reward."""
    from grouprl.train.score import RewardScorer

    device = next(model.parameters()).device
    upcast_trainable(model)
    autocast = autocast_factory(cfg.bf16, device)
    reference = Reference(model, cfg.ref_dtype, bf16=cfg.bf16) if cfg.kl_coef > 0 else None
    fns = cfg.resolved()
    kl_loss = fns["kl_coef"] if cfg.kl_mode == "loss" else 0.0
    spec = LossSpec(POLICY_LOSSES.get(fns["policy_loss"]), fns["loss_hparams"], AGGREGATIONS.get(fns["aggregation"]),
                    KL_ESTIMATORS.get(fns["kl_estimator"]), kl_loss, cfg.temperature, **mismatch_correction(cfg),
                    logits_chunk_size=cfg.logits_chunk_size, padding_free=cfg.padding_free)
    total_steps, steps_per_round, rounds_per_epoch = plan_steps(cfg, len(train_rows))
    optimizer, scheduler = build_optimizer(model, cfg, total_steps)
    critic_model = build_critic(model, cfg.critic_model, device)
    critic = Critic(critic_model, *build_optimizer(critic_model, _CriticHP(cfg), total_steps))
    if cfg.gradient_checkpointing:
        enable_checkpointing(model)
        enable_checkpointing(critic_model)
    model.train()
    backend = make_backend(cfg.rollout_backend, model, tokenizer, lean_sampler=cfg.lean_sampler,
                           vllm_options=vllm_options(cfg))
    sampling = sampling_params(cfg)
    scorer = RewardScorer(reward_funcs, cfg.reward_weights, cfg.missing_reward)
    ctx = RunContext(cfg, model, tokenizer, backend, scorer, None, reference, autocast, train_rows, 0, total_steps,
                     sampling)
    return ctx, spec, critic, optimizer, scheduler, (total_steps, steps_per_round, rounds_per_epoch)


def train_ppo(cfg: Any, model: Any, tokenizer: Any, train_rows: Any, eval_rows: Any, reward_funcs: list,
              eval_reward_fn: Any = None, *, resume: Any = None, agent: Any = None) -> dict[str, Any]:
    """Run PPO on ``model`` (loaded, on its device); the same summary dict as the GRPO loop plus ``critic``."""
    load_builtins()
    ctx, spec, critic, optimizer, scheduler, plan = _setup(cfg, model, tokenizer, train_rows, reward_funcs)
    ctx.agent = agent if agent is not None else build_agent(cfg)
    total_steps, steps_per_round, rounds_per_epoch = plan
    stream = PromptStream(len(train_rows), cfg.prompts_per_generation, cfg.seed)
    path, saved = _restore(cfg, resume, model, optimizer, scheduler, stream, critic)
    run = progress(saved)
    guard = SkipGuard(cfg.max_consecutive_skips, saved["skipped_steps"])
    logger = open_logger(cfg, total_steps, resumed=path is not None, step=run.step)
    ctx.step = run.step
    run_eval = partial(evaluate_and_log, cfg, model, tokenizer, eval_rows, eval_reward_fn, logger, run.evals,
                       backend=ctx.backend, agent=ctx.agent)
    watch = RewardWatch(ctx.scorer.names, cfg.max_rounds_without_reward)
    save = partial(_save, ctx, stream, optimizer, scheduler, critic, run, guard, steps_per_round)
    stop = GracefulStop().install()
    with stop, closing(logger):  # leaving: the caller's signal handlers back, logs closed
        if path is None and cfg.eval_before_train:
            run_eval("before", run.step)
        timers = Timers()
        while run.step < total_steps:
            if run.rnd is None or run.round_step >= steps_per_round:
                ctx.backend.sync_weights(model)
                ctx.step = run.step
                run.rnd, run.round_step = ppo_round(ctx, stream, timers, critic), 0
                watch.check(run.rnd.metrics)
            update, critic_time = _step(ctx, spec, critic, optimizer, scheduler, timers, run, steps_per_round)
            guard.check(update, run.step)
            metrics = {**run.rnd.metrics, **update, **critic_time, **timers.pop(), "epoch": stream.epoch}
            report_step(cfg, logger, run.step, total_steps, metrics, run.rnd.samples, run.history)
            if cfg.eval_steps and run.step % cfg.eval_steps == 0 and run.step < total_steps:
                run_eval(f"step{run.step}", run.step)
            saved_now = save() if should_save(cfg, run.step, steps_per_round * rounds_per_epoch, total_steps) else None
            if stop.requested:
                raise stop.interrupted(run.step, saved_now or save())
            timers.restart()
        stop.restore()
        run_eval("after", run.step)
    critic_dir = Path(cfg.output_dir) / "critic"
    critic.model.save_pretrained(critic_dir)
    return summary(cfg, logger, run.step, total_steps, run.history, run.evals) | {"critic": str(critic_dir)}


def _step(ctx: RunContext, spec: LossSpec, critic: Critic, optimizer: Any, scheduler: Any, timers: Timers,
          run: Progress, steps_per_round: int) -> tuple[dict[str, Any], dict[str, float]]:
    """One policy step and one critic step on the same micro-batches; ``(update, critic timings)``."""
    cfg = ctx.cfg
    steps_per_pass, ga = steps_per_round // cfg.num_iterations, cfg.gradient_accumulation_steps
    part = slice((run.round_step % steps_per_pass) * ga, (run.round_step % steps_per_pass + 1) * ga)
    update = optimizer_step(ctx, run.rnd.micro_batches[part], spec, optimizer, scheduler, timers)
    update.update(critic_step(cfg, critic, run.rnd.micro_batches[part], run.rnd.targets[part], ctx.autocast, timers))
    critic_time = {f"time/{p}": timers.totals.get(p, 0.0) for p in ("value_forward", "critic_update")}
    run.step, run.round_step = run.step + 1, run.round_step + 1
    return update, critic_time


def _restore(cfg: Any, resume: Any, model: Any, optimizer: Any, scheduler: Any, stream: PromptStream,
             critic: Critic) -> tuple[Any, dict[str, Any]]:
    """As the GRPO loop's ``restore`` (one process), plus the critic and its optimizer."""
    saved = {"step": 0, "round": None, "round_step": 0, "history": [], "evals": {}, "skipped_steps": 0}
    path = resume_path(cfg, resume)
    if path is not None:
        saved.update(ckpt.load_checkpoint(path, model, optimizer, scheduler))
        stream.load_state(saved["data"])
        critic.load_state_dict(_critic_state(saved, path))
        ckpt.truncate_logs(cfg.output_dir, path, saved.get("log_bytes"))
        ckpt.set_learning_rate(optimizer, scheduler, cfg.learning_rate)
        ckpt.set_learning_rate(critic.optimizer, critic.scheduler, _CriticHP(cfg).learning_rate)
    return path, saved


def _save(ctx: RunContext, stream: PromptStream, optimizer: Any, scheduler: Any, critic: Critic, run: Progress,
          guard: SkipGuard, steps_per_round: int) -> Any:
    cfg = ctx.cfg
    state = {"data": stream.state(), "round": run.rnd if run.round_step < steps_per_round else None,
             "round_step": run.round_step, "history": run.history, "evals": run.evals, "skipped_steps": guard.total,
             "log_bytes": ckpt.log_sizes(cfg.output_dir), "config": config_record(cfg), "critic": critic.state_dict()}
    path = ckpt.save_checkpoint(cfg.output_dir, run.step, ctx.model, ctx.tokenizer, optimizer, scheduler, state,
                                total_limit=cfg.save_total_limit)
    reporting.refresh(cfg.output_dir, cfg.review_window)
    return path


def _critic_state(saved: dict[str, Any], path: Path) -> dict[str, Any]:
    from grouprl.errors import ConfigError

    state = saved.pop("critic", None)
    if state is None:
        raise ConfigError(f"checkpoint {str(path)!r} holds no critic: it was not written by algorithm: ppo. Fix: "
                          f"resume with the algorithm that wrote it, or start a fresh PPO run.")
    return state


register_algorithm("ppo", Algorithm(train=train_ppo))

moved_from("grouprl.train.ppo", to=__name__)  # checkpoints pickled its classes under the old path(s)
