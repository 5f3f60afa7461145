"""RewardConfig / AgentRewardFunction / templates / weight schedule, and robust_reward's defences."""

from __future__ import annotations

import math

import pytest

from grouprl.errors import ConfigError
from grouprl.rewards import (
    AgentRewardFunction,
    RewardConfig,
    code_reward_config,
    composite_reward,
    format_first_schedule,
    math_reward_config,
    retrieval_reward_config,
    robust_reward,
)

WORKED = (
    "<think>\n需要计算圆的面积：S = π × r² = π × 5² ≈ 78.54\n</think>\n"
    "<tool_call>calculator(expression='3.14159 * 5**2')</tool_call>"
)
REASON = "The radius is 5, so the area is pi times 25, which is about 78.54."
GIBBERISH = "asdkj qwoeiu zmxncb poiqwe lkjasd mnbzxc qweoiu asdlkj"


def test_worked_example_total():
    fn = AgentRewardFunction(
        RewardConfig(accuracy_weight=0.50, format_weight=0.20, efficiency_weight=0.15, safety_weight=0.15)
    )
    result = fn(completion=WORKED, ground_truth="78.54", task_type="math")
    assert set(result) == {"accuracy", "format", "efficiency", "safety", "total"}
    assert result["accuracy"] == 1.0
    assert result["format"] == 0.8
    assert result["efficiency"] == 1.0
    assert result["safety"] == 1.0
    assert result["total"] == pytest.approx(0.5 * 1.0 + 0.2 * 0.8 + 0.15 * 1.0 + 0.15 * 1.0)  # 0.96, not 0.93
    assert result["total"] == pytest.approx(0.96)


def test_templates_and_their_totals_on_the_worked_example():
    assert math_reward_config.weights() == {
        "accuracy": 0.6,
        "format": 0.15,
        "efficiency": 0.15,
        "safety": 0.10,
    }
    assert code_reward_config.weights() == {
        "accuracy": 0.5,
        "format": 0.10,
        "efficiency": 0.25,
        "safety": 0.15,
    }
    assert retrieval_reward_config.weights() == {
        "accuracy": 0.4,
        "format": 0.2,
        "efficiency": 0.2,
        "safety": 0.2,
    }
    # 0.6 * 1 + 0.15 * 0.8 + 0.15 * 1 + 0.10 * 1
    assert AgentRewardFunction(math_reward_config)(WORKED, "78.54")["total"] == pytest.approx(0.97)
    assert composite_reward(WORKED, answer="78.54", config="math") == pytest.approx(0.97)
    assert composite_reward(WORKED, answer="78.54") == pytest.approx(0.96)


def test_missing_and_unparseable_ground_truth():
    fn = AgentRewardFunction()
    # no ground truth: the neutral 0.5 -> 0.5 * 0.5 + 0.2 * 0.8 + 0.15 + 0.15
    assert fn(WORKED, None)["total"] == pytest.approx(0.71)
    out = fn(WORKED, "???")
    assert out["accuracy"] is None and out["total"] is None and out["format"] == 0.8


@pytest.mark.parametrize(
    "weights, message",
    [
        (
            (0.6, 0.2, 0.15, 0.15),
            r"accuracy_weight=0.6, format_weight=0.2, efficiency_weight=0.15, safety_weight=0.15 sum to 1.1",
        ),
        ((1.2, -0.2, 0.0, 0.0), r"format_weight is not"),
        ((math.nan, 0.5, 0.25, 0.25), r"accuracy_weight is not"),
        ((0.5, 0.2, 0.15, 0.1), r"sum to 0.95"),
    ],
)
def test_bad_weights_are_clear_errors(weights, message):
    with pytest.raises(ConfigError, match=message):
        RewardConfig(*weights)


def test_weights_within_tolerance_are_accepted():
    assert RewardConfig(0.5 + 5e-7, 0.2, 0.15, 0.15).accuracy_weight == 0.5 + 5e-7


def test_format_first_schedule():
    sched = format_first_schedule(RewardConfig(), boost=0.2, warmup=0.2, ramp=0.3)
    assert sched.at(0.0).weights() == pytest.approx(
        {"accuracy": 0.3, "format": 0.4, "efficiency": 0.15, "safety": 0.15}
    )
    assert sched.at(0.2).weights() == sched.at(0.0).weights()
    # halfway through the ramp (0.2 + 0.15): weights halfway between early and late
    assert sched.at(0.35).weights() == pytest.approx(
        {"accuracy": 0.4, "format": 0.3, "efficiency": 0.15, "safety": 0.15}
    )
    assert sched.at(0.5).weights() == pytest.approx(RewardConfig().weights())
    assert sched.at(7.0).weights() == pytest.approx(RewardConfig().weights())
    fn = AgentRewardFunction(RewardConfig(), schedule=sched)
    # worked example: early 0.3 * 1 + 0.4 * 0.8 + 0.15 + 0.15 = 0.92; late 0.96
    assert fn(WORKED, "78.54", progress=0.0)["total"] == pytest.approx(0.92)
    assert fn(WORKED, "78.54", progress=1.0)["total"] == pytest.approx(0.96)
    # a correct answer with no format: early 0.3 + 0.3 = 0.6, late 0.5 + 0.3 = 0.8
    assert fn("\\boxed{78.54}", "78.54", progress=0.0)["total"] == pytest.approx(0.6)
    assert fn("\\boxed{78.54}", "78.54", progress=1.0)["total"] == pytest.approx(0.8)


def test_code_task_goes_through_the_code_reward():
    from grouprl.sandbox import detect

    if not detect().strict:
        pytest.skip("the code sandbox (strict isolation) is not available on this machine")
    completion = "```python\ndef add(a, b):\n    return a + b\n```"
    out = AgentRewardFunction(code_reward_config)(
        completion, ["assert add(1, 2) == 3", "assert add(2, 2) == 5"]
    )
    assert out["accuracy"] == 0.5  # 1 of 2 tests pass
    # 0.5 * 0.5 + 0.10 * 0 (no think, no tool call) + 0.25 * 1 + 0.15 * 1
    assert out["total"] == pytest.approx(0.65)


@pytest.mark.parametrize(
    "completion, kwargs, expected",
    [
        (f"<think>{REASON}</think> \\boxed{{78.54}}", {}, 1.0),
        (f"<think>{GIBBERISH}</think> \\boxed{{78.54}}", {}, 0.5),  # defence 1: incoherent think
        (f"{GIBBERISH}</think> \\boxed{{78.54}}", {}, 0.5),  # ... also when the template opened <think>
        (f"<think>{REASON}</think> \\boxed{{78.54}}", {"incoherent_factor": 0.0}, 1.0),
        (f"<think>{REASON}</think>" + " ".join(f"w{i}" for i in range(1000)) + " \\boxed{78.54}", {}, 0.7),
        (f"<think>{REASON}</think>" + "<tool_call>f()</tool_call>" * 12 + "\\boxed{78.54}", {}, 0.8),
        (f"<think>{REASON}</think>" + "<tool_call>f()</tool_call>" * 30 + "\\boxed{78.54}", {}, 0.5),
        (f"<think>{REASON}</think> \\boxed{{79.5}}", {}, 0.0),
    ],
)
def test_robust_reward(completion, kwargs, expected):
    assert robust_reward(completion, "78.54", "math", **kwargs) == pytest.approx(expected)


def test_robust_reward_registry_signature_and_no_opinion():
    assert robust_reward(f"<think>{REASON}</think> \\boxed{{78.54}}", answer="78.54") == 1.0
    assert robust_reward("\\boxed{1}", answer="???") is None
