"""Rewards that cannot be fooled by big numbers or slowed down by pathological text.

Integers compare exactly at any size; overflowing exponents never equal a finite answer; brace
scanning is linear; every reward's whole work on a long completion runs under its time limit.
"""

from __future__ import annotations

import sys
import textwrap
import time

import pytest

from grouprl.rewards import (
    _limit,
    _text,
    accuracy_reward,
    composite_reward,
    efficiency_reward,
    exact_match_reward,
    format_reward,
    math_reward,
    robust_reward,
    safety_reward,
)

# (prediction, gold, expected): before the fix the first six scored 1.0
BIG_NUMBERS = [
    ("1000000006", "1000000007", 0.0),  # |diff| <= 1e-9 * |gold| passed as "exact"
    ("2147483647", "2147483648", 0.0),
    ("123456789012345678901234567890", "123456789012345678901234567891", 0.0),
    ("3e9999", "3", 0.0),  # math-verify reads the mantissa only
    ("1e999999", "1", 0.0),
    ("3e9999 apples", "3", 0.0),
    ("1e999", "1", 0.0),  # overflows a float
    ("1000000007", "1000000007", 1.0),
    ("1,000,000,007", "1000000007", 1.0),
    ("10^9+7", "1000000007", 1.0),  # math-verify path, exact sympy integers
    ("10^9+6", "1000000007", 0.0),
    ("1e3", "1000", 1.0),
    ("2.5e-3", "0.0025", 1.0),
    ("\\frac{1}{2}", "0.5", 1.0),
    ("0.5", "\\frac{1}{2}", 1.0),
    ("12.5\\%", "0.125", 1.0),
    ("78.5", "78.54", 1.0),  # 1 % relative tolerance for a non-integer gold
    ("3.0", "3", 1.0),
    ("3.5", "3", 0.0),
]


@pytest.mark.parametrize("pred,gold,expected", BIG_NUMBERS)
def test_numbers_compare_exactly(pred, gold, expected):
    assert math_reward(f"Answer: {pred}", answer=gold) == expected
    assert accuracy_reward(f"<think>work</think>\\boxed{{{pred}}}", gold) == expected


def test_integer_exact_off_uses_the_relative_tolerance():
    assert math_reward("Answer: 1000000006", answer="1000000007", integer_exact=False) == 1.0
    assert math_reward("Answer: 1e999999", answer="1", integer_exact=False) == 0.0


def test_find_boxed_matches_braces_like_a_stack():
    text = r"\boxed{\frac{1}{2}} { \boxed{ \boxed{3} } } \fbox{x} \boxed{4"
    assert _text.find_boxed(text) == [r"\frac{1}{2}", r"\boxed{3}", "3", "x"]
    assert _text.find_boxed("}} \\boxed{5} }") == ["5"]
    assert _text.find_boxed("\\boxed{" + "a" * 50 + "}", max_chars=10) == ["a" * 10]


def test_tag_blocks_match_the_lazy_regex():
    blocks, outside = _text.answer_blocks("a<answer> 1 </answer>b<answer>2</answer><answer>3")
    assert blocks == ["1", "2"] and outside.split() == ["a", "b", "<answer>3"]


PATHOLOGICAL = {
    "unclosed boxed x 20k": "\\boxed{" * 20_000,
    "nested boxed x 20k": "\\boxed{" * 20_000 + "}" * 20_000,
    "nested braces 100k": "{" * 100_000 + "}" * 100_000,
    "1 MB of digits": "Answer: " + "1" * 1_000_000,
    "unclosed answer x 20k": "<answer>" * 20_000,
    "unclosed tool_call x 20k": "<tool_call>" * 20_000,
    "1000 different boxed": "".join(f"\\boxed{{{i}}}" for i in range(1000)),
    "curl x 20k (pipe-to-shell scan)": "curl " * 20_000,
    "a. x 50k (e-mail scan)": "a." * 50_000,
    "1- x 50k (e-mail scan)": "1-" * 50_000,
}
REWARDS = {
    "accuracy": lambda c: accuracy_reward(c, "3"),
    "math": lambda c: math_reward(c, answer="3"),
    "composite": lambda c: composite_reward(c, answer="3"),
    "robust": lambda c: robust_reward(c, "3"),
    "format": format_reward,
    "efficiency": efficiency_reward,
    "safety": safety_reward,
    "exact": lambda c: exact_match_reward(c, answer="3"),
}


@pytest.mark.parametrize("kind", list(PATHOLOGICAL))
@pytest.mark.parametrize("reward", list(REWARDS))
def test_pathological_completion_is_scored_fast(kind, reward):
    math_reward("warm up the worker " + "x" * (_limit.INPROCESS_CHARS + 1), answer="3")
    start = time.perf_counter()
    score = REWARDS[reward](PATHOLOGICAL[kind])
    # bounded by the reward's time limit (the worker is killed after it), not minutes; the typical time of
    # each case (well under 1 s) is measured by benchmarks/rewards_throughput.py, not asserted here
    assert time.perf_counter() - start < _limit.DEFAULT_TIME_LIMIT + 5.0
    if reward in ("accuracy", "math", "exact"):
        assert score == 0.0


SLOW_MODULE = """
import time
from grouprl.rewards._limit import time_limited

@time_limited(fallback=-1.0)
def slow_reward(completion, *, answer=None, time_limit=5.0, seconds=0.0):
    time.sleep(seconds)
    return 1.0

@time_limited
def failing_reward(completion, **meta):
    raise ValueError("bad option")
"""


@pytest.fixture
def slow_module(tmp_path, monkeypatch):
    (tmp_path / "slow_rewards_mod.py").write_text(textwrap.dedent(SLOW_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{':'.join(p for p in sys.path if p)}")
    _limit._WORKER.kill()  # the next call starts a worker that can import the module
    import slow_rewards_mod

    yield slow_rewards_mod
    _limit._WORKER.kill()
    sys.modules.pop("slow_rewards_mod", None)


def test_whole_reward_runs_under_its_time_limit(slow_module):
    long = "x" * (_limit.INPROCESS_CHARS + 1)
    assert slow_module.slow_reward(long, seconds=0.0) == 1.0  # in the worker, fast
    start = time.perf_counter()
    assert slow_module.slow_reward(long, seconds=30.0, time_limit=0.5) == -1.0  # killed: the fallback
    assert time.perf_counter() - start < 5.0
    assert slow_module.slow_reward("short", seconds=0.0, time_limit=0.5) == 1.0  # in-process
    with pytest.raises(ValueError, match="bad option"):  # errors reach the caller from the worker
        slow_module.failing_reward(long)
