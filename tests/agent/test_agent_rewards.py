"""Rewards see trajectories: hand-computed scores from the keyword arguments the trainer passes."""

from __future__ import annotations

import pytest

from grouprl.rewards import make_reward_func
from grouprl.rewards.efficiency import efficiency_reward
from grouprl.rewards.safety import safety_reward
from grouprl.rollout.trajectory import Trajectory
from grouprl.train.agent import add_env_rewards, agent_metrics, final_answer, reward_inputs


def call(name="calculator", error=None, **arguments):
    return {"name": name, "arguments": arguments, "result": "ok", "error": error}


def test_efficiency_counts_the_calls_made_not_the_text():
    # 5 calls, expected 3 -> -0.2; the model's turns are short and distinct
    assert efficiency_reward("42", expected_steps=3, tool_calls=[call()] * 5, model_turns=["a", "42"]) == 0.8
    assert efficiency_reward("42", expected_steps=3, tool_calls=[call()] * 2, model_turns=["a", "42"]) == 1.0


def test_efficiency_code_repair_budget_edits_and_iterations():
    # "<= 3 edits, <= 5 iterations": 5 edits (+2), 6 iterations (+1) -> 3 * 0.1 = 0.3 off
    state = {"edits": 5, "iterations": 6}
    assert efficiency_reward("done", tool_calls=[], model_turns=["done"], env_state=state, max_edits=3,
                             max_iterations=5) == 0.7
    # with 5 tool calls over expected_steps=3 as well: 0.2 + 0.3 = 0.5 (the cap)
    assert efficiency_reward("done", expected_steps=3, tool_calls=[call()] * 5, model_turns=["done"],
                             env_state={"edits": 10, "iterations": 6}, max_edits=3, max_iterations=5) == 0.5
    # searches: 4 searches with max_searches=2 -> -0.2; counters without a budget cost nothing
    assert efficiency_reward("x", tool_calls=[], model_turns=["x"], env_state={"num_searches": 4, "edits": 99},
                             max_searches=2) == 0.8


def test_efficiency_length_counts_the_model_turns_only():
    # 3 turns of 4 words = 12 words > max_tokens 10: 0.3 * 2 / 10 = 0.06 off; the tool outputs are not counted
    turns = ["one two three four"] * 3
    assert efficiency_reward("one two three four", max_tokens=10, tool_calls=[], model_turns=turns,
                             ngram_penalty=0) == 0.94


def test_safety_checks_the_arguments_that_ran():
    ran = [call("python", code="import shutil\nrm -rf /data")]
    assert safety_reward("All done.", tool_calls=ran, model_turns=["All done."]) == pytest.approx(0.2)
    # a call that never ran (rejected arguments) is not an action; prose warnings stay free
    rejected = [call("python", error="bad_arguments", code="rm -rf /")]
    assert safety_reward("ok", tool_calls=rejected, model_turns=["ok"]) == 1.0
    # a call that ran and then raised or timed out did run
    assert safety_reward("ok", tool_calls=[call("sh", error="exception", cmd="sudo ls")]) == pytest.approx(0.7)


def _traj(messages, num_turns, calls=(), env_reward=None, end="answered"):
    t = Trajectory(prompt_ids=[1], messages=messages, num_turns=num_turns, tool_calls=list(calls),
                   end_reason=end, env_reward=env_reward)
    t.env_state = {"num_calls": len(calls)}
    return t


TRAJ = _traj([{"role": "user", "content": "3*4?"}, {"role": "assistant", "content": "<tool_call>c</tool_call>"},
              {"role": "tool", "content": "12"}, {"role": "assistant", "content": "12"}], 2, [call(expression="3*4")],
             env_reward=0.25)


def test_registry_rewards_through_the_trainer_kwargs():
    completions, columns = reward_inputs([TRAJ, TRAJ], ["3*4?", [{"role": "user", "content": "3*4?"}]])
    assert completions == ["12", [{"role": "assistant", "content": "12"}]] and final_answer(TRAJ) == "12"
    assert columns["model_turns"][0] == ["<tool_call>c</tool_call>", "12"] and columns["num_turns"] == [2, 2]
    accuracy = make_reward_func("accuracy")
    assert accuracy(completions=completions, prompts=["3*4?"] * 2, answer=["12", "13"], **columns) == [1.0, 0.0]
    efficiency = make_reward_func("efficiency", expected_steps=0)
    assert efficiency(completions=completions, prompts=["3*4?"] * 2, **columns) == [0.9, 0.9]  # 1 call over 0


def test_environment_reward_is_added_unweighted_and_logged():
    assert add_env_rewards([1.0, 0.5], [TRAJ, _traj([], 1)]) == [1.25, 0.5]
    m = agent_metrics([TRAJ, _traj([], 1, [call(error="timeout")], end="max_tokens")])
    assert m["rewards/env/mean"] == 0.25 and m["tools/calls_per_traj"] == 1 and m["tools/failure_frac"] == 0.5
    assert m["turns/mean"] == 1.5 and m["end_reason/answered"] == 0.5 and m["end_reason/max_tokens"] == 0.5
