"""vLLM as a token-in/token-out :class:`grouprl.rollout.engine.Engine`, for multi-turn rollouts.

One request per trajectory turn, each with its own token budget (``max_tokens``) and the chat template's
end-of-turn tokens as stop ids; the engine's log-prob of each sampled token comes back with it
(``logprobs=0``, ``logprobs_mode="processed_logprobs"``: after temperature, as the trainer scores).

- colocate: requests go straight into the in-process engine. When its ``llm_engine`` exposes
  ``add_request`` / ``step`` (vLLM's ``LLMEngine``), the engine is
  *continuous*: the per-trajectory scheduler adds a trajectory's next turn while the others decode
  (continuous batching), and ``step`` returns whatever finished. The engine wakes once per round
  (:meth:`VLLMEngine.session`) and sleeps after it, instead of once per engine call.
- server (``grouprl vllm-serve``): the ready turns go as one ``/generate`` request with per-request
  budgets (``max_new_tokens`` list); rank 0 holds the connection, so an agent run in server mode runs on
  one process (on N processes use colocate: one engine per rank).

Written by hand: the glue between the scheduler's requests and vLLM's request API; sampling, batching
and weight loading are vLLM's.
"""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from typing import Any

from grouprl.rollout.base import SamplingParams
from grouprl.rollout.engine import Engine, Generation, budgets_of
from grouprl.rollout.vllm_backend import ColocatedEngine, EngineError, ServerEngine, vllm_sampling_params


def to_row(completion: Any) -> dict:
    """A vLLM ``CompletionOutput`` as ``{"token_ids", "logprobs", "finish_reason"}`` (plain lists)."""
    ids = [int(t) for t in completion.token_ids]
    if not completion.logprobs:
        raise EngineError("the vLLM engine returned no log-probs; SamplingParams(logprobs=0) was set, so this "
                          "vLLM version is not supported. Fix: pip install -U 'grouprl[vllm]'.")
    logprobs = [float(completion.logprobs[t][tok].logprob) for t, tok in enumerate(ids)]
    reason = "length" if getattr(completion, "finish_reason", None) == "length" else "stop"
    return {"token_ids": ids, "logprobs": logprobs, "finish_reason": reason}


def engine_generate_each(llm: Any, vllm: Any, prompt_ids: list[list[int]], budgets: list[int], params: SamplingParams,
                         stop_ids: list[int]) -> list[dict]:
    """One completion per prompt, each with its own budget: ``[{"token_ids", "logprobs", "finish_reason"}]``."""
    sps = [vllm_sampling_params(vllm, replace(params, max_new_tokens=b), 1, stop_ids) for b in budgets]
    outputs = llm.generate([{"prompt_token_ids": ids} for ids in prompt_ids], sampling_params=sps, use_tqdm=False)
    return [to_row(out.outputs[0]) for out in outputs]


def _generation(row: dict) -> Generation:
    return Generation(list(row["token_ids"]), list(row["logprobs"]), row.get("finish_reason", "stop"))


class VLLMEngine(Engine):
    """The token engine of a :class:`grouprl.rollout.vllm_backend.VLLMBackend` (its engine, its weights)."""

    def __init__(self, backend: Any, stop_ids: list[int]) -> None:
        super().__init__(backend.model, backend.tokenizer)
        self.backend, self.stop_ids = backend, sorted(set(stop_ids))
        inner = backend.engine
        if inner is None:
            raise EngineError(f"rank {backend.rank} has no vLLM engine: in vllm_mode=server rank 0 alone talks to "
                              f"the server, so multi-turn rollouts in server mode run on one process. Fix: "
                              f"vllm_mode: colocate (one engine per rank), or one process.")
        self.inner = inner
        step_api = getattr(getattr(inner, "llm", None), "llm_engine", None)
        self.continuous = isinstance(inner, ColocatedEngine) and all(
            hasattr(step_api, m) for m in ("add_request", "step"))

    def sync_weights(self, model: Any) -> None:
        self.backend.sync_weights(model)
        self.model = model

    def _ensure_synced(self) -> None:
        if not self.backend._synced:  # the engine loaded the weights on disk; the trainer's may differ
            self.backend.sync_weights(self.backend.model)

    def session(self):
        import contextlib

        inner = self.inner

        @contextlib.contextmanager
        def awake():
            if isinstance(inner, ColocatedEngine):
                inner._wake(["weights", "kv_cache"])
            try:
                yield
            finally:
                if isinstance(inner, ColocatedEngine) and inner.sleep_between:
                    inner._sleep()

        return awake()

    def generate(self, prompt_ids, max_new_tokens, sampling):
        self._ensure_synced()
        budgets = budgets_of(max_new_tokens, len(prompt_ids))
        inner = self.inner
        if isinstance(inner, ColocatedEngine):
            inner._wake(["weights", "kv_cache"])
            rows = engine_generate_each(inner.llm, inner.vllm, prompt_ids, budgets, sampling, self.stop_ids)
        elif isinstance(inner, ServerEngine):
            body = json.dumps({"prompt_ids": prompt_ids, "n": 1, "params": asdict(sampling),
                               "max_new_tokens": budgets, "eos_ids": self.stop_ids})
            rows = [c[0] for c in inner._request("POST", "/generate", body.encode())["completions"]]
        else:  # an injected engine (tests): its own generate_each
            rows = inner.generate_each(prompt_ids, budgets, sampling, self.stop_ids)
        if len(rows) != len(prompt_ids):
            raise EngineError(f"the vLLM engine returned {len(rows)} completions for {len(prompt_ids)} prompts.")
        return [_generation(r) for r in rows]

    # ---- continuous batching (colocate): requests join the running batch --------------------------
    def add_request(self, request_id: str, prompt_ids: list[int], max_new_tokens: int, sampling: SamplingParams) -> None:
        self._ensure_synced()
        inner = self.inner
        inner._wake(["weights", "kv_cache"])
        sp = vllm_sampling_params(inner.vllm, replace(sampling, max_new_tokens=max_new_tokens), 1, self.stop_ids)
        inner.llm.llm_engine.add_request(str(request_id), {"prompt_token_ids": list(prompt_ids)}, sp)

    def step(self) -> list[tuple[str, Generation]]:
        outs = self.inner.llm.llm_engine.step()
        return [(str(o.request_id), _generation(to_row(o.outputs[0]))) for o in outs if o.finished]
