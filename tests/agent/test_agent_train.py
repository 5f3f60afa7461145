"""GRPO through GRPOTrainer with tools: a scripted policy on the tiny model, end to end.

The policy's sampled text is fixed (``agent_helpers.use_script``: the documented scripted-policy plug-in), the rest is the trainer's own path:
the multi-turn rollout, the rewards that see trajectories, the environment reward, the loss mask in the
micro-batches, the gradients, the metrics and samples.jsonl.
"""

from __future__ import annotations

import pytest
import torch
from agent_helpers import ROWS, SCRIPTED, Adder, E, add, read_jsonl, tool_threads, use_script

import grouprl.train.algorithms.rounds as round_mod
import grouprl.train.engine.step as step_mod
from grouprl import GRPOConfig, GRPOTrainer

CALL = "<tool_call>calculator(expression='{a} + {b}')</tool_call>" + E
ANSWER = "{sum}" + E


def config(tmp_path, **kw):
    base = dict(output_dir=str(tmp_path / "out"), num_generations=2, per_device_train_batch_size=4,
                gradient_accumulation_steps=1, max_new_tokens=64, max_prompt_length=128, max_steps=2,
                learning_rate=1e-3, progress_bar=False, save_strategy="no", seed=0, eval_split=None,
                log_completions_steps=1, num_completions_to_log=4, rollout_backend=SCRIPTED)
    base.update(kw)
    return GRPOConfig(**base)


class Spy:
    """Records what reward functions were given, and returns 0.5 for every completion."""

    def __init__(self):
        self.kwargs = []
        self.__name__ = "spy"

    def __call__(self, prompts, completions, **kw):
        self.kwargs.append({"completions": completions, **kw})
        return [0.5] * len(completions)


@pytest.fixture
def captured(monkeypatch):
    """The micro-batches the round built, and the policy log-probs of each loss (with their gradients)."""
    seen = {"mbs": [], "logps": []}
    real_mbs, real_logps = round_mod.micro_batches, step_mod.completion_logps

    def mbs(ctx, batch, timers):
        out = real_mbs(ctx, batch, timers)
        seen["mbs"].extend(out)
        return out

    def logps(*args, **kwargs):
        logp, entropy = real_logps(*args, **kwargs)
        if logp.requires_grad:
            logp.retain_grad()
            seen["logps"].append(logp)
        return logp, entropy

    monkeypatch.setattr(round_mod, "micro_batches", mbs)
    monkeypatch.setattr(step_mod, "completion_logps", logps)
    return seen


def test_calculator_environment_end_to_end(tmp_path, tiny_model_dir, monkeypatch, captured):
    use_script(monkeypatch, [CALL, ANSWER])
    spy = Spy()
    cfg = config(tmp_path, environment="calculator", reward_funcs=["accuracy"])
    trainer = GRPOTrainer(model=str(tiny_model_dir), config=cfg, train_dataset=ROWS, reward_funcs=[spy, "accuracy"])
    trainer.train()
    # rewards saw the trajectory: final answer as the completion, the executed call, the env's counters
    kw = spy.kwargs[0]
    assert kw["completions"][0] == "1" and kw["num_turns"][0] == 2 and kw["end_reason"][0] == "answered"
    assert kw["tool_calls"][0] == [{"name": "calculator", "arguments": {"expression": "0 + 1"}, "result": "1",
                                    "error": None}]
    assert kw["env_state"][0] == {"num_calls": 1} and kw["model_turns"][0] == [CALL.format(a=0, b=1)[:-len(E)], "1"]
    assert [m["role"] for m in kw["messages"][0]] == ["user", "assistant", "tool", "assistant"]
    # loss_mask reaches the micro-batch: 0 exactly on the tool turn's tokens
    tok = trainer.tokenizer
    mb = captured["mbs"][0]
    call_ids = tok.encode(CALL.format(a=0, b=1), add_special_tokens=False)
    answer_ids = tok.encode("1" + E, add_special_tokens=False)
    tool_ids = tok.encode("\n<|im_start|>tool\n1<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    expected = [1] * len(call_ids) + [0] * len(tool_ids) + [1] * len(answer_ids)
    n = len(expected)
    assert mb.loss_mask[0, :n].tolist() == expected and int(mb.loss_mask[0, n:].sum()) == 0
    assert mb.completion_ids[0, :n].tolist() == call_ids + tool_ids + answer_ids
    assert mb.completion_mask[0, :n].tolist() == [1] * n
    # the gradient of the loss wrt the log-probs of tool tokens is exactly 0 (and not 0 elsewhere)
    logp = captured["logps"][0]
    tool = mb.loss_mask[:, :logp.shape[1]] == 0
    assert torch.all(logp.grad[tool] == 0)
    # metrics: model tokens only in the lengths, the tool statistics, the accuracy of the final answer
    rec = read_jsonl(f"{cfg.output_dir}/metrics.jsonl")[0]
    model_tokens = len(call_ids) + len(answer_ids)
    assert rec["completions/mean_length"] == model_tokens and rec["tokens/model"] == model_tokens
    assert rec["tokens/tool"] == len(tool_ids) and rec["num_tokens"] == 4 * model_tokens
    assert rec["tools/calls_per_traj"] == 1 and rec["tools/failure_frac"] == 0 and rec["turns/mean"] == 2
    assert rec["end_reason/answered"] == 1 and rec["rewards/accuracy/mean"] == 1 and rec["reward"] == 1.5
    # samples.jsonl holds whole trajectories, with per-token text and mask
    sample = read_jsonl(f"{cfg.output_dir}/samples.jsonl")[0]
    assert sample["tool_calls"][0]["result"] == "1" and sample["end_reason"] == "answered"
    assert sample["loss_mask"] == expected and "".join(sample["tokens"]) == tok.decode(sample["completion_ids"])
    assert GRPOConfig.from_yaml(f"{cfg.output_dir}/config.yaml").environment == "calculator"
    assert tool_threads() == []


def test_plain_tools_and_a_trl_environment_with_its_reward(tmp_path, tiny_model_dir, monkeypatch):
    script = ['<tool_call>{{"name": "add", "arguments": {{"a": {a}, "b": {b}}}}}</tool_call>' + E, ANSWER]
    use_script(monkeypatch, script)
    cfg = config(tmp_path, reward_weights=[2.0])
    trainer = GRPOTrainer(model=str(tiny_model_dir), config=cfg, train_dataset=ROWS, reward_funcs=[Spy()],
                          environment_factory=Adder)
    trainer.train()
    rec = read_jsonl(f"{cfg.output_dir}/metrics.jsonl")[0]
    # TRL: total = sum of weighted reward functions + the environment's reward (weights do not apply to it)
    assert rec["rewards/Adder/mean"] == 1.0 and rec["rewards/spy/mean"] == 0.5 and rec["reward"] == 2 * 0.5 + 1.0
    assert cfg.environment == "agent_helpers:Adder"
    # tools=[fn]: a plain function, the recorded name is its import path
    use_script(monkeypatch, ["<tool_call>add(a={a}, b={b})</tool_call>" + E, ANSWER])
    cfg = config(tmp_path, output_dir=str(tmp_path / "out2"))
    spy = Spy()
    GRPOTrainer(model=str(tiny_model_dir), config=cfg, train_dataset=ROWS, reward_funcs=[spy], tools=[add]).train()
    assert cfg.tools == ["agent_helpers:add"] and spy.kwargs[0]["tool_calls"][0][0]["result"] == "1"
    assert GRPOConfig.from_yaml(f"{cfg.output_dir}/config.yaml").tools == ["agent_helpers:add"]


def test_the_summary_states_held_out_tool_use_before_and_after():
    from grouprl.train.trainer import tool_use_line

    before = {"accuracy": 0.3, "tools/calls_per_traj": 0.65, "tools/failure_frac": 0.1, "turns/mean": 1.6}
    after = {"accuracy": 0.6, "tools/calls_per_traj": 0.99, "tools/failure_frac": 0.0, "turns/mean": 2.0}
    assert tool_use_line(before, after) == ("held-out tool use: tool calls per trajectory 0.65 -> 0.99, "
                                            "failed calls 0.10 -> 0.00, turns 1.60 -> 2.00")
    assert tool_use_line({"accuracy": 0.1}, {"accuracy": 0.2}) is None  # a single-turn run: no line
    # an environment's counters per trajectory follow (the python environment's edits and test runs)
    before.update({"env/edits": 0.81, "env/iterations": 0.8})
    after.update({"env/edits": 1.2, "env/iterations": 1.25})
    assert tool_use_line(before, after).endswith("turns 1.60 -> 2.00, edits 0.81 -> 1.20, iterations 0.80 -> 1.25")
