"""The multi-turn part of ``benchmarks/gpu_check.py``: one agent round on the vLLM token engine, checked.

``agent_round_check(model_dir, url, group)`` runs 8 calculator prompts x ``group`` trajectories
(``max_turns`` 2, 64 tokens) with ``grouprl.rollout.agent_round`` on a ``VLLMBackend`` (colocate when
``url`` is None, else the ``grouprl vllm-serve`` at ``url``), recording every request the engine served,
and returns JSON figures: end reasons and tool calls; ``segments_not_engine_ids`` (model segments of the
trajectories that are not, token for token, an engine output for exactly the ids before them: must be 0);
``mask_errors`` (tokens whose loss mask disagrees with who wrote them: must be 0); the engine/trainer
log-prob gap on model tokens (mean and max of |rollout_logp - logp|, the trainer's logp from an fp32
forward of the same ids); and the engine's tokens/s over the round.
"""

from __future__ import annotations

from typing import Any

import torch

from grouprl.rollout.engine import Engine

AGENT_TOKENS, AGENT_PROMPTS = 64, 8


class Recording(Engine):
    """Delegates to ``inner`` and records ``(prompt ids, Generation)`` of every request it served."""

    def __init__(self, inner: Engine) -> None:
        super().__init__(inner.model, inner.tokenizer)
        self.inner, self.continuous, self.trainer_is_sampler = inner, inner.continuous, inner.trainer_is_sampler
        self.served: list[tuple[tuple, Any]] = []
        self.pending: dict[str, list[int]] = {}

    def session(self):
        return self.inner.session()

    def generate(self, prompt_ids, max_new_tokens, sampling):
        gens = self.inner.generate(prompt_ids, max_new_tokens, sampling)
        self.served += [(tuple(p), g) for p, g in zip(prompt_ids, gens)]
        return gens

    def add_request(self, request_id, prompt_ids, max_new_tokens, sampling):
        self.pending[request_id] = list(prompt_ids)
        self.inner.add_request(request_id, prompt_ids, max_new_tokens, sampling)

    def step(self):
        out = self.inner.step()
        self.served += [(tuple(self.pending.pop(rid)), g) for rid, g in out]
        return out


def _segment_errors(traj: Any, served: dict[tuple, list]) -> tuple[int, int]:
    """(model segments that are not an engine output for the ids before them, mask errors)."""
    bad = mask_errors = pos = 0
    ids, mask = traj.completion_ids, traj.loss_mask
    while pos < len(ids):
        outs = served.get(tuple(traj.prompt_ids + ids[:pos]), [])
        match = next((g for g in outs if ids[pos:pos + len(g.token_ids)] == g.token_ids), None)
        if match is None:
            return bad + 1, mask_errors
        mask_errors += sum(m != 1 for m in mask[pos:pos + len(match.token_ids)])
        pos += len(match.token_ids)
        while pos < len(ids) and mask[pos] == 0:  # the tool turn that followed
            pos += 1
    return bad, mask_errors


@torch.no_grad()
def _trainer_logp(model: Any, r: Any) -> torch.Tensor:
    ids = torch.cat([r.prompt_ids, r.completion_ids], dim=1)
    mask = torch.cat([r.prompt_mask, r.completion_mask], dim=1)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits[:, r.prompt_ids.shape[1] - 1:-1]
    return torch.log_softmax(logits.float(), -1).gather(-1, r.completion_ids[..., None]).squeeze(-1)


def agent_round_check(model_dir: Any, url: str | None, group: int) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grouprl.builtins import load_builtins
    from grouprl.data.load import load_dataset_any
    from grouprl.envs.base import make_env_factory
    from grouprl.envs.resolve import resolve_environment
    from grouprl.rollout.agent_round import agent_round, engine_for
    from grouprl.rollout.base import SamplingParams
    from grouprl.rollout.multiturn import MultiTurnParams
    from grouprl.rollout.vllm_backend import VLLMBackend
    from grouprl.train.agent import rollout_rows

    load_builtins()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).to(device).eval()
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    backend = VLLMBackend(model, tok, mode="server" if url else "colocate", server_url=url or "", timeout=900.0,
                          gpu_memory_utilization=0.3, sleep=True, max_model_len=512)
    engine = Recording(engine_for(backend, model, tok))
    ds = load_dataset_any("builtin:calculator")
    rows = rollout_rows([dict(ds[i]) for i in range(AGENT_PROMPTS)], "prompt", None)
    factory = make_env_factory(environment_factory=resolve_environment("calculator"))
    r = agent_round(engine, tok, rows, group, SamplingParams(AGENT_TOKENS, temperature=1.0),
                    MultiTurnParams(max_turns=2, max_new_tokens=AGENT_TOKENS), env_factory=factory, device=device)
    served: dict[tuple, list] = {}
    for prompt, gen in engine.served:
        served.setdefault(prompt, []).append(gen)
    errors = [_segment_errors(t, served) for t in r.trajectories]
    model_mask = r.loss_mask.bool()
    gap = (r.rollout_logp - _trainer_logp(model, r)).abs()[model_mask]
    trajs = r.trajectories
    return {"trajectories": len(trajs), "continuous": engine.continuous,
            "end_reasons": {e: sum(t.end_reason == e for t in trajs) for e in sorted({t.end_reason for t in trajs})},
            "tool_calls_per_traj": sum(len(t.tool_calls) for t in trajs) / len(trajs),
            "segments_not_engine_ids": sum(b for b, _ in errors), "mask_errors": sum(m for _, m in errors),
            "tool_tokens": int((~model_mask & r.completion_mask.bool()).sum()),
            "logp_gap_mean": float(gap.mean()), "logp_gap_max": float(gap.max()),
            "rollout_tokens_per_s": int(model_mask.sum()) / r.stats.engine_s if r.stats.engine_s else None,
            "engine_busy_fraction": r.stats.busy_fraction, "wall_s": r.stats.wall_s}
