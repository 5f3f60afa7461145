"""One optimizer step: the loss of one micro-batch (:func:`micro_batch_loss`), and one accumulate-clip-step
(:func:`optimizer_step`) that sums the micro-batches' gradients, clips and steps -- with the same
normalisers for the whole step, so splitting a step into more micro-batches leaves the gradient unchanged.
The log-probs come from :mod:`grouprl.train.engine.logp` (the chunked LM head, padding trimmed, packing).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from grouprl.algo.ops import masked_sum
from grouprl.errors import GroupRLError
from grouprl.train.checkpoint.unpickle import moved_from
from grouprl.train.engine.logp import (  # re-exported: the loops and tests import them from here
    DEFAULT_LOGITS_CHUNK,
    batched_logps,
    completion_logps,
    lm_head_parts,
    trim_padding,
)
from grouprl.train.parallel import ranks as dist


@dataclass
class MicroBatch:
    """Rows of one micro-batch; ``loss_mask`` is ``completion_mask`` minus masked truncations."""

    prompt_ids: torch.Tensor  # [N,P]
    prompt_mask: torch.Tensor  # [N,P]
    completion_ids: torch.Tensor  # [N,T]
    completion_mask: torch.Tensor  # [N,T]
    loss_mask: torch.Tensor  # [N,T]
    adv: torch.Tensor  # [N]
    old_logp: torch.Tensor | None = None  # [N,T], only when the policy moved since generation
    ref_logp: torch.Tensor | None = None  # [N,T], only when kl_coef > 0
    rollout_logp: torch.Tensor | None = None  # [N,T], the sampling engine's log-probs (vLLM), else None


@dataclass
class LossSpec:
    """The registered functions and hyper-parameters of the objective (resolved once from the config)."""

    policy_loss: Any
    loss_hp: dict
    aggregate: Any
    kl_estimator: Any
    kl_coef: float
    temperature: float
    # ---- sampler/trainer mismatch (grouprl.algo.correction), used when a micro-batch has rollout_logp
    correction: Any = None  # fn(old_logp, rollout_logp, mask) -> (weight, metrics), or None
    use_engine_logp: bool = False  # old_logp := rollout_logp (gspo_use_engine_logp), no correction weight
    logits_chunk_size: int = DEFAULT_LOGITS_CHUNK  # positions per chunk through the LM head (completion_logps); 0 = logits_to_keep
    padding_free: bool | str = False  # pack sequences into rows (completion_logps; the config field, default auto)


def mismatch_correction(cfg: Any) -> dict[str, Any]:
    """``LossSpec`` fields for the sampler/trainer mismatch from the config's ``rollout_correction``,
    ``rollout_is_cap``, ``rollout_mask_band`` and ``gspo_use_engine_logp`` (``auto`` = ``tis``, applied
    only to micro-batches whose backend reported ``rollout_logp``; none with ``gspo_use_engine_logp``)."""
    from functools import partial

    from grouprl.algo.correction import CORRECTIONS

    name = cfg.rollout_correction
    if name == "auto":
        name = "none" if cfg.gspo_use_engine_logp else "tis"
    hp = {"tis": {"cap": float(cfg.rollout_is_cap)}, "mask": {"band": tuple(cfg.rollout_mask_band)}, "none": {}}[name]
    fn = partial(CORRECTIONS[name], **hp) if name in CORRECTIONS else None
    return {"correction": fn, "use_engine_logp": bool(cfg.gspo_use_engine_logp)}




def micro_batch_loss(model: Any, mb: MicroBatch, spec: LossSpec, totals: dict[str, Any]):
    """Loss of one micro-batch, normalised by the totals of the WHOLE optimizer step.

    ``totals`` = num_tokens / num_seqs / max_len of the step, so summing the returned losses of all
    micro-batches equals the loss of the whole step computed at once (and so do the gradients).
    Returns ``(loss, sums)``: ``sums`` are detached, already normalised by the step so they add up across
    micro-batches (``_min`` / ``_max`` keys combine by min / max instead).
    """
    logp, entropy = completion_logps(model, mb.prompt_ids, mb.prompt_mask, mb.completion_ids,
                                     mb.completion_mask, spec.temperature, with_entropy=True,
                                     chunk_size=spec.logits_chunk_size, padding_free=spec.padding_free)
    # On-policy (mu = 1, one step per generation): old_logp is the current forward, detached -- ratio 1
    # in value, gradient of the ratio = gradient of logp (arXiv 2402.03300, Sec. 4.1.3).
    old_logp = mb.old_logp if mb.old_logp is not None else logp.detach()
    is_weight, mismatch = None, {}
    if mb.rollout_logp is not None and spec.correction is not None:
        is_weight, mismatch = spec.correction(old_logp, mb.rollout_logp, mb.loss_mask)
    if mb.rollout_logp is not None and spec.use_engine_logp:  # the ratio itself is pi_theta / pi_engine
        old_logp = mb.rollout_logp
    per_token, loss_metrics = spec.policy_loss(logp, old_logp, mb.adv, mb.loss_mask, **spec.loss_hp)
    if is_weight is not None:  # detached truncated-IS / mask weight (grouprl.algo.correction)
        per_token = per_token * is_weight
    policy = spec.aggregate(per_token, mb.loss_mask, **totals)
    loss = policy
    step_tokens = torch.as_tensor(float(totals["num_tokens"]))
    sums: dict[str, torch.Tensor] = {"loss/policy": policy.detach()}
    mb_tokens = mb.loss_mask.sum().float()
    if spec.kl_coef > 0:
        kl_tok = spec.kl_estimator(logp, mb.ref_logp)
        kl = spec.aggregate(kl_tok, mb.loss_mask, **totals)
        loss = policy + spec.kl_coef * kl
        sums["loss/kl"] = kl.detach()
        sums["kl"] = masked_sum(kl_tok.detach(), mb.loss_mask) / step_tokens.clamp(min=1)
    sums["loss/total"] = loss.detach()
    sums["entropy"] = masked_sum(entropy, mb.loss_mask) / step_tokens.clamp(min=1)
    weight = mb_tokens / step_tokens.clamp(min=1)
    for key, value in loss_metrics.items():
        value = value.detach().float()
        sums[f"policy/{key}"] = value if key.endswith(("_min", "_max")) else value * weight
    for key, value in mismatch.items():
        sums[f"mismatch/{key}"] = value.detach().float() * (1.0 if key.endswith("_max") else weight)
    return loss, sums


def combine(acc: dict[str, torch.Tensor], sums: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Accumulate micro-batch ``sums`` into ``acc`` (sum, or min / max for ``_min`` / ``_max`` keys)."""
    for key, value in sums.items():
        if key not in acc:
            acc[key] = value
        elif key.endswith("_min"):
            acc[key] = torch.minimum(acc[key], value)
        elif key.endswith("_max"):
            acc[key] = torch.maximum(acc[key], value)
        else:
            acc[key] = acc[key] + value
    return acc


# ---- one optimizer step -----------------------------------------------------------------------------
def step_totals(mbs: list[MicroBatch], max_new_tokens: int) -> dict[str, int]:
    """Normalisers of the WHOLE optimizer step, passed to every micro-batch's aggregation.

    ``num_seqs`` counts the sequences with at least one loss token: a row emptied by
    ``mask_truncated_completions`` or an unknown reward takes no part in the step's mean.
    """
    return {"num_tokens": int(sum(int(mb.loss_mask.sum()) for mb in mbs)),
            "num_seqs": int(sum(int((mb.loss_mask.sum(dim=1) > 0).sum()) for mb in mbs)), "max_len": max_new_tokens}


class NonFiniteError(GroupRLError, FloatingPointError):
    """Too many consecutive optimizer steps had a non-finite loss or gradient norm."""


class SkipGuard:
    """Counts optimizer steps skipped for a non-finite loss / gradient norm; stops the run after
    ``max_consecutive`` in a row (a single bad batch is survivable, a diverged run is not)."""

    def __init__(self, max_consecutive: int, total: int = 0) -> None:
        self.max_consecutive, self.total, self.consecutive = max_consecutive, total, 0

    def check(self, update: dict[str, Any], step: int) -> None:
        """Read ``skipped`` / ``skip_reason`` of an ``optimizer_step`` result; add ``skipped_steps``."""
        skipped, reason = bool(update.pop("skipped", 0.0)), update.pop("skip_reason", "")
        self.update(skipped, step, reason)
        update["skipped_steps"] = float(self.total)

    def update(self, skipped: bool, step: int, detail: str) -> None:
        self.total += int(skipped)
        self.consecutive = self.consecutive + 1 if skipped else 0
        if skipped and self.consecutive >= self.max_consecutive:
            raise NonFiniteError(
                f"optimizer step {step}: {detail} for {self.consecutive} consecutive steps "
                f"(max_consecutive_skips={self.max_consecutive}); {self.total} step(s) skipped in all. Likely "
                f"causes: a learning rate too high (lower learning_rate or max_grad_norm), fp16/bf16 overflow "
                f"(load the model in float32, bf16=false), or a reward function returning huge values.")


def accumulate_and_step(model: Any, batches: list, loss_of: Callable, autocast: Any, optimizer: Any,
                        scheduler: Any, max_grad_norm: float, timers: Any = None):
    """grouprl's own optimizer step (one process, DDP, FSDP2), for every loop: backward of every micro-batch
    (``loss_of(batch) -> (loss, metric sums)``, normalised by the whole step), the SUM of the ranks'
    gradients, clipping by the global norm, then the optimizer and schedule unless the loss (on any rank)
    or the gradient norm is not finite. Returns ``(sums, grad_norm, finite_loss, skipped, lr)``."""
    ranks, timers = dist.current(), timers or _untimed
    acc: dict[str, torch.Tensor] = {}
    finite_loss: Any = True  # a device tensor after the first micro-batch: no host sync inside the loop
    with timers("policy_fwd_bwd"):
        for batch in batches:
            with autocast():
                loss, sums = loss_of(batch)
            loss.backward()
            finite_loss = torch.isfinite(loss.detach()) & finite_loss
            combine(acc, sums)
    with timers("optimizer"):
        params = [p for p in model.parameters() if p.requires_grad]
        ranks.sum_gradients(params)  # global loss = sum of rank losses: its gradient is the SUM over ranks
        grad_norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm if max_grad_norm > 0 else float("inf"))
        lr = scheduler.get_last_lr()[0]
        finite_loss = ranks.all_gather(bool(finite_loss)) == [True] * ranks.world  # one host sync per step
        skipped = not (finite_loss and bool(torch.isfinite(grad_norm)))
        if not skipped:
            optimizer.step()
            scheduler.step()
        optimizer.zero_grad(set_to_none=True)
    return acc, grad_norm, finite_loss, skipped, lr


def _untimed(name: str) -> Any:
    return nullcontext()


def optimizer_step(ctx: Any, mbs: list[MicroBatch], spec: LossSpec, optimizer: Any, scheduler: Any,
                   timers: Any) -> dict[str, float]:
    """Accumulate the micro-batch gradients (normalised by the whole step's totals), clip, step.

    ``ctx`` carries ``cfg``, ``model`` and ``autocast`` (a ``grouprl.train.algorithms.rounds.RunContext``).
    A step whose loss or gradient norm is not finite is skipped: its gradients are dropped, neither the
    optimizer nor the learning-rate schedule moves (the schedule counts applied updates), and the result
    has ``skipped = 1.0`` and ``skip_reason``; the caller still advances its step counter, so the data
    order and the round structure stay those of a run without the skip.
    """
    cfg, ranks = ctx.cfg, dist.current()  # ranks: no-ops in one process (grouprl.train.parallel.ranks)
    mbs = [mb for mb in mbs if mb.prompt_ids.shape[0] > 0]
    totals = ranks.global_totals(step_totals(mbs, cfg.max_new_tokens))  # counts of the GLOBAL step
    if ranks.engine is not None:  # DeepSpeed ZeRO (train/parallel/deepspeed.py): its engine reduces, clips and steps
        from grouprl.train.parallel.deepspeed import zero_step

        acc, grad_norm, finite_loss, skipped, lr = zero_step(
            ranks, ctx, mbs, lambda model, mb: micro_batch_loss(model, mb, spec, totals), combine, scheduler, timers)
    else:
        acc, grad_norm, finite_loss, skipped, lr = accumulate_and_step(
            ctx.model, mbs, lambda mb: micro_batch_loss(ctx.model, mb, spec, totals), ctx.autocast, optimizer,
            scheduler, cfg.max_grad_norm, timers)
    seq_tokens = sum(int(mb.prompt_mask.sum() + mb.completion_mask.sum()) for mb in mbs)
    acc["seq_tokens"] = torch.as_tensor(float(seq_tokens))
    if ranks.enabled:  # the sums are normalised by the global step: adding the ranks' gives the global value
        parts, acc = ranks.all_gather({k: v.detach().cpu() for k, v in acc.items()}), {}
        for part in parts:
            combine(acc, part)
    out = {k: float(v) for k, v in acc.items()}
    seq_tokens = out.pop("seq_tokens")
    out.setdefault("kl", float("nan"))  # no reference model when kl_coef = 0
    out.update({"grad_norm": float(grad_norm), "lr": lr, "num_tokens": float(totals["num_tokens"]),
                "seq_tokens": float(seq_tokens), "skipped": float(skipped)})
    if skipped:
        out["skip_reason"] = "non-finite loss" if not finite_loss else "non-finite gradient norm"
    return out

moved_from("grouprl.train.step", to=__name__)  # checkpoints pickled its classes under the old path(s)

__all__ = ["DEFAULT_LOGITS_CHUNK", "LossSpec", "MicroBatch", "SkipGuard", "accumulate_and_step", "batched_logps", "combine",
           "completion_logps", "lm_head_parts", "micro_batch_loss", "mismatch_correction", "optimizer_step",
           "step_totals", "trim_padding"]
