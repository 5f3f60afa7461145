"""digit_match (partial credit per digit place) and reply_match (copy fidelity to the tool's reply)."""

from __future__ import annotations

import pytest

from grouprl.registry import REWARDS
from grouprl.rewards.digits import digit_match_reward, reply_match_reward


def test_digit_match_by_hand():
    assert REWARDS.get("digit_match") is digit_match_reward
    assert digit_match_reward("Answer: 173941", answer="173941") == 1.0
    assert digit_match_reward("Answer: 173841", answer="173941") == pytest.approx(5 / 6)
    assert digit_match_reward("Answer: 1739410", answer="173941") == 0.0  # shifted one place: no place matches
    assert digit_match_reward("Answer: 73941", answer="173941") == pytest.approx(5 / 6)  # units-aligned
    assert digit_match_reward("Answer: -12", answer="12") == 0.0  # sign differs
    assert digit_match_reward("Answer: 1,234", answer="1234") == 1.0
    assert digit_match_reward("Answer: about 12", answer="12") == 0.0  # not an integer
    assert digit_match_reward("Answer: 12", answer="twelve") is None  # no opinion on a non-integer reference
    assert digit_match_reward("Answer: 1\nAnswer: 12", answer="12") == 1.0  # the last answer line counts


def test_reply_match_scores_the_copy_of_the_last_good_reply():
    assert REWARDS.get("reply_match") is reply_match_reward
    calls = [{"name": "calculator", "result": "999", "error": None},
             {"name": "calculator", "result": "174141", "error": None},
             {"name": "calculator", "result": "", "error": "timeout"}]
    assert reply_match_reward("Answer: 174141", answer="173941", tool_calls=calls) == 1.0
    assert reply_match_reward("Answer: 173941", answer="173941", tool_calls=calls) == pytest.approx(4 / 6)
    assert reply_match_reward("Answer: 1", answer="1", tool_calls=[]) == 0.0
    assert reply_match_reward("Answer: 1", answer="1") == 0.0


def test_tool_result_digits_turn_reward():
    from types import SimpleNamespace

    from grouprl.train.turn_credit import TURN_REWARDS

    score = TURN_REWARDS["tool_result_digits"]
    traj = SimpleNamespace(tool_calls=[{"result": "174141", "error": None}, {"result": "173941", "error": "x"}])
    assert score(traj, "173941") == pytest.approx(4 / 6)  # the failed call's text does not count
    assert score(SimpleNamespace(tool_calls=[]), "173941") == 0.0
    assert score(traj, None) != score(traj, None)  # NaN: no reference, no opinion
