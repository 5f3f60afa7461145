"""Rollouts with transformers ``generate``: all B*n completions in one batched call with a KV cache."""

from __future__ import annotations

from typing import Any

from grouprl.rollout.base import Rollout, SamplingParams


def eos_token_ids(model: Any, tokenizer: Any) -> list[int]:
    """Every id that ends a completion: the generation config's EOS ids plus the tokenizer's."""
    ids: set[int] = set()
    gen_cfg = getattr(model, "generation_config", None)
    raw = getattr(gen_cfg, "eos_token_id", None)
    for value in raw if isinstance(raw, (list, tuple)) else [raw]:
        if value is not None:
            ids.add(int(value))
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return sorted(ids)


def completion_mask_from_ids(completion_ids: Any, eos_ids: list[int]):
    """mask [N,T] = 1 up to and including the first EOS; truncated [N] = no EOS at all."""
    import torch

    is_eos = torch.isin(completion_ids, torch.tensor(eos_ids, device=completion_ids.device))
    T = completion_ids.shape[1]
    has_eos = is_eos.any(dim=1)
    first = torch.where(has_eos, is_eos.int().argmax(dim=1), torch.full_like(has_eos, T, dtype=torch.long))
    positions = torch.arange(T, device=completion_ids.device).unsqueeze(0)
    mask = (positions <= first.unsqueeze(1)).long()
    return mask, ~has_eos


def generation_config(params: SamplingParams, pad_id: int, eos_ids: list[int]):
    """A complete GenerationConfig: nothing is inherited from the model's or the library's defaults.

    ``top_k`` is always given: left unset, transformers samples from the top 50 tokens only, and the
    rollouts would no longer come from the softmax whose log-probs the loss uses (an off-policy bias).
    """
    from transformers import GenerationConfig

    sample = params.temperature > 0
    return GenerationConfig(
        max_new_tokens=params.max_new_tokens,
        min_new_tokens=params.min_new_tokens or None,
        do_sample=sample,
        temperature=params.temperature if sample else None,
        top_p=params.top_p if sample else None,
        top_k=params.top_k if sample else None,  # 0 = no top-k filtering
        pad_token_id=pad_id,
        eos_token_id=eos_ids,
        use_cache=True,
    )


def use_lean_sampler(choice: bool | None, device_type: str) -> bool:
    """Whether to try ``rollout.lean.lean_sample``: ``choice`` when given, else only on the CPU.

    The lean sampler is the CPU fast path (tested there to sample exactly what ``generate`` samples); on a
    GPU ``model.generate`` is the default, since the lean path has not been validated there.
    """
    return choice if choice is not None else device_type == "cpu"


def tokenize_left(tok: Any, prompts: list[str], max_prompt_length: int | None):
    """Left-padded prompt ids and mask, cut from the left at ``max_prompt_length`` (the prompt's end, next to
    the completion, is what matters)."""
    old_side, old_trunc = tok.padding_side, getattr(tok, "truncation_side", "left")
    tok.padding_side, tok.truncation_side = "left", "left"
    try:
        enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False,
                  truncation=max_prompt_length is not None, max_length=max_prompt_length)
    finally:
        tok.padding_side, tok.truncation_side = old_side, old_trunc
    return enc["input_ids"], enc["attention_mask"]


class TransformersBackend:
    """``generate(prompts, n, params)`` with the training model itself (no weight copy to sync).

    ``lean``: use ``rollout.lean.lean_sample`` where it reproduces ``generate`` (see lean.py); ``None`` =
    on the CPU only (``use_lean_sampler``), ``True`` / ``False`` force it on / off.
    ``rollout_dtype``: ``bfloat16`` = the lean sampler runs on a bf16 copy of the weights, made at most once
    per ``sync_weights`` (once per generation round), and each ``Rollout`` carries the sampler's own
    ``rollout_logp`` for the mismatch correction; ``auto`` / ``float32`` = the trainer's weights.
    """

    def __init__(self, model: Any, tokenizer: Any, lean: bool | None = None, rollout_dtype: str = "auto") -> None:
        self.model = model
        self.lean = lean
        self.rollout_dtype = rollout_dtype
        self._copy = None  # the bf16 weight copy of the current round (rollout.lean.copy_weights)
        self.copies_made = 0
        self.tokenizer = tokenizer
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        self.eos_ids = eos_token_ids(model, tokenizer)

    def sync_weights(self, model: Any) -> None:
        self.model = model
        self._copy = None  # the next generate copies the new weights

    def _sampler_weights(self):
        """The bf16 copy for this round (made on first use after ``sync_weights``), or None (own weights)."""
        import torch

        from grouprl.rollout.lean import copy_weights

        if self.rollout_dtype != "bfloat16":
            return None
        if self._copy is None:
            self._copy = copy_weights(self.model, torch.bfloat16)
            self.copies_made += 1
        return self._copy

    def tokenize_prompts(self, prompts: list[str], max_prompt_length: int | None):
        return tokenize_left(self.tokenizer, prompts, max_prompt_length)

    def generate(self, prompts: list[str], n: int, params: SamplingParams) -> Rollout:
        import torch

        from grouprl.rollout.lean import lean_sample, unsupported_reason

        device = next(self.model.parameters()).device
        ids, mask = self.tokenize_prompts(prompts, params.max_prompt_length)
        ids, mask = ids.to(device), mask.to(device)
        low = self.rollout_dtype == "bfloat16"
        lean = use_lean_sampler(True if low and self.lean is None else self.lean, device.type)
        reason = unsupported_reason(self.model, torch.bfloat16 if low else None)
        if low and (not lean or reason is not None):
            raise RuntimeError(f"rollout_dtype='bfloat16' needs the lean sampler, which cannot run here "
                               f"({reason or 'lean_sampler=false'}). Fix: rollout_dtype: auto.")
        if lean and reason is None:
            # same tokens / distribution as generate, ~3x less CPU for small models (benchmarks/README.md)
            out = lean_sample(self.model, ids, mask, n, max_new_tokens=params.max_new_tokens,
                              min_new_tokens=params.min_new_tokens, temperature=params.temperature,
                              top_k=params.top_k, top_p=params.top_p, eos_token_ids=self.eos_ids,
                              pad_token_id=self.tokenizer.pad_token_id, weights=self._sampler_weights(),
                              return_logp=low)
            completion_ids, logp = out if low else (out, None)
            rows_ids, rows_mask = ids.repeat_interleave(n, dim=0), mask.repeat_interleave(n, dim=0)
            return self._rollout(prompts, n, rows_ids, rows_mask, completion_ids, logp)
        ids, mask = ids.repeat_interleave(n, dim=0), mask.repeat_interleave(n, dim=0)
        gen_cfg = generation_config(params, self.tokenizer.pad_token_id, self.eos_ids)
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                out = self.model.generate(input_ids=ids, attention_mask=mask, generation_config=gen_cfg)
        finally:
            self.model.train(was_training)
        completion_ids = out[:, ids.shape[1]:]  # generate emits >= 1 token (max_new_tokens >= 1)
        return self._rollout(prompts, n, ids, mask, completion_ids)

    def _rollout(self, prompts: list[str], n: int, ids: Any, mask: Any, completion_ids: Any,
                 rollout_logp: Any = None) -> Rollout:
        """Masks, padding after EOS and decoded text for ``completion_ids [N,T]`` of prompt rows ``ids``
        (``rollout_logp [N,T]``: the sampler's own log-probs, 0 where the mask is 0)."""
        completion_mask, truncated = completion_mask_from_ids(completion_ids, self.eos_ids)
        completion_ids = completion_ids.masked_fill(completion_mask == 0, self.tokenizer.pad_token_id)
        lengths = completion_mask.sum(dim=1).tolist()
        texts = self.tokenizer.batch_decode(
            [row[:length].tolist() for row, length in zip(completion_ids, lengths)], skip_special_tokens=True
        )
        if rollout_logp is not None:
            rollout_logp = rollout_logp.masked_fill(completion_mask == 0, 0.0)
        return Rollout(ids, mask, completion_ids, completion_mask, truncated, texts,
                       [p for p in prompts for _ in range(n)], rollout_logp=rollout_logp)
