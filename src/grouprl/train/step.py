"""One optimizer step's pieces: per-token log-probs of completions, and the loss of one micro-batch.

Memory: the policy forward asks the model for logits of the completion positions only
(``logits_to_keep = T + 1``; prompt positions never reach the LM head) and takes log-probs with the chunked
``selective_log_softmax`` (no ``[N, T, V]`` log-softmax copy). ``plain=True`` is the straightforward path
(full logits, full ``log_softmax``) kept for the equivalence test.

Shapes: N sequences in the micro-batch, P prompt tokens (left-padded), T completion tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from grouprl.algo.ops import entropy_from_logits, masked_sum, selective_log_softmax
from grouprl.errors import GroupRLError


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


def completion_logps(model: Any, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                     completion_ids: torch.Tensor, completion_mask: torch.Tensor, temperature: float = 1.0,
                     *, with_entropy: bool = False, plain: bool = False):
    """log pi(y_t | x, y_<t) for every completion token: ``[N,T]`` (and the entropy ``[N,T]`` if asked).

    Logits are divided by ``temperature`` in fp32 (whatever the compute dtype) so the log-probs are those of
    the sampling distribution.
    Position ids follow the attention mask, as in ``generate`` with left padding.
    """
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
    attention = torch.cat([prompt_mask, completion_mask], dim=1)
    position_ids = (attention.long().cumsum(-1) - 1).clamp(min=0)
    T = completion_ids.shape[1]
    if plain:
        logits = model(input_ids=input_ids, attention_mask=attention, position_ids=position_ids,
                       use_cache=False).logits
        logits = logits[:, -T - 1:-1].float() / temperature
        logp = torch.log_softmax(logits, dim=-1).gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)
    else:
        out = model(input_ids=input_ids, attention_mask=attention, position_ids=position_ids,
                    logits_to_keep=T + 1, use_cache=False)
        logits = out.logits[:, :-1].float() / temperature  # fp32: a bf16 division rounds every logit
        logp = selective_log_softmax(logits, completion_ids)
    if not with_entropy:
        return logp, None
    with torch.no_grad():
        entropy = entropy_from_logits(logits.detach())
    return logp, entropy


def micro_batch_loss(model: Any, mb: MicroBatch, spec: LossSpec, totals: dict[str, Any]):
    """Loss of one micro-batch, normalised by the totals of the WHOLE optimizer step.

    ``totals`` = num_tokens / num_seqs / max_len of the step, so summing the returned losses of all
    micro-batches equals the loss of the whole step computed at once (and so do the gradients).
    Returns ``(loss, sums)``: ``sums`` are detached, already normalised by the step so they add up across
    micro-batches (``_min`` / ``_max`` keys combine by min / max instead).
    """
    logp, entropy = completion_logps(model, mb.prompt_ids, mb.prompt_mask, mb.completion_ids,
                                     mb.completion_mask, spec.temperature, with_entropy=True)
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


@torch.no_grad()
def batched_logps(model: Any, rows: list[MicroBatch], temperature: float, ctx: Any) -> list[torch.Tensor]:
    """log-probs of each micro-batch without gradient (reference or old policy), with dropout off.

    The model is put in eval mode for these forwards and back in the mode it was in afterwards.
    """
    was_training = model.training
    model.eval()
    try:
        return _logps(model, rows, temperature, ctx)
    finally:
        model.train(was_training)


def _logps(model: Any, rows: list[MicroBatch], temperature: float, ctx: Any) -> list[torch.Tensor]:
    out = []
    for mb in rows:
        if mb.prompt_ids.shape[0] == 0:  # a micro-batch emptied by dropped groups
            out.append(torch.zeros(mb.completion_ids.shape, dtype=torch.float32, device=mb.completion_ids.device))
            continue
        with ctx():
            logp, _ = completion_logps(model, mb.prompt_ids, mb.prompt_mask, mb.completion_ids,
                                       mb.completion_mask, temperature)
        out.append(logp.float())
    return out


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


def optimizer_step(ctx: Any, mbs: list[MicroBatch], spec: LossSpec, optimizer: Any, scheduler: Any,
                   timers: Any) -> dict[str, float]:
    """Accumulate the micro-batch gradients (normalised by the whole step's totals), clip, step.

    ``ctx`` carries ``cfg``, ``model`` and ``autocast`` (a ``grouprl.train.round.RunContext``).
    A step whose loss or gradient norm is not finite is skipped: its gradients are dropped, neither the
    optimizer nor the learning-rate schedule moves (the schedule counts applied updates), and the result
    has ``skipped = 1.0`` and ``skip_reason``; the caller still advances its step counter, so the data
    order and the round structure stay those of a run without the skip.
    """
    cfg = ctx.cfg
    mbs = [mb for mb in mbs if mb.prompt_ids.shape[0] > 0]
    totals = step_totals(mbs, cfg.max_new_tokens)
    acc: dict[str, torch.Tensor] = {}
    finite_loss: Any = True  # a device tensor after the first micro-batch: no host sync inside the loop
    with timers("policy_fwd_bwd"):
        for mb in mbs:
            with ctx.autocast():
                loss, sums = micro_batch_loss(ctx.model, mb, spec, totals)
            loss.backward()
            finite_loss = torch.isfinite(loss.detach()) & finite_loss
            combine(acc, sums)
    with timers("optimizer"):
        params = [p for p in ctx.model.parameters() if p.requires_grad]
        max_norm = cfg.max_grad_norm if cfg.max_grad_norm > 0 else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        lr = scheduler.get_last_lr()[0]
        finite_loss = bool(finite_loss)  # one host sync per step
        skipped = not (finite_loss and bool(torch.isfinite(grad_norm)))
        if not skipped:
            optimizer.step()
            scheduler.step()
        optimizer.zero_grad(set_to_none=True)
    out = {k: float(v) for k, v in acc.items()}
    out.setdefault("kl", float("nan"))  # no reference model when kl_coef = 0
    seq_tokens = sum(int(mb.prompt_mask.sum() + mb.completion_mask.sum()) for mb in mbs)
    out.update({"grad_norm": float(grad_norm), "lr": lr, "num_tokens": float(totals["num_tokens"]),
                "seq_tokens": float(seq_tokens), "skipped": float(skipped)})
    if skipped:
        out["skip_reason"] = "non-finite loss" if not finite_loss else "non-finite gradient norm"
    return out
