"""Multi-turn (agent) rollouts on ``rollout_backend: vllm`` against the fake engine, through the code a GPU
run takes: the token engine (``grouprl.rollout.vllm_engine``), continuous batching in colocate mode
(requests finishing out of order), the ``grouprl vllm-serve`` protocol in server mode, and the engine's
log-probs on model tokens (0 on tool tokens) feeding the TIS correction and its mismatch metrics.

The fake engine emits scripted ids here (a calculator call, then the sum) and scores each with its own
copy of the weights, minus ``offset`` nats: the mismatch metrics then say whether tool tokens leaked in.
"""

from __future__ import annotations

import json
import math
import re
import threading
from collections import Counter

import fake_vllm
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from grouprl import GRPOConfig, GRPOTrainer

E = "<|im_end|>"
ROWS = [{"prompt": f"What is {i} + {i * 7 + 1}?", "answer": str(i * 8 + 1)} for i in range(8)]


def calculator_script(tokenizer):
    """First turn: a calculator call on the question's expression ("What is 12 * 3 + 4?"); after the tool
    turn: its value (ids of the text, end-of-turn last)."""

    def script(prompt_ids):
        text = tokenizer.decode(prompt_ids)
        expr = re.search(r"What is ([\d +*-]+)\?", text)[1]
        value = sum(eval_product(term) * sign for sign, term in signed_terms(expr))
        reply = f"{value}{E}" if text.count("<|im_start|>assistant") > 1 else \
            f"<tool_call>calculator(expression='{expr}')</tool_call>{E}"
        return tokenizer.encode(reply, add_special_tokens=False)

    return script


def signed_terms(expr: str) -> list[tuple[int, str]]:
    parts = re.split(r"\s*([+-])\s*", expr.strip())
    return [(1, parts[0])] + [(1 if op == "+" else -1, term) for op, term in zip(parts[1::2], parts[2::2])]


def eval_product(term: str) -> int:
    out = 1
    for factor in term.split("*"):
        out *= int(factor)
    return out


def _train(tmp_path, model_dir, **overrides):
    base = dict(output_dir=str(tmp_path / "out"), num_generations=2, per_device_train_batch_size=4,
                gradient_accumulation_steps=1, max_new_tokens=64, max_prompt_length=160, max_steps=2,
                learning_rate=1e-3, progress_bar=False, save_strategy="no", seed=0, eval_split=None,
                rollout_backend="vllm", vllm_sleep=True, environment="calculator", reward_funcs=["accuracy"],
                log_completions_steps=1, num_completions_to_log=2)
    cfg = GRPOConfig(**(base | overrides))
    GRPOTrainer(model=str(model_dir), config=cfg, train_dataset=[dict(r) for r in ROWS]).train()
    with open(f"{cfg.output_dir}/metrics.jsonl") as f:
        records = [r for r in map(json.loads, f) if "reward" in r]
    with open(f"{cfg.output_dir}/samples.jsonl") as f:
        return records, [json.loads(x) for x in f]


def _check_run(records, samples, offset):
    for rec in records:
        assert rec["tools/calls_per_traj"] == 1 and rec["end_reason/answered"] == 1 and rec["reward"] == 1
        # the gap on model tokens only: tool tokens (rollout_logp 0) would pull it away from |offset|
        assert rec["mismatch/logp_abs_diff"] == pytest.approx(abs(offset), abs=1e-4)
        assert rec["mismatch/is_weight_mean"] == pytest.approx(math.exp(-offset), abs=1e-4)
    assert samples[0]["tool_calls"][0]["error"] is None and 0 in samples[0]["loss_mask"]


def test_colocate_agent_run_end_to_end_with_continuous_batching(tiny_model_dir, tmp_path, monkeypatch):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    fake_vllm.install(monkeypatch, offset=-0.5, script=calculator_script(tok))
    records, samples = _train(tmp_path, tiny_model_dir)
    _check_run(records, samples, -0.5)
    kinds = [e[0] for e in fake_vllm.EVENTS]
    # one weight push and one wake / sleep per generation round; the turns went through llm_engine.step
    assert kinds.count("load_weights") == 2 and kinds.count("sleep") == 3 and "generate" not in kinds
    assert fake_vllm.INSTANCES[0].llm_engine.max_running == 4  # the round's 2 x 2 first turns decoded together


def test_server_agent_run_end_to_end(tiny_model_dir, tmp_path, monkeypatch):
    from grouprl.cmd.vllm_serve import make_server

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    vllm = fake_vllm.install(monkeypatch, offset=-0.25, script=calculator_script(tok))
    llm = vllm.LLM(model=str(tiny_model_dir))
    server = make_server(llm, vllm, "127.0.0.1", 0, model=str(tiny_model_dir))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        records, samples = _train(tmp_path, tiny_model_dir, vllm_mode="server", vllm_server_timeout=30.0,
                                  vllm_server_url=f"http://127.0.0.1:{server.server_port}")
    finally:
        server.shutdown()
        server.server_close()
    _check_run(records, samples, -0.25)
    generates = [e for e in fake_vllm.EVENTS if e[0] == "generate"]
    assert generates[0] == ("generate", 4, 1)  # one request per trajectory turn (2 x 2), each with its budget


def _rollout(model_dir, tok, schedule, temperature):
    from grouprl.builtins import load_builtins
    from grouprl.envs.base import make_env_factory
    from grouprl.envs.resolve import resolve_environment
    from grouprl.rollout.agent_round import agent_round, engine_for
    from grouprl.rollout.base import SamplingParams
    from grouprl.rollout.multiturn import MultiTurnParams
    from grouprl.rollout.vllm_backend import VLLMBackend
    from grouprl.train.agent import rollout_rows

    load_builtins()

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    backend = VLLMBackend(model, tok, mode="colocate", sleep=True)
    engine = engine_for(backend, model, tok)
    factory = make_env_factory(environment_factory=resolve_environment("calculator"))
    rows = rollout_rows([dict(r) for r in ROWS[:4]], "prompt", None)
    rollout = agent_round(engine, tok, rows, 3, SamplingParams(48, temperature=temperature),
                          MultiTurnParams(max_new_tokens=48, schedule=schedule), env_factory=factory)
    return engine, model, rollout


def _as_sets(rollout):
    """Per prompt, the multiset of (completion ids, mask, rounded engine log-probs) of its trajectories."""
    out = {}
    for t in rollout.trajectories:
        key = (tuple(t.completion_ids), tuple(t.loss_mask), tuple(round(x, 5) for x in t.rollout_logp))
        out.setdefault(t.group, Counter())[key] += 1
    return out


@pytest.mark.parametrize("scripted", [True, False])
def test_out_of_order_completions_give_the_lockstep_trajectories(tiny_model_dir, monkeypatch, scripted):
    """Continuous batching, finished requests returned in reverse order, vs lockstep batches: the same
    trajectories per prompt (the fake samples each request from its own seeded stream)."""
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    fake_vllm.install(monkeypatch, offset=-0.5, script=calculator_script(tok) if scripted else None)
    engine, _, lockstep = _rollout(tiny_model_dir, tok, "lockstep", 1.0)
    assert not any(e[0] == "step" for e in fake_vllm.EVENTS)
    fake_vllm.EVENTS.clear()
    engine, model, per_traj = _rollout(tiny_model_dir, tok, "per_trajectory", 1.0)
    assert engine.continuous and any(e[0] == "step" for e in fake_vllm.EVENTS)
    assert _as_sets(per_traj) == _as_sets(lockstep)
    if scripted:
        assert all(t.num_turns == 2 and t.tool_calls[0]["error"] is None for t in per_traj.trajectories)
        check_tool_token_gradient_is_zero(model, per_traj)


@torch.no_grad()
def trainer_logp(model, r) -> torch.Tensor:
    """log pi(y_t | x, y_<t) [N,T] of the trainer's weights (one plain forward over prompt + completion)."""
    ids = torch.cat([r.prompt_ids, r.completion_ids], dim=1)
    mask = torch.cat([r.prompt_mask, r.completion_mask], dim=1)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits[:, r.prompt_ids.shape[1] - 1:-1]
    return torch.log_softmax(logits.float(), -1).gather(-1, r.completion_ids[..., None]).squeeze(-1) * r.completion_mask


def check_tool_token_gradient_is_zero(model, r):
    """The trainer's objective on this batch (GRPO, token_mean, TIS with the engine's log-probs): the
    gradient reaching the log-prob of every tool token is exactly 0, and nonzero on sampled tokens."""
    import grouprl.algo  # noqa: F401 -- fills the registries
    from grouprl.algo.correction import tis
    from grouprl.registry import AGGREGATIONS, POLICY_LOSSES

    logp = trainer_logp(model, r).requires_grad_()
    mask = r.loss_mask
    assert ((mask == 0) & (r.completion_mask == 1)).sum() > 50  # there are tool tokens
    adv = torch.linspace(-1, 1, len(mask))
    weight, _ = tis(logp.detach(), r.rollout_logp, mask, cap=2.0)
    per_token, _ = POLICY_LOSSES.get("grpo")(logp, logp.detach(), adv, mask)
    AGGREGATIONS.get("token_mean")(per_token * weight, mask, num_tokens=mask.sum()).backward()
    assert torch.all(logp.grad[mask == 0] == 0)
    assert torch.count_nonzero(logp.grad[mask == 1]) > 0
