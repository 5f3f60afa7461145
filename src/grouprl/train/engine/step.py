"""One optimizer step's pieces: per-token log-probs of completions, and the loss of one micro-batch.

Memory and padding: every forward first drops the columns that are padding in every row of its
micro-batch (:func:`trim_padding`). For causal LMs whose logits are a plain linear map of the last hidden
state (Llama, Qwen2/3, Mistral, ...) the decoder runs to that hidden state and only the real completion
tokens go through the LM head, ``logits_chunk_size`` positions at a time in the forward and the backward
(:mod:`grouprl.algo.lmhead`): the ``[N, T, V]`` logits never exist (the backward reuses each chunk's softmax,
kept from the forward up to ``lmhead.KEEP_SOFTMAX_BYTES`` per call, and recomputes the rest). Other models are asked for the logits of
the completion positions only (``logits_to_keep = T + 1``) and take the chunked ``selective_log_softmax``.
With ``padding_free`` (the config field) the decoder runs instead on the micro-batch's sequences packed
end to end into fewer rows (:mod:`grouprl.train.engine.packing`), so padding is not computed either.
``plain=True`` is the straightforward path (full logits, full ``log_softmax``) kept for equivalence tests.

Shapes: N sequences in the micro-batch, P prompt tokens (left-padded), T completion tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from grouprl.algo.lmhead import linear_log_softmax
from grouprl.algo.ops import entropy_from_logits, masked_sum, selective_log_softmax
from grouprl.errors import GroupRLError
from grouprl.train.checkpoint.unpickle import moved_from
from grouprl.train.engine import packing
from grouprl.train.parallel import ranks as dist

DEFAULT_LOGITS_CHUNK = 1024  # positions per chunk through the LM head (benchmarks/logits_memory.py)


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


# Causal LMs whose logits are exactly ``lm_head(decoder(...).last_hidden_state)``: no soft-capping (Gemma 2/3),
# no logit scaling (Granite, Cohere). Any other model takes the logits_to_keep path.
PLAIN_HEAD_MODELS = frozenset({"llama", "mistral", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "phi3", "olmo2", "gemma"})


def lm_head_parts(model: Any) -> tuple[Any, torch.Tensor, torch.Tensor | None] | None:
    """``(decoder, weight [V,H], bias [V] or None)`` of a causal LM whose logits are a plain linear map of
    the decoder's last hidden state (its final norm included), or None where that is not known to hold:
    an architecture outside :data:`PLAIN_HEAD_MODELS`, a subclass with its own ``forward``, an LM head that
    is not an ``nn.Linear`` (LoRA on the head), sharded weights (FSDP), which only the model's own forward
    gathers, or forward hooks or an instance-level ``forward`` (a wrapper) on the model or its head, which
    calling the decoder directly would skip."""
    base = model.get_base_model() if hasattr(model, "get_base_model") and hasattr(model, "peft_config") else model
    config = getattr(base, "config", None)
    if getattr(config, "model_type", None) not in PLAIN_HEAD_MODELS or type(base).__name__.startswith("FSDP"):
        return None
    if not getattr(type(base).forward, "__module__", "").startswith("transformers."):
        return None
    head, decoder = base.get_output_embeddings(), getattr(base, "model", None)
    if type(head) is not torch.nn.Linear or decoder is None or hasattr(head.weight, "placements"):
        return None
    if any(m._forward_hooks or m._forward_pre_hooks or "forward" in vars(m) for m in {model, base, head}):
        return None
    return decoder, head.weight, head.bias


def trim_padding(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_ids: torch.Tensor,
                 completion_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Drop the prompt columns that are padding in every row (left) and the completion columns that are
    padding in every row (right); at least one prompt column stays (it predicts the first completion token).

    Position ids follow the attention mask and padded keys are masked out, so the remaining positions
    score exactly as before; the model simply computes nothing for the dropped columns.
    """
    real = prompt_mask.bool().any(dim=0).nonzero()
    first = int(real[0]) if len(real) else prompt_ids.shape[1] - 1
    used = completion_mask.bool().any(dim=0).nonzero()
    width = int(used[-1]) + 1 if len(used) else 0
    return prompt_ids[:, first:], prompt_mask[:, first:], completion_ids[:, :width], completion_mask[:, :width]


def completion_logps(model: Any, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                     completion_ids: torch.Tensor, completion_mask: torch.Tensor, temperature: float = 1.0,
                     *, with_entropy: bool = False, plain: bool = False, chunk_size: int = DEFAULT_LOGITS_CHUNK,
                     padding_free: bool | str = False):
    """log pi(y_t | x, y_<t) for every completion token: ``[N,T]`` (and the entropy ``[N,T]`` if asked).

    Logits are divided by ``temperature`` in fp32 (whatever the compute dtype) so the log-probs are those of
    the sampling distribution. Position ids follow the attention mask, as in ``generate`` with left padding.

    Unless ``plain``: all-padding columns are trimmed first (:func:`trim_padding`), and where the model's
    LM head is a plain linear map (:func:`lm_head_parts`) and ``chunk_size > 0``, the decoder's last hidden
    state at the real completion tokens goes through the head ``chunk_size`` positions at a time
    (:func:`grouprl.algo.lmhead.linear_log_softmax`): no ``[N,T,V]`` logits in the forward or the backward,
    and none computed for padding. Padding positions then hold 0 (log-prob and entropy); on the other paths
    only the trimmed columns do. Callers weight every position by a mask, so no value at padding is used.

    ``padding_free`` (the config field of the same name; on the chunked-head path only): ``True`` packs the
    sequences' real tokens into rows with per-sequence position ids (:mod:`grouprl.train.engine.packing`) where
    the model passes the packing probe; ``"auto"`` does so only where the packed rows' estimated cost
    (:func:`grouprl.train.engine.packing.row_cost`) is at most :data:`AUTO_PACK_RATIO` of the trimmed batch's;
    ``False`` never. The result is the same ``[N, T]``.
    """
    T = completion_ids.shape[1]
    if not plain:
        prompt_ids, prompt_mask, completion_ids, completion_mask = trim_padding(
            prompt_ids, prompt_mask, completion_ids, completion_mask)
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
    attention = torch.cat([prompt_mask, completion_mask], dim=1)
    position_ids = (attention.long().cumsum(-1) - 1).clamp(min=0)
    width = completion_ids.shape[1]
    head = None if plain or chunk_size <= 0 else lm_head_parts(model)
    if plain:
        logits = model(input_ids=input_ids, attention_mask=attention, position_ids=position_ids,
                       use_cache=False).logits
        logits = logits[:, -T - 1:-1].float() / temperature
        logp = torch.log_softmax(logits, dim=-1).gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)
    elif head is not None:
        hidden = _packed_hidden(model, head, prompt_ids, prompt_mask, completion_ids, completion_mask, padding_free)
        if hidden is None:
            hidden = head[0](input_ids=input_ids, attention_mask=attention, position_ids=position_ids,
                             use_cache=False).last_hidden_state[:, -width - 1:-1][completion_mask.bool()]
        return _chunked_head(head, hidden, completion_ids, completion_mask, temperature, chunk_size,
                             with_entropy, T)
    else:
        out = model(input_ids=input_ids, attention_mask=attention, position_ids=position_ids,
                    logits_to_keep=width + 1, use_cache=False)
        logits = out.logits[:, :-1].float() / temperature  # fp32: a bf16 division rounds every logit
        logp = _pad_right(selective_log_softmax(logits, completion_ids), T)
    if not with_entropy:
        return logp, None
    with torch.no_grad():
        entropy = entropy_from_logits(logits.detach())
    return logp, entropy if plain else _pad_right(entropy, T)


def _pad_right(x: torch.Tensor, T: int) -> torch.Tensor:
    return x if x.shape[1] == T else torch.nn.functional.pad(x, (0, T - x.shape[1]))


# "auto" packs a micro-batch when the packed rows' estimated cost (grouprl.train.engine.packing.row_cost: token
# positions, attention share added) is at most this fraction of the trimmed batch's (benchmarks/README.md,
# "Padding-free packing").
AUTO_PACK_RATIO = 0.95


def _packed_hidden(model, head, prompt_ids, prompt_mask, completion_ids, completion_mask, padding_free):
    """The decoder's last hidden state at the position predicting each real completion token ``[K, H]``
    (row-major order of ``completion_mask``) from packed rows, or None to take the padded path: packing
    off, not applicable (:func:`grouprl.train.engine.packing.pack`), not paying (``auto``), or unsupported."""
    if padding_free is False:
        return None
    decoder, weight = head[0], head[1]
    hidden_size = weight.shape[1]
    packed = packing.pack(prompt_ids, prompt_mask, completion_ids, completion_mask, hidden_size=hidden_size)
    if packed is None:
        return None
    padded_cost = packing.row_cost(prompt_ids.shape[0], prompt_ids.shape[1] + completion_ids.shape[1], hidden_size)
    if padding_free == "auto" and packed.cost > AUTO_PACK_RATIO * padded_cost:
        return None
    if not packing.packing_supported(decoder, model, weight.shape[0], prompt_ids.device):
        return None
    hidden = decoder(input_ids=packed.input_ids, position_ids=packed.position_ids, attention_mask=None,
                     use_cache=False).last_hidden_state
    return hidden.reshape(-1, hidden.shape[-1])[packed.predict_index]


def _chunked_head(head, hidden, completion_ids, completion_mask, temperature, chunk_size, with_entropy, T):
    """Log-probs (and entropy) of the real completion tokens from the hidden states predicting them
    (``hidden [K, H]``, row-major order of ``completion_mask``) through the head, scattered to ``[N, T]``."""
    _, weight, bias = head
    real = completion_mask.bool()
    device = hidden.device.type
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else weight.dtype
    lp, ent = linear_log_softmax(hidden, weight, completion_ids[real], bias=bias, temperature=temperature,
                                 chunk_size=chunk_size, compute_dtype=dtype, with_entropy=with_entropy)
    shape = (completion_ids.shape[0], T)
    logp = torch.zeros(shape, dtype=lp.dtype, device=lp.device).masked_scatter(_pad_right(real, T), lp)
    if not with_entropy:
        return logp, None
    return logp, torch.zeros(shape, dtype=ent.dtype, device=ent.device).masked_scatter(_pad_right(real, T), ent)


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


@torch.no_grad()
def batched_logps(model: Any, rows: list[MicroBatch], temperature: float, ctx: Any, *,
                  chunk_size: int = DEFAULT_LOGITS_CHUNK, padding_free: bool | str = False) -> list[torch.Tensor]:
    """log-probs of each micro-batch without gradient (reference or old policy), with dropout off; padding
    trimmed, the LM head chunked and the sequences packed as in :func:`completion_logps` (``chunk_size``,
    ``padding_free``).

    The model is put in eval mode for these forwards and back in the mode it was in afterwards.
    """
    was_training = model.training
    model.eval()
    try:
        return _logps(model, rows, temperature, ctx, chunk_size, padding_free)
    finally:
        model.train(was_training)


def _logps(model: Any, rows: list[MicroBatch], temperature: float, ctx: Any, chunk_size: int,
           padding_free: bool | str = False) -> list[torch.Tensor]:
    out = []
    for mb in rows:
        if mb.prompt_ids.shape[0] == 0:  # a micro-batch emptied by dropped groups
            out.append(torch.zeros(mb.completion_ids.shape, dtype=torch.float32, device=mb.completion_ids.device))
            continue
        with ctx():
            logp, _ = completion_logps(model, mb.prompt_ids, mb.prompt_mask, mb.completion_ids,
                                       mb.completion_mask, temperature, chunk_size=chunk_size,
                                       padding_free=padding_free)
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


def _accumulate_and_step(ctx: Any, ranks: Any, mbs: list[MicroBatch], spec: LossSpec, totals: dict[str, Any],
                         optimizer: Any, scheduler: Any, timers: Any):
    """grouprl's own step (one process, DDP, FSDP2): backward of every micro-batch, the SUM of the ranks'
    gradients, clipping by the global norm, then the optimizer and schedule unless the step is not finite.
    Returns ``(sums, grad_norm, finite_loss, skipped, lr)``."""
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
        ranks.sum_gradients(params)  # global loss = sum of rank losses: its gradient is the SUM over ranks
        max_norm = ctx.cfg.max_grad_norm if ctx.cfg.max_grad_norm > 0 else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        lr = scheduler.get_last_lr()[0]
        finite_loss = ranks.all_gather(bool(finite_loss)) == [True] * ranks.world  # one host sync per step
        skipped = not (finite_loss and bool(torch.isfinite(grad_norm)))
        if not skipped:
            optimizer.step()
            scheduler.step()
        optimizer.zero_grad(set_to_none=True)
    return acc, grad_norm, finite_loss, skipped, lr


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
        acc, grad_norm, finite_loss, skipped, lr = _accumulate_and_step(ctx, ranks, mbs, spec, totals, optimizer,
                                                                        scheduler, timers)
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
