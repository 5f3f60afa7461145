"""Every way a tool call can fail or a trajectory can end, through GRPOTrainer with the documented
scripted-policy plug-in (``rollout_backend: extending.my_engine:ScriptedPolicy``):
each is counted in the logged metrics, recorded in samples.jsonl, and leaves no tool thread behind."""

from __future__ import annotations

import time

import pytest
from agent_helpers import ROWS, E, add, explode, nap, read_jsonl, tool_threads, use_script

from grouprl import GRPOConfig, GRPOTrainer

ANSWER = "{sum}" + E
CASES = {  # name: (script, config overrides, expected error kind of the first call, expected end reason)
    "valid": (["<tool_call>add(a={a}, b={b})</tool_call>" + E, ANSWER], {}, None, "answered"),
    "malformed": (["<tool_call>add(a=</tool_call>" + E, ANSWER], {}, "malformed", "answered"),
    "unknown_tool": (["<tool_call>nope()</tool_call>" + E, ANSWER], {}, "unknown_tool", "answered"),
    "bad_arguments": (["<tool_call>add(a=1)</tool_call>" + E, ANSWER], {}, "bad_arguments", "answered"),
    "raises": (["<tool_call>explode(x=1)</tool_call>" + E, ANSWER], {}, "exception", "answered"),
    "timeout": (["<tool_call>nap(seconds=1.5)</tool_call>" + E, ANSWER], {"tool_timeout_s": 0.2}, "timeout", "answered"),
    "max_turns": (["<tool_call>add(a=1, b=2)</tool_call>" + E], {"max_turns": 2}, None, "max_turns"),
    "token_budget": (["1234567890" * 4], {"max_new_tokens": 16}, None, "max_tokens"),
    "error_budget": (["<tool_call>nope()</tool_call>" + E], {"max_tool_failures": 2, "max_turns": 4}, "unknown_tool",
                     "tool_error_budget"),
    "trajectory_timeout": (["<tool_call>nap(seconds=3)</tool_call>" + E, ANSWER], {"trajectory_timeout_s": 1.0},
                           "timeout", "timeout"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_scripted_policy_through_the_trainer(name, tmp_path, tiny_model_dir, monkeypatch):
    script, overrides, error, end = CASES[name]
    backend = use_script(monkeypatch, script)
    cfg = GRPOConfig(**{**dict(rollout_backend=backend, output_dir=str(tmp_path / "out"), num_generations=2, per_device_train_batch_size=4,
                               max_new_tokens=96, max_steps=1, progress_bar=False, save_strategy="no", seed=0,
                               eval_split=None, log_completions_steps=1, num_completions_to_log=1), **overrides})
    start = time.monotonic()
    GRPOTrainer(model=str(tiny_model_dir), config=cfg, train_dataset=ROWS, reward_funcs=["accuracy"],
                tools=[add, explode, nap]).train()
    assert time.monotonic() - start < 60
    rec = read_jsonl(f"{cfg.output_dir}/metrics.jsonl")[0]
    sample = read_jsonl(f"{cfg.output_dir}/samples.jsonl")[0]
    assert rec[f"end_reason/{end}"] == 1 and sample["end_reason"] == end
    calls = sample["tool_calls"]
    if name == "token_budget":
        assert calls == [] and rec["tools/calls_per_traj"] == 0 and rec["completions/mean_length"] == 16
        assert rec["completions/truncated_frac"] == 1
    elif name == "max_turns":  # the last turn's call is not run: no model turn would read its result
        assert len(calls) == 1 and rec["turns/mean"] == 2 and rec["tools/failure_frac"] == 0
    elif name == "trajectory_timeout":  # the call is cut at the time left, then the trajectory ends
        assert [c["error"] for c in calls] == ["timeout"] and rec["turns/mean"] == 1
    elif name == "error_budget":
        assert [c["error"] for c in calls] == ["unknown_tool", "unknown_tool"] and rec["turns/mean"] == 2
    else:
        assert calls[0]["error"] == error and rec["tools/calls_per_traj"] == 1
        assert rec["tools/failure_frac"] == (0 if error is None else 1) and rec["turns/mean"] == 2
        assert rec["rewards/accuracy/mean"] == 1  # the model read the result (or the error) and answered
        assert calls[0]["result"] in sample["tokens"] or calls[0]["result"] in "".join(sample["tokens"])
    assert tool_threads() == []


def test_held_out_evaluation_is_multi_turn(tmp_path, tiny_model_dir, monkeypatch):
    backend = use_script(monkeypatch, ["<tool_call>add(a={a}, b={b})</tool_call>" + E, ANSWER])
    cfg = GRPOConfig(rollout_backend=backend, output_dir=str(tmp_path / "out"), max_new_tokens=96, progress_bar=False, eval_split=None,
                     num_generations=2, per_device_train_batch_size=2)
    trainer = GRPOTrainer(model=str(tiny_model_dir), config=cfg, train_dataset=ROWS, reward_funcs=["accuracy"],
                          eval_dataset=ROWS, tools=[add])
    result = trainer.evaluate()
    assert result["accuracy"] == 1.0 and result["tools/calls_per_traj"] == 1 and result["turns/mean"] == 2
    assert result["end_reason/answered"] == 1 and result["samples"][0]["tool_calls"][0]["result"] == "1"
    assert result["completion_length"] == result["tokens/model"]  # model tokens only


def test_grouprl_eval_path_builds_the_agent_from_the_recipe(tmp_path, tiny_model_dir, monkeypatch):
    """``evaluate_model`` without an agent (as ``grouprl eval`` calls it) reads tools / environment from the
    config and runs multi-turn; the accuracy is that of the final answers."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grouprl.rewards import make_reward_func
    from grouprl.train.evaluate import evaluate_model

    backend = use_script(monkeypatch, ["<tool_call>calculator(expression='{a} + {b}')</tool_call>" + E, "{sum}0" + E])
    cfg = GRPOConfig(rollout_backend=backend, environment="calculator", max_new_tokens=96, eval_split=None, output_dir=str(tmp_path))
    model, tok = AutoModelForCausalLM.from_pretrained(tiny_model_dir), AutoTokenizer.from_pretrained(tiny_model_dir)
    result = evaluate_model(cfg, model, tok, ROWS, make_reward_func("accuracy"))
    assert result["accuracy"] == 0.0 and result["tools/calls_per_traj"] == 1 and result["tools/failure_frac"] == 0
    assert result["samples"][0]["messages"][-1]["content"] == "10"  # 0 + 1 = 1, answered "10": wrong


def test_the_engine_plug_in_serves_single_turn_runs_and_its_logprobs_reach_the_correction(tmp_path, tiny_model_dir,
                                                                                           monkeypatch):
    """No tools: the same plug-in runs a single-turn round (``EngineBackend``); its log-prob -1.0 per token
    is ``rollout_logp``, so TIS applies and the gap to the trainer's log-probs is logged."""
    backend = use_script(monkeypatch, ["Answer: {sum}" + E], logprob=-1.0)
    cfg = GRPOConfig(rollout_backend=backend, output_dir=str(tmp_path / "out"), num_generations=2,
                     per_device_train_batch_size=4, max_new_tokens=32, max_steps=1, progress_bar=False,
                     save_strategy="no", seed=0, eval_split=None)
    GRPOTrainer(model=str(tiny_model_dir), config=cfg, train_dataset=ROWS, reward_funcs=["accuracy"]).train()
    rec = read_jsonl(f"{cfg.output_dir}/metrics.jsonl")[0]
    assert rec["reward"] == 1 and "tools/calls_per_traj" not in rec
    assert rec["mismatch/logp_abs_diff"] > 0 and rec["mismatch/is_weight_max"] <= 2.0  # TIS, capped at 2
