"""A fake ``vllm`` package for CPU tests: the parts of ``vllm.LLM`` grouprl calls, backed by a tiny
transformers model that is a SEPARATE copy of the weights (so a missing weight sync shows).

``LLM.generate`` samples token by token from its copy, at the request's temperature, and reports each sampled
token's log-prob plus ``LOGP_OFFSET`` (0 = the engine agrees with the trainer; -1.0 = the engine's log-probs
are 1 nat lower everywhere, so exp(old_logp - rollout_logp) = e). ``EVENTS`` records every call that matters
(sleep, wake_up, load_weights, reset_prefix_cache, generate, step) in order.

Requests given one ``SamplingParams`` each (a list: the multi-turn path) and requests added to
``llm_engine`` (``add_request`` / ``step``: continuous batching) draw from a generator of their own, seeded
by the prompt's ids and how many times this engine has seen that prompt: what a request samples does not
depend on which requests share its batch, or on the order they arrive. ``llm_engine.step`` advances every
running request by one token and returns the finished ones in REVERSE order of arrival (out of order).
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field
from typing import Any

import torch

LOGP_OFFSET = 0.0
SCRIPT = None  # fn(prompt ids) -> the ids to emit (teacher-forced, scored by the engine's copy), or None
EVENTS: list[tuple] = []
INSTANCES: list[LLM] = []


def install(monkeypatch, offset: float = 0.0, script: Any = None) -> types.ModuleType:
    """Put this module in ``sys.modules["vllm"]`` (undone by ``monkeypatch``) and reset its state.
    ``script(prompt_ids) -> ids``: emit these ids instead of sampling (each scored by the engine's copy)."""
    import sys

    module = sys.modules[__name__]
    module.LOGP_OFFSET = offset
    module.SCRIPT = script
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
        self.llm_engine = StepEngine(self)
        self.llm_engine.model_executor = types.SimpleNamespace(driver_worker=types.SimpleNamespace(model_runner=runner))
        self.llm_engine.model_config = types.SimpleNamespace(dtype=torch.float32)
        self.seed = int(kwargs.get("seed", 0))
        self.generator = torch.Generator().manual_seed(self.seed)
        self.seen: dict[tuple, int] = {}  # prompt ids -> requests seen (per-request generators)
        self.asleep: set[str] = set()
        INSTANCES.append(self)

    def request_generator(self, prompt: list[int]) -> torch.Generator:
        """A generator of this request's own: seeded by the prompt and its occurrence count."""
        import zlib

        k = self.seen[tuple(prompt)] = self.seen.get(tuple(prompt), -1) + 1
        key = zlib.crc32(",".join(map(str, [self.seed, k, *prompt])).encode())
        return torch.Generator().manual_seed(key)

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
        if isinstance(sampling_params, list):  # one SamplingParams per prompt, n = 1 each
            EVENTS.append(("generate", len(prompts), 1))
            return [RequestOutput(p["prompt_token_ids"], [self._sample(p["prompt_token_ids"], sp, self.request_generator(
                p["prompt_token_ids"]))]) for p, sp in zip(prompts, sampling_params)]
        EVENTS.append(("generate", len(prompts), sampling_params.n))
        return [RequestOutput(p["prompt_token_ids"], [self._sample(p["prompt_token_ids"], sampling_params)
                                                      for _ in range(sampling_params.n)]) for p in prompts]

    def _next(self, prompt: list[int], out: list[int], sp: SamplingParams, generator: torch.Generator) -> tuple[int, float]:
        logits = self.model.hf(input_ids=torch.tensor([prompt + out])).logits[0, -1].float()
        logp = torch.log_softmax(logits / (sp.temperature or 1.0), dim=-1)
        if SCRIPT is not None:
            forced = SCRIPT(list(prompt))
            tok = forced[len(out)] if len(out) < len(forced) else sp.stop_token_ids[0]
        elif sp.temperature > 0:
            tok = int(torch.multinomial(logp.exp(), 1, generator=generator))
        else:
            tok = int(logp.argmax())
        return tok, float(logp[tok]) + LOGP_OFFSET

    def _sample(self, prompt: list[int], sp: SamplingParams, generator: torch.Generator | None = None) -> CompletionOutput:
        ids, out, lps = list(prompt), [], []
        for _ in range(sp.max_tokens):
            tok, lp = self._next(list(prompt), out, sp, generator or self.generator)
            ids.append(tok)
            out.append(tok)
            lps.append({tok: Logprob(lp)})
            if tok in sp.stop_token_ids:
                return CompletionOutput(out, lps, "stop")
        return CompletionOutput(out, lps, "length")


@dataclass
class _Running:
    request_id: str
    prompt: list[int]
    sp: SamplingParams
    generator: torch.Generator
    out: list[int] = field(default_factory=list)
    lps: list[dict] = field(default_factory=list)


@dataclass
class StepOutput:
    request_id: str
    outputs: list[CompletionOutput]
    finished: bool = True


class StepEngine:
    """``LLM.llm_engine``: vLLM's request-level API (``add_request``, ``step``, ``get_num_unfinished_requests``)."""

    def __init__(self, llm: LLM) -> None:
        self.llm = llm
        self.running: list[_Running] = []
        self.max_running = 0  # most requests decoding at once (continuous batching shows as > 1)

    def add_request(self, request_id: str, prompt: dict, params: SamplingParams) -> None:
        if self.llm.asleep:
            raise RuntimeError(f"fake vllm: add_request while {sorted(self.llm.asleep)} sleep")
        ids = list(prompt["prompt_token_ids"])
        self.running.append(_Running(request_id, ids, params, self.llm.request_generator(ids)))

    def get_num_unfinished_requests(self) -> int:
        return len(self.running)

    @torch.no_grad()
    def step(self) -> list[StepOutput]:
        EVENTS.append(("step", len(self.running)))
        self.max_running = max(self.max_running, len(self.running))
        finished = []
        for r in self.running:
            tok, lp = self.llm._next(r.prompt, r.out, r.sp, r.generator)
            r.out.append(tok)
            r.lps.append({tok: Logprob(lp)})
            if tok in r.sp.stop_token_ids or len(r.out) >= r.sp.max_tokens:
                reason = "stop" if tok in r.sp.stop_token_ids else "length"
                finished.append(StepOutput(r.request_id, [CompletionOutput(r.out, r.lps, reason)]))
        self.running = [r for r in self.running if r.request_id not in {f.request_id for f in finished}]
        return finished[::-1]
