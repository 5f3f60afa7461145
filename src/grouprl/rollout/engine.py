"""The token-in/token-out engine interface every rollout can run on, and its built-in implementations.

``Engine.generate(prompt_ids, max_new_tokens, sampling) -> list[Generation]``: one prompt id list per
request, one token budget per request (or one for all), decoding settings
(:class:`grouprl.rollout.base.SamplingParams`). Each :class:`Generation` holds the sampled ids (the
stop token included when one was sampled), the engine's log-prob of each sampled token and the finish
reason. Token ids are never re-derived from text: the multi-turn rollout appends these ids as they are
(DESIGN.md, "The record that flows"), and the log-probs travel with them as ``rollout_logp``.

An engine that can take new requests while others are running (vLLM's continuous batching) also
implements ``add_request(request_id, prompt_ids, max_new_tokens, sampling)``, ``step() -> [(request_id,
Generation)]`` (the requests that finished in this step, in any order), and sets ``continuous = True``; the per-trajectory scheduler (``grouprl.rollout.schedule``) then adds a
trajectory's next turn the moment its tools return.

Implementations: :class:`TransformersEngine` (``model.generate`` or the lean CPU sampler over the
training weights), ``grouprl.rollout.vllm_engine.VLLMEngine`` (colocated or ``grouprl vllm-serve``), and
any ``rollout_backend: package.module:Class`` whose class subclasses :class:`Engine` (docs/EXTENDING.md,
"A rollout engine"). :class:`EngineBackend` runs single-turn rounds on any engine.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from grouprl.rollout.base import Rollout, SamplingParams

FINISH_REASONS = ("stop", "length")


@dataclass
class Generation:
    """One sampled continuation: ``token_ids`` (the stop token last when ``finish_reason == "stop"``),
    ``logprobs`` (the engine's log-prob of each sampled token, as many as ids; ``None`` = not reported),
    ``finish_reason``: ``stop`` (a stop token was sampled) or ``length`` (the budget ran out)."""

    token_ids: list[int]
    logprobs: list[float] | None = None
    finish_reason: str = "stop"

    def check(self) -> None:
        if self.finish_reason not in FINISH_REASONS:
            raise ValueError(f"Generation.finish_reason={self.finish_reason!r}; known: {', '.join(FINISH_REASONS)}")
        if self.logprobs is not None and len(self.logprobs) != len(self.token_ids):
            raise ValueError(f"Generation: {len(self.logprobs)} log-probs for {len(self.token_ids)} token ids")


class Engine:
    """Base class of token-in/token-out engines (subclass it for a ``rollout_backend`` plug-in).

    ``trainer_is_sampler``: the trainer's own weights sample (the transformers path in fp32), so its
    log-probs are the trainer's and do not travel as ``rollout_logp``; an engine with its own copy of the
    weights (vLLM, a remote server, a scripted policy) leaves it False. ``shared_engine``: one engine
    serves every rank (a server); rank 0 alone drives it (``grouprl.train.algorithms.rounds.generate``).
    """

    trainer_is_sampler = False
    shared_engine = False
    continuous = False

    def __init__(self, model: Any = None, tokenizer: Any = None) -> None:
        self.model, self.tokenizer = model, tokenizer

    def generate(self, prompt_ids: list[list[int]], max_new_tokens: list[int] | int,
                 sampling: SamplingParams) -> list[Generation]:
        """A continuous engine's default: add every request, step until all finished."""
        if not self.continuous:
            raise NotImplementedError(f"{type(self).__name__}.generate(prompt_ids, max_new_tokens, sampling)")
        budgets = budgets_of(max_new_tokens, len(prompt_ids))
        rids = [f"batch-{k}" for k in range(len(prompt_ids))]
        for rid, ids, budget in zip(rids, prompt_ids, budgets):
            self.add_request(rid, ids, budget, sampling)
        done: dict = {}
        while len(done) < len(rids):
            done.update(self.step())
        return [done[rid] for rid in rids]

    def sync_weights(self, model: Any) -> None:
        """Take the trainer's current weights (called once per generation round, before generating)."""
        self.model = model

    def session(self) -> contextlib.AbstractContextManager:
        """A context held around one rollout round (vLLM colocate: awake inside, asleep after)."""
        return contextlib.nullcontext()


def budgets_of(max_new_tokens: list[int] | int, n: int) -> list[int]:
    return [int(max_new_tokens)] * n if isinstance(max_new_tokens, int) else [int(b) for b in max_new_tokens]


def finish(ids: list[int], logprobs: list[float] | None, budget: int, stops: set[int]) -> Generation:
    """``ids`` cut at ``budget`` and after the first stop token, with its finish reason."""
    ids = list(ids)[:budget]
    end = next((k + 1 for k, t in enumerate(ids) if t in stops), None)
    cut = len(ids) if end is None else end
    lp = None if logprobs is None else [float(x) for x in list(logprobs)[:cut]]
    return Generation(ids[:cut], lp, "length" if end is None else "stop")


class FunctionEngine(Engine):
    """An engine over a plain ``fn(prompt_id_lists, budgets, sampling) -> id lists`` (no log-probs)."""

    def __init__(self, fn: Callable, stop_ids: list[int]) -> None:
        super().__init__()
        self.fn, self.stops = fn, set(stop_ids)

    def generate(self, prompt_ids, max_new_tokens, sampling):
        budgets = budgets_of(max_new_tokens, len(prompt_ids))
        outs = self.fn(prompt_ids, budgets, sampling)
        if len(outs) != len(prompt_ids):
            raise ValueError(f"multi-turn rollout: generate_fn returned {len(outs)} rows for "
                             f"{len(prompt_ids)} prompts; it must return one id list per prompt")
        gens = []
        for out, b in zip(outs, budgets):  # cut at the budget only: the rollout reads the last token
            ids = list(out)[:b]
            gens.append(Generation(ids, None, "stop" if ids and ids[-1] in self.stops else "length"))
        return gens


class TransformersEngine(Engine):
    """Left-padded batched sampling over the training model: ``model.generate`` with a KV cache, or the
    lean CPU sampler (:func:`grouprl.rollout.lean.lean_sample`, the same tokens / distribution) where it
    supports the model. ``lean``: ``None`` = on the CPU only (as ``lean_sampler`` in a recipe).

    Rows are cut at their own budget and after their first stop token (the tokenizer's EOS, the model's
    EOS ids and the chat template's end-of-turn tokens). Log-probs are of ``log_softmax(logits /
    temperature)`` (temperature 0 scores at 1), as the trainer computes them.
    """

    trainer_is_sampler = True

    def __init__(self, model: Any, tokenizer: Any, *, lean: bool | None = None, stop_ids: list[int] | None = None) -> None:
        from grouprl.rollout.chat import stop_token_ids
        from grouprl.rollout.hf import eos_token_ids

        super().__init__(model, tokenizer)
        self.lean = lean
        self.stops = sorted(set(stop_ids) if stop_ids else
                            set(eos_token_ids(model, tokenizer)) | set(stop_token_ids(tokenizer)))
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.stops[0]

    def _sample(self, ids: Any, mask: Any, params: SamplingParams) -> tuple[list[list[int]], list[list[float]]]:
        import torch

        from grouprl.rollout.hf import generation_config, use_lean_sampler
        from grouprl.rollout.lean import lean_sample, unsupported_reason

        model = self.model
        if use_lean_sampler(self.lean, ids.device.type) and unsupported_reason(model) is None:
            out, logp = lean_sample(model, ids, mask, 1, max_new_tokens=params.max_new_tokens,
                                    temperature=params.temperature, top_k=params.top_k, top_p=params.top_p,
                                    eos_token_ids=self.stops, pad_token_id=self.pad_id, return_logp=True)
            return out.tolist(), logp.tolist()
        cfg = generation_config(params, self.pad_id, self.stops)
        cfg.return_dict_in_generate, cfg.output_logits = True, True
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                out = model.generate(input_ids=ids, attention_mask=mask, generation_config=cfg)
        finally:
            model.train(was_training)
        sampled = out.sequences[:, ids.shape[1]:]
        logits = torch.stack(out.logits, dim=1).float()  # [N, t, V], before the logits processors
        scale = params.temperature if params.temperature not in (0, 1.0) else 1.0
        logp = torch.log_softmax(logits / scale, dim=-1).gather(-1, sampled[..., None]).squeeze(-1)
        return sampled.tolist(), logp.tolist()

    def generate(self, prompt_ids, max_new_tokens, sampling):
        import torch

        n = len(prompt_ids)
        budgets = budgets_of(max_new_tokens, n)
        width = max(len(ids) for ids in prompt_ids)
        ids = torch.full((n, width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((n, width), dtype=torch.long)
        for i, row in enumerate(prompt_ids):
            ids[i, width - len(row):] = torch.tensor(row, dtype=torch.long)
            mask[i, width - len(row):] = 1
        base = sampling if sampling is not None else SamplingParams(max_new_tokens=max(budgets))
        device = next(self.model.parameters()).device
        rows, logps = self._sample(ids.to(device), mask.to(device), replace(base, max_new_tokens=max(budgets)))
        stops = set(self.stops)
        return [finish(row, lp, b, stops) for row, lp, b in zip(rows, logps, budgets)]


def is_engine_class(obj: Any) -> bool:
    return isinstance(obj, type) and issubclass(obj, Engine)


class EngineBackend:
    """A single-turn backend (``generate(prompts, n, params) -> Rollout``) over any :class:`Engine`: each
    prompt is tokenized (left truncation at ``max_prompt_length``), repeated ``n`` times (rows grouped),
    and the engine's log-probs become ``rollout_logp`` unless the trainer is the sampler."""

    def __init__(self, engine: Engine, tokenizer: Any) -> None:
        from grouprl.rollout.hf import eos_token_ids

        self.engine, self.tokenizer = engine, tokenizer
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        self.eos_ids = eos_token_ids(engine.model, tokenizer) if engine.model is not None else [tokenizer.eos_token_id]
        self.shared_engine = engine.shared_engine

    @property
    def model(self) -> Any:
        return self.engine.model

    def sync_weights(self, model: Any) -> None:
        self.engine.sync_weights(model)

    def generate(self, prompts: list[str], n: int, params: SamplingParams) -> Rollout:
        import torch

        from grouprl.rollout.hf import completion_mask_from_ids, tokenize_left

        ids, mask = tokenize_left(self.tokenizer, prompts, params.max_prompt_length)
        lists = [row[m.bool()].tolist() for row, m in zip(ids, mask) for _ in range(n)]
        with self.engine.session():
            gens = self.engine.generate(lists, params.max_new_tokens, params)
        if len(gens) != len(lists):
            raise ValueError(f"{type(self.engine).__name__}.generate returned {len(gens)} generations for "
                             f"{len(lists)} prompts; it must return one per prompt")
        pad, T = self.tokenizer.pad_token_id, max(1, max(len(g.token_ids) for g in gens))
        completion_ids = torch.full((len(gens), T), pad, dtype=torch.long)
        logp = torch.zeros((len(gens), T), dtype=torch.float32)
        with_logp = not self.engine.trainer_is_sampler and all(g.logprobs is not None for g in gens)
        for i, g in enumerate(gens):
            completion_ids[i, :len(g.token_ids)] = torch.tensor(g.token_ids, dtype=torch.long)
            if with_logp:
                logp[i, :len(g.token_ids)] = torch.tensor(g.logprobs, dtype=torch.float32)
        completion_mask, truncated = completion_mask_from_ids(completion_ids, self.eos_ids)
        completion_ids = completion_ids.masked_fill(completion_mask == 0, pad)
        lengths = completion_mask.sum(dim=1).tolist()
        texts = self.tokenizer.batch_decode([r[:int(k)].tolist() for r, k in zip(completion_ids, lengths)],
                                            skip_special_tokens=True)
        device = next(self.model.parameters()).device if self.model is not None else "cpu"
        return Rollout(ids.repeat_interleave(n, 0).to(device), mask.repeat_interleave(n, 0).to(device),
                       completion_ids.to(device), completion_mask.to(device), truncated.to(device), texts,
                       [p for p in prompts for _ in range(n)],
                       rollout_logp=logp.masked_fill(completion_mask == 0, 0.0).to(device) if with_logp else None)
