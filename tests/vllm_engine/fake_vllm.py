"""A fake ``vllm`` package for CPU tests: the parts of ``vllm.LLM`` grouprl calls, backed by a tiny
transformers model that is a SEPARATE copy of the weights (so a missing weight sync shows).

``LLM.generate`` samples token by token from its copy, at the request's temperature, and reports each sampled
token's log-prob plus ``LOGP_OFFSET`` (0 = the engine agrees with the trainer; -1.0 = the engine's log-probs
are 1 nat lower everywhere, so exp(old_logp - rollout_logp) = e). ``EVENTS`` records every call that matters
(sleep, wake_up, load_weights, reset_prefix_cache, generate) in order.
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field
from typing import Any

import torch

LOGP_OFFSET = 0.0
EVENTS: list[tuple] = []
INSTANCES: list[LLM] = []


def install(monkeypatch, offset: float = 0.0) -> types.ModuleType:
    """Put this module in ``sys.modules["vllm"]`` (undone by ``monkeypatch``) and reset its state."""
    import sys

    module = sys.modules[__name__]
    module.LOGP_OFFSET = offset
    EVENTS.clear()
    INSTANCES.clear()
    monkeypatch.setitem(sys.modules, "vllm", module)
    return module


class SamplingParams:
    def __init__(self, **kwargs: Any) -> None:
        self.__dict__.update(kwargs)


@dataclass
class Logprob:
    logprob: float


@dataclass
class CompletionOutput:
    token_ids: list[int]
    logprobs: list[dict[int, Logprob]]
    finish_reason: str


@dataclass
class RequestOutput:
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=list)


class _Model:
    """What ``driver_worker.model_runner.model`` is in vLLM: here, only ``load_weights``."""

    def __init__(self, hf_model: Any) -> None:
        self.hf = hf_model

    def load_weights(self, weights: Any) -> set[str]:
        params = dict(self.hf.named_parameters())
        loaded = set()
        with torch.no_grad():
            for name, tensor in weights:
                params[name].copy_(tensor)
                loaded.add(name)
        EVENTS.append(("load_weights", len(loaded)))
        return loaded


class LLM:
    def __init__(self, model: str, **kwargs: Any) -> None:
        from transformers import AutoModelForCausalLM

        self.kwargs = {"model": model, **kwargs}
        hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
        self.model = _Model(hf)
        runner = types.SimpleNamespace(model=self.model)
        self.llm_engine = types.SimpleNamespace(
            model_executor=types.SimpleNamespace(driver_worker=types.SimpleNamespace(model_runner=runner)),
            model_config=types.SimpleNamespace(dtype=torch.float32))
        self.generator = torch.Generator().manual_seed(int(kwargs.get("seed", 0)))
        self.asleep: set[str] = set()
        INSTANCES.append(self)

    def sleep(self, level: int = 1) -> None:
        EVENTS.append(("sleep", level))
        self.asleep = {"weights", "kv_cache"}

    def wake_up(self, tags: list[str] | None = None) -> None:
        tags = list(tags or ["weights", "kv_cache"])
        if set(tags) - self.asleep:
            raise RuntimeError(f"fake vllm: wake_up({tags}) of memory that is awake")
        EVENTS.append(("wake_up", tuple(tags)))
        self.asleep -= set(tags)

    def reset_prefix_cache(self) -> None:
        EVENTS.append(("reset_prefix_cache",))

    @torch.no_grad()
    def generate(self, prompts: list[dict], sampling_params: SamplingParams, use_tqdm: bool = True) -> list:
        if self.asleep:
            raise RuntimeError(f"fake vllm: generate while {sorted(self.asleep)} sleep")
        EVENTS.append(("generate", len(prompts), sampling_params.n))
        return [RequestOutput(p["prompt_token_ids"], [self._sample(p["prompt_token_ids"], sampling_params)
                                                      for _ in range(sampling_params.n)]) for p in prompts]

    def _sample(self, prompt: list[int], sp: SamplingParams) -> CompletionOutput:
        ids, out, lps = list(prompt), [], []
        for _ in range(sp.max_tokens):
            logits = self.model.hf(input_ids=torch.tensor([ids])).logits[0, -1].float()
            logp = torch.log_softmax(logits / (sp.temperature or 1.0), dim=-1)
            if sp.temperature > 0:
                tok = int(torch.multinomial(logp.exp(), 1, generator=self.generator))
            else:
                tok = int(logp.argmax())
            ids.append(tok)
            out.append(tok)
            lps.append({tok: Logprob(float(logp[tok]) + LOGP_OFFSET)})
            if tok in sp.stop_token_ids:
                return CompletionOutput(out, lps, "stop")
        return CompletionOutput(out, lps, "length")
