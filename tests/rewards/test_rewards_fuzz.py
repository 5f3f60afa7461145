"""hypothesis fuzzing: no reward raises on any string, scores stay in range, results are deterministic."""

from __future__ import annotations

import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grouprl.rewards import (
    accuracy_reward,
    composite_reward,
    efficiency_reward,
    exact_match_reward,
    extract_answer,
    format_reward,
    math_reward,
    parse_tool_call,
    robust_reward,
    safety_reward,
    text_coherence,
    tool_call_reward,
)

# Fragments that steer random text into the parsers' interesting paths.
FRAGMENTS = [
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "\\boxed{",
    "}",
    "{",
    "Answer:",
    "答案：",
    "78.54",
    "25\\pi",
    "\\frac{1}{2}",
    "1,000",
    "-3",
    "^",
    "**",
    "!",
    "(",
    ")",
    "=",
    " ",
    "\n",
    "。",
    ". ",
    "rm -rf /",
    "DELETE FROM t",
    " WHERE ",
    "sudo",
    "eval(",
    "bob@corp.com",
    "123-45-6789",
    "13800138000",
    "f(x=1)",
    '{"name": "f", "arguments": {"x": 1}}',
    "sk-" + "a" * 40,
    "```",
    "$",
    "\\",
    "x",
    "the",
    "汉字",
]
TEXT = st.one_of(
    st.text(max_size=300),
    st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=8)), max_size=40).map("".join),
)
FUZZ = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])

UNIT = [
    lambda c: math_reward(c, answer="78.54", time_limit=2.0),
    lambda c: accuracy_reward(c, "f(x=1)", task_type="tool_call"),
    lambda c: tool_call_reward(c, answer="f(x=1)", shaped=True),
    lambda c: exact_match_reward(c, answer="Paris", case_sensitive=False),
    format_reward,
    efficiency_reward,
    safety_reward,
    lambda c: robust_reward(c, "78.54", time_limit=2.0),
    lambda c: composite_reward(c, answer="78.54", time_limit=2.0),
]


def _check(score):
    assert score is None or (isinstance(score, float) and math.isfinite(score) and 0.0 <= score <= 1.0), score


@FUZZ
@given(TEXT)
def test_rewards_never_raise_stay_in_range_and_are_deterministic(text):
    for fn in UNIT:
        first = fn(text)
        _check(first)
        assert fn(text) == first


@FUZZ
@given(TEXT, TEXT)
def test_any_ground_truth_is_handled(text, gold):
    for score in (
        math_reward(text, answer=gold, time_limit=2.0),
        exact_match_reward(text, answer=gold),
        tool_call_reward(text, answer=gold),
    ):
        _check(score)


@FUZZ
@given(TEXT)
def test_helpers_never_raise(text):
    answer = extract_answer(text)
    assert answer is None or isinstance(answer, str)
    call = parse_tool_call(text)
    assert call is None or (isinstance(call["name"], str) and isinstance(call["arguments"], dict))
    assert 0.0 <= text_coherence(text) <= 1.0


def test_every_registered_reward_honours_the_registry_contract():
    """fn(completion, *, answer=None, **meta) -> float in [0, 1] or None, with a one-line description."""
    from grouprl.builtins import load_builtins
    from grouprl.registry import REWARDS

    load_builtins()
    samples = ["", "<think>why</think>\\boxed{2}", "<tool_call>f(x=1)</tool_call>", "rm -rf / 答案：2"]
    for name, fn in REWARDS.items():
        assert REWARDS.describe(name), name
        if name == "code":  # runs the sandbox: covered by the sandbox tests
            continue
        if name in ("judge", "reward_model", "retrieval"):  # batch rewards needing an endpoint, a model or the
            continue  # trajectory's tool calls: tests/judge covers them
        for completion in samples:
            for answer in (None, "2", "f(x=1)"):
                _check(fn(completion, answer=answer, unknown_column=[1, 2]))
