"""The GRPO-family training loop, top to bottom (DeepSeekMath arXiv:2402.03300 Alg. 1; GSPO arXiv:2507.18071).

    for each generation round:
        prompts      = next B prompts                      (data)
        completions  = G samples per prompt, one batch     (rollout, KV cache)
        rewards      = weighted sum of reward functions    [B, G]
        adv          = advantage_fn(rewards)               [B, G]   (registry: grpo, dr_grpo, rloo)
        ref_logp     = pi_ref(completions)                 only when kl_coef > 0
        old_logp     = pi_old(completions)                 only when the policy moves before the last use
        for each of mu passes, for each optimizer step of the round:
            for each micro-batch:  aggregate(policy_loss(logp, old_logp, adv) + beta * KL)  / step totals
            clip, AdamW step, schedule step; log; evaluate; checkpoint

The loop never branches on an algorithm name: the config names registered functions.
Simplifications: one process (no data/tensor parallelism); the transformers backend generates with the
training weights themselves, so nothing has to be synchronised after a step.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from grouprl.builtins import load_builtins
from grouprl.config import GRPOConfig
from grouprl.data.load import render_prompt, reward_columns
from grouprl.errors import DataError
from grouprl.registry import ADVANTAGES, AGGREGATIONS, KL_ESTIMATORS, POLICY_LOSSES
from grouprl.rollout import SamplingParams, make_backend
from grouprl.rollout.base import Rollout, concat_rollouts
from grouprl.train import checkpoint as ckpt
from grouprl.train.evaluate import completions_for_rewards, evaluate
from grouprl.train.metrics import MetricsLogger, Timers
from grouprl.train.model import Reference, autocast_factory, build_optimizer
from grouprl.train.score import RewardScorer
from grouprl.train.step import LossSpec, MicroBatch, batched_logps, combine, micro_batch_loss


@dataclass
class Round:
    """Everything the updates of one generation round need (saved in checkpoints taken mid-round)."""

    micro_batches: list[MicroBatch]
    metrics: dict[str, float]
    samples: list[dict] = field(default_factory=list)


class PromptStream:
    """Shuffled prompts, epoch after epoch; ``state()`` / ``load_state()`` give the exact data position."""

    def __init__(self, num_rows: int, batch: int, seed: int) -> None:
        self.num_rows, self.batch, self.seed = num_rows, batch, seed
        self.epoch, self.pos = 0, 0

    def _order(self) -> list[int]:
        gen = torch.Generator().manual_seed(self.seed + self.epoch)
        return torch.randperm(self.num_rows, generator=gen).tolist()

    def next(self) -> list[int]:
        if self.pos + self.batch > self.num_rows:
            self.epoch, self.pos = self.epoch + 1, 0
        idx = self._order()[self.pos:self.pos + self.batch]
        self.pos += self.batch
        return idx

    def state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "pos": self.pos}

    def load_state(self, state: dict[str, int]) -> None:
        self.epoch, self.pos = state["epoch"], state["pos"]


def plan_steps(cfg: GRPOConfig, num_rows: int) -> tuple[int, int, int]:
    """(total optimizer steps, steps per generation round, rounds per epoch)."""
    P = cfg.prompts_per_generation
    if num_rows < P:
        raise DataError(
            f"the training set has {num_rows} rows but one generation round needs {P} prompts "
            f"(= generation batch {cfg.generation_batch_size} / num_generations {cfg.num_generations}). "
            f"Fix: add rows or lower per_device_train_batch_size x steps_per_generation."
        )
    per_round = cfg.num_iterations * cfg.effective_steps_per_generation // cfg.gradient_accumulation_steps
    rounds_per_epoch = num_rows // P
    if cfg.max_steps > 0:
        return cfg.max_steps, per_round, rounds_per_epoch
    return max(1, math.ceil(cfg.num_train_epochs * rounds_per_epoch)) * per_round, per_round, rounds_per_epoch


def enable_checkpointing(model: Any) -> None:
    """Recompute activations in backward; non-reentrant, so frozen inputs (LoRA) need no extra hooks."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x name
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def advantage_function(cfg: GRPOConfig):
    """The registered estimator with the config's scaling, if it takes one, plus advantage_kwargs."""
    fn = ADVANTAGES.get(cfg.advantage)
    hp = dict(cfg.advantage_kwargs)
    if "scale" in inspect.signature(fn).parameters:
        hp.setdefault("scale", cfg.scale_rewards)
    return partial(fn, **hp)


def train(cfg: GRPOConfig, model: Any, tokenizer: Any, train_rows: Any, eval_rows: Any, reward_funcs: list,
          eval_reward_fn: Any = None, *, resume: Any = None) -> dict[str, Any]:
    """Run GRPO on ``model`` (already loaded, on its device) and return a summary dict."""
    load_builtins()
    device = next(model.parameters()).device
    autocast = autocast_factory(cfg.bf16, device)
    reference = Reference(model) if cfg.kl_coef > 0 else None  # before any update or resume: pi_ref = start
    spec = LossSpec(POLICY_LOSSES.get(cfg.policy_loss), cfg.loss_hparams(), AGGREGATIONS.get(cfg.loss_aggregation),
                    KL_ESTIMATORS.get(cfg.kl_estimator), cfg.kl_coef, cfg.temperature)
    advantage_fn = advantage_function(cfg)
    scorer = RewardScorer(reward_funcs, cfg.reward_weights)
    backend = make_backend(cfg.rollout_backend, model, tokenizer)
    stream = PromptStream(len(train_rows), cfg.prompts_per_generation, cfg.seed)
    total_steps, steps_per_round, rounds_per_epoch = plan_steps(cfg, len(train_rows))
    optimizer, scheduler = build_optimizer(model, cfg, total_steps)
    if cfg.gradient_checkpointing:
        enable_checkpointing(model)
    model.train()

    step, rnd, round_step, history, evals = 0, None, 0, [], {}
    resume_path = ckpt.resolve_resume(resume if resume is not None else cfg.resume_from_checkpoint, cfg.output_dir)
    if resume_path is not None:
        saved = ckpt.load_checkpoint(resume_path, model, optimizer, scheduler)
        step, rnd, round_step = saved["step"], saved.get("round"), saved.get("round_step", 0)
        history, evals = saved.get("history", []), saved.get("evals", {})
        stream.load_state(saved["data"])
    logger = MetricsLogger(cfg.output_dir, cfg.report_targets, run_name=cfg.run_name, total_steps=total_steps,
                           progress=cfg.progress_bar, config=cfg.to_dict(), resume=resume_path is not None,
                           resume_step=step)
    ctx = RunContext(cfg, model, tokenizer, backend, scorer, advantage_fn, reference, autocast, train_rows,
                     step, total_steps)
    run_eval = partial(_evaluate, ctx, eval_rows, eval_reward_fn, logger, evals)
    try:
        if resume_path is None and cfg.eval_before_train:
            run_eval("before", step)
        timers = Timers()
        steps_per_pass, ga = steps_per_round // cfg.num_iterations, cfg.gradient_accumulation_steps
        while step < total_steps:
            if rnd is None or round_step >= steps_per_round:  # a new generation round
                ctx.step = step
                rnd, round_step = generate_round(ctx, stream, timers), 0
            k = round_step % steps_per_pass  # the k-th optimizer step of this pass over the round
            update = optimizer_step(ctx, rnd.micro_batches[k * ga:(k + 1) * ga], spec, optimizer, scheduler, timers)
            backend.sync_weights(model)  # engines with their own weight copy (vLLM) need the update
            step, round_step = step + 1, round_step + 1
            _report(cfg, logger, step, total_steps, {**rnd.metrics, **update, **timers.pop(), "epoch": stream.epoch},
                    rnd, history)
            if cfg.eval_steps and step % cfg.eval_steps == 0 and step < total_steps:
                run_eval(f"step{step}", step)
            if _should_save(cfg, step, steps_per_round * rounds_per_epoch, total_steps):
                state = {"data": stream.state(), "round": rnd if round_step < steps_per_round else None,
                         "round_step": round_step, "history": history, "evals": evals}
                ckpt.save_checkpoint(cfg.output_dir, step, model, tokenizer, optimizer, scheduler, state,
                                     total_limit=cfg.save_total_limit)
            timers.restart()  # evaluation and checkpoint writing are not part of the next step's time
        run_eval("after", step)
    finally:
        logger.close()
    return {"global_step": step, "total_steps": total_steps, "history": history, "evals": evals,
            "metrics_path": str(logger.metrics_path), "samples_path": str(logger.samples_path),
            "tensorboard_dir": str(logger.tb_dir) if logger.tb_dir else None,
            "last_checkpoint": str(ckpt.latest_checkpoint(cfg.output_dir) or "")}


@dataclass
class RunContext:
    cfg: GRPOConfig
    model: Any
    tokenizer: Any
    backend: Any
    scorer: RewardScorer
    advantage_fn: Any
    reference: Reference | None
    autocast: Any
    rows: Any
    step: int = 0
    total_steps: int = 0


def _report(cfg: GRPOConfig, logger: MetricsLogger, step: int, total_steps: int, metrics: dict[str, Any],
            rnd: Round, history: list[dict]) -> None:
    """Log one optimizer step: metrics.jsonl / TensorBoard / W&B, progress bar, samples.jsonl."""
    # prompt + completion tokens this step trained on, per second of the whole step (generation included)
    metrics["tokens_per_s"] = metrics.pop("seq_tokens") / max(metrics["time/step"], 1e-9)
    if step % cfg.logging_steps == 0 or step == total_steps:
        logger.log(step, metrics)
        history.append({"step": step, **{k: metrics.get(k) for k in ("reward", "loss/policy", "kl", "entropy")}})
    logger.advance(step, metrics)
    if cfg.log_completions_steps and step % cfg.log_completions_steps == 0:
        logger.log_samples(step, rnd.samples)


def _should_save(cfg: GRPOConfig, step: int, steps_per_epoch: int, total_steps: int) -> bool:
    """Every save_steps (or epoch), and at the last step so that a longer run can --resume from it."""
    if cfg.save_strategy == "no":
        return False
    if step == total_steps:
        return True
    return step % (cfg.save_steps if cfg.save_strategy == "steps" else steps_per_epoch) == 0


# ---- one generation round ---------------------------------------------------------------------------
@dataclass
class Scored:
    rollout: Rollout
    rewards: torch.Tensor  # [B,G] total, NaN = no opinion
    components: list[list[float]]  # [N][F]
    prompts: list[Any]
    columns: dict[str, list]


def sample_and_score(ctx: RunContext, idx: list[int], timers: Timers) -> Scored:
    cfg, G = ctx.cfg, ctx.cfg.num_generations
    rows = [ctx.rows[int(i)] for i in idx]
    params = SamplingParams(cfg.max_new_tokens, cfg.temperature, cfg.top_p, cfg.top_k, cfg.max_prompt_length)
    with timers("generate"):
        texts = [render_prompt(r[cfg.prompt_column], ctx.tokenizer, cfg.system_prompt) for r in rows]
        with ctx.autocast():
            rollout = ctx.backend.generate(texts, G, params)
    with timers("reward"):
        expanded = [r for r in rows for _ in range(G)]
        prompts = [r[cfg.prompt_column] for r in expanded]
        columns = reward_columns(expanded, cfg.prompt_column)
        completions = completions_for_rewards(rollout.completions, prompts)
        state = SimpleNamespace(global_step=ctx.step, max_steps=ctx.total_steps)
        totals, components = ctx.scorer.score(prompts, completions, columns, trainer_state=state)
    rewards = torch.tensor(totals, dtype=torch.float32).view(len(rows), G)
    return Scored(rollout, rewards, components, prompts, columns)


def zero_std_groups(rewards: torch.Tensor) -> torch.Tensor:
    """[B] bool: groups whose non-NaN rewards all agree (or fewer than two) -- no learning signal."""
    valid = ~torch.isnan(rewards)
    filled_hi = torch.where(valid, rewards, torch.full_like(rewards, -math.inf)).max(dim=1).values
    filled_lo = torch.where(valid, rewards, torch.full_like(rewards, math.inf)).min(dim=1).values
    return (valid.sum(dim=1) < 2) | (filled_hi == filled_lo)


def generate_round(ctx: RunContext, stream: PromptStream, timers: Timers) -> Round:
    """Rollout, score, (dynamic sampling), advantages, and the fixed log-probs the updates need."""
    cfg = ctx.cfg
    first = sample_and_score(ctx, stream.next(), timers)
    parts, zero = [first], zero_std_groups(first.rewards)
    B = first.rewards.shape[0]
    keep = [(0, b) for b in range(B) if not zero[b]] if cfg.dynamic_sampling != "none" else [(0, b) for b in range(B)]
    rounds = 0
    while cfg.dynamic_sampling == "resample" and len(keep) < B and rounds < cfg.max_resample_rounds:
        rounds += 1  # DAPO (arXiv:2503.14476, Sec. 3.2): over-sample until the batch holds informative groups
        extra = sample_and_score(ctx, stream.next(), timers)
        parts.append(extra)
        keep += [(len(parts) - 1, b) for b in range(B) if not zero_std_groups(extra.rewards)[b]]
    if cfg.dynamic_sampling == "resample" and len(keep) < B:  # still short: fill with uninformative groups
        keep += [(p, b) for p, s in enumerate(parts) for b in range(B) if (p, b) not in keep][:B - len(keep)]
    keep = keep[:B]
    if not keep:  # 'drop' removed every group: keep the batch (its advantages are all 0 anyway)
        keep = [(0, b) for b in range(B)]
    batch = _assemble(ctx, parts, keep)
    metrics = round_metrics(ctx, first, batch["adv"], batch["rollout"])
    metrics.update({"dynamic/kept_groups": float(len(keep)), "dynamic/extra_rounds": float(rounds),
                    "dynamic/frac_zero_std_kept": float(zero_std_groups(batch["rewards"]).float().mean())})
    micro_batches = _micro_batches(ctx, batch, timers)
    return Round(micro_batches, metrics, _samples(ctx, batch))


def _assemble(ctx: RunContext, parts: list[Scored], keep: list[tuple[int, int]]) -> dict[str, Any]:
    G = ctx.cfg.num_generations
    rollouts, rewards, components, advs = [], [], [], []
    for p, b in keep:
        s = parts[p]
        rows = list(range(b * G, (b + 1) * G))
        rollouts.append(s.rollout.select(rows))
        rewards.append(s.rewards[b])
        components.extend(s.components[r] for r in rows)
    reward_mat = torch.stack(rewards)
    # advantages per part, so 'group' scaling sees whole groups and 'batch' scaling the sampled batch
    for p, b in keep:
        advs.append(ctx.advantage_fn(parts[p].rewards)[b])
    adv = torch.stack(advs).reshape(-1).float()
    rollout = concat_rollouts(rollouts, ctx.tokenizer.pad_token_id)
    return {"rollout": rollout, "rewards": reward_mat, "components": components, "adv": adv}


def _micro_batches(ctx: RunContext, batch: dict[str, Any], timers: Timers) -> list[MicroBatch]:
    cfg, r = ctx.cfg, batch["rollout"]
    device = r.completion_ids.device
    loss_mask = r.completion_mask
    if cfg.mask_truncated_completions:  # DAPO overlong filtering: truncated answers carry no signal
        loss_mask = loss_mask * (~r.truncated).unsqueeze(1).long()
    adv = batch["adv"].to(device)
    chunks = [c.tolist() for c in np.array_split(np.arange(len(r)), cfg.effective_steps_per_generation)]
    mbs = []
    for c in chunks:
        i = torch.as_tensor(c, dtype=torch.long, device=device)
        T = int(r.completion_mask[i].sum(dim=1).max().item()) if len(c) else 1
        mbs.append(MicroBatch(r.prompt_ids[i], r.prompt_mask[i], r.completion_ids[i][:, :max(T, 1)],
                              r.completion_mask[i][:, :max(T, 1)], loss_mask[i][:, :max(T, 1)], adv[i]))
    if ctx.reference is not None:
        with timers("ref_forward"), ctx.reference.context():
            for mb, lp in zip(mbs, batched_logps(ctx.reference.model, mbs, cfg.temperature, ctx.autocast)):
                mb.ref_logp = lp
    if cfg.needs_old_logp:
        # With mu = 1 the first optimizer step's micro-batches are scored before any update: their old
        # log-probs are the current ones, which the loss takes as logp.detach() when old_logp is None.
        first = cfg.gradient_accumulation_steps if cfg.num_iterations == 1 else 0
        with timers("old_logp_forward"):
            moved = mbs[first:]
            for mb, lp in zip(moved, batched_logps(ctx.model, moved, cfg.temperature, ctx.autocast)):
                mb.old_logp = lp
    return mbs


# ---- one optimizer step -----------------------------------------------------------------------------
def step_totals(mbs: list[MicroBatch], max_new_tokens: int) -> dict[str, int]:
    """Normalisers of the WHOLE optimizer step, passed to every micro-batch's aggregation."""
    return {"num_tokens": int(sum(int(mb.loss_mask.sum()) for mb in mbs)),
            "num_seqs": sum(mb.prompt_ids.shape[0] for mb in mbs), "max_len": max_new_tokens}


def optimizer_step(ctx: RunContext, mbs: list[MicroBatch], spec: LossSpec, optimizer: Any, scheduler: Any,
                   timers: Timers) -> dict[str, float]:
    """Accumulate the micro-batch gradients (normalised by the whole step's totals), clip, step."""
    cfg = ctx.cfg
    mbs = [mb for mb in mbs if mb.prompt_ids.shape[0] > 0]
    totals = step_totals(mbs, cfg.max_new_tokens)
    acc: dict[str, torch.Tensor] = {}
    with timers("policy_fwd_bwd"):
        for mb in mbs:
            with ctx.autocast():
                loss, sums = micro_batch_loss(ctx.model, mb, spec, totals)
            loss.backward()
            combine(acc, sums)
    with timers("optimizer"):
        params = [p for p in ctx.model.parameters() if p.requires_grad]
        max_norm = cfg.max_grad_norm if cfg.max_grad_norm > 0 else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        lr = scheduler.get_last_lr()[0]
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
    out = {k: float(v) for k, v in acc.items()}
    out.setdefault("kl", float("nan"))  # no reference model when kl_coef = 0
    seq_tokens = sum(int(mb.prompt_mask.sum() + mb.completion_mask.sum()) for mb in mbs)
    out.update({"grad_norm": float(grad_norm), "lr": lr, "num_tokens": float(totals["num_tokens"]),
                "seq_tokens": float(seq_tokens)})
    return out


# ---- metrics of a round -----------------------------------------------------------------------------
def _nan_stats(values: torch.Tensor) -> tuple[float, float]:
    v = values[~torch.isnan(values)]
    if v.numel() == 0:
        return float("nan"), float("nan")
    return float(v.mean()), float(v.std(unbiased=False))


def round_metrics(ctx: RunContext, first: Scored, adv: torch.Tensor, rollout: Rollout) -> dict[str, float]:
    """Reward (total and per function), group spread, advantage and length statistics of the round."""
    m: dict[str, float] = {}
    m["reward"], m["reward/std_all"] = _nan_stats(first.rewards.flatten())
    valid = ~torch.isnan(first.rewards)
    group_std = [float(r[v].std(unbiased=False)) if int(v.sum()) > 1 else 0.0
                 for r, v in zip(first.rewards, valid)]
    m["reward_std"] = sum(group_std) / len(group_std)
    m["frac_reward_zero_std"] = float(zero_std_groups(first.rewards).float().mean())
    comps = torch.tensor(first.components, dtype=torch.float32)
    for j, name in enumerate(ctx.scorer.names):
        m[f"rewards/{name}/mean"], m[f"rewards/{name}/std"] = _nan_stats(comps[:, j])
        m[f"rewards/{name}/frac_none"] = float(torch.isnan(comps[:, j]).float().mean())
    m.update({"advantage/mean": float(adv.mean()), "advantage/std": float(adv.std(unbiased=False)),
              "advantage/min": float(adv.min()), "advantage/max": float(adv.max()),
              "advantage/frac_zero": float((adv == 0).float().mean())})
    lengths = first.rollout.completion_mask.sum(dim=1).float()
    m.update({"completions/mean_length": float(lengths.mean()), "completions/min_length": float(lengths.min()),
              "completions/max_length": float(lengths.max()),
              "completions/truncated_frac": float(first.rollout.truncated.float().mean())})
    return m


def _samples(ctx: RunContext, batch: dict[str, Any]) -> list[dict]:
    r, n = batch["rollout"], ctx.cfg.num_completions_to_log
    totals = batch["rewards"].reshape(-1)
    out = []
    for i in range(min(n, len(r))):
        comps = {name: _none_if_nan(batch["components"][i][j]) for j, name in enumerate(ctx.scorer.names)}
        out.append({"prompt": r.prompts[i], "completion": r.completions[i], "reward": _none_if_nan(float(totals[i])),
                    "rewards": comps, "advantage": float(batch["adv"][i]), "truncated": bool(r.truncated[i])})
    return out


def _none_if_nan(x: float) -> float | None:
    return None if math.isnan(x) else x


# ---- held-out evaluation ----------------------------------------------------------------------------
def _evaluate(ctx: RunContext, eval_rows: Any, eval_reward_fn: Any, logger: MetricsLogger, evals: dict,
              tag: str, step: int) -> None:
    cfg = ctx.cfg
    if eval_rows is None or len(eval_rows) == 0 or eval_reward_fn is None:
        return
    rows = [eval_rows[i] for i in range(len(eval_rows))]
    with ctx.autocast():
        result = evaluate(ctx.backend, ctx.tokenizer, rows, eval_reward_fn, prompt_column=cfg.prompt_column,
                          system_prompt=cfg.system_prompt,
                          max_new_tokens=cfg.eval_max_new_tokens or cfg.max_new_tokens,
                          max_prompt_length=cfg.max_prompt_length, temperature=cfg.eval_temperature,
                          num_samples=cfg.eval_num_samples, batch_size=cfg.eval_batch_size)
    samples = result.pop("samples")
    evals[tag] = {k: v for k, v in result.items()} | {"step": step}
    logger.log(step, {f"eval/{k}": v for k, v in result.items()} | {"eval/tag": tag})
    logger.log_samples(step, [{"eval": tag, **s} for s in samples])


def save_final(model: Any, tokenizer: Any, path: str | Path) -> Path:
    """The trained model in plain HF format. A LoRA run is saved merged (loads in transformers and vLLM
    without peft) with the adapter itself in ``<path>/adapter``."""
    from grouprl.train.model import is_peft

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    if is_peft(model):
        model.save_pretrained(path / "adapter")
        import copy

        copy.deepcopy(model).merge_and_unload().save_pretrained(path)
    else:
        model.save_pretrained(path)
    if tokenizer is not None:
        tokenizer.save_pretrained(path)
    return path
