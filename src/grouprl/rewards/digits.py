"""``digit_match_reward``: partial credit for an integer answer, the fraction of its digits in place.

Exact-match accuracy gives a group no signal while every sample is wrong, which is where a small model
that calls a tool but miscopies its reply starts (one wrong digit of six scores 0, like a guess). This
reward scores the last ``Answer:`` line's integer against the reference digit by digit, aligned on
the units digit (place value): ``k`` matching places out of ``max(len(pred), len(ref))``. A copy with
one wrong digit of six scores 5/6, a head guess that only gets the size and the last digit ~2/6, the
exact answer 1. Used next to ``accuracy`` (``reward_funcs: [accuracy, digit_match]``), it ranks
near-misses above guesses without paying more than the exact answer.
"""

from __future__ import annotations

import re

from grouprl.registry import REWARDS
from grouprl.rewards import _text

_INTEGER = re.compile(r"^[+-]?\d+$")


def _integer(text: str) -> str | None:
    text = text.strip().replace(",", "")
    return text.lstrip("+") if _INTEGER.match(text) else None


@REWARDS.register("digit_match")
def digit_match_reward(completion: str, *, answer=None, **meta) -> float | None:
    """Partial credit: the fraction of the reference integer's digit places that the answer matches.

    Places are aligned on the units digit; the answer is the integer of the last ``Answer:`` line.
    ``None`` when the reference is not an integer (no opinion); 0.0 when the completion has no
    ``Answer:`` line or the line is not an integer, or the signs differ.

    >>> digit_match_reward("Answer: 173941", answer="173941")
    1.0
    >>> digit_match_reward("Answer: 173841", answer="173941")  # one place of six wrong
    0.8333333333333334
    >>> digit_match_reward("Answer: 73941", answer="173941")  # a digit short: 5 places of 6
    0.8333333333333334
    >>> digit_match_reward("Answer: 12", answer="173941"), digit_match_reward("no answer", answer="7")
    (0.0, 0.0)
    """
    ref = _integer(str(answer)) if answer is not None else None
    if ref is None:
        return None
    lines = _text.find_answer_lines(completion)
    pred = _integer(lines[-1]) if lines else None
    if pred is None or pred.startswith("-") != ref.startswith("-"):
        return 0.0
    p, r = pred.lstrip("-")[::-1], ref.lstrip("-")[::-1]
    return sum(a == b for a, b in zip(p, r)) / max(len(p), len(r))


@REWARDS.register("reply_match")
def reply_match_reward(completion: str, *, answer=None, tool_calls=None, **meta) -> float | None:
    """Copy fidelity: the digit match of the final answer against the last successful tool reply.

    Scores how faithfully the answer copies what the tool returned, right or wrong: paired with a
    turn reward for the call itself (``advantage: mt_grpo``, ``turn_reward: tool_result_digits``) each
    turn is credited for its own step. 0.0 when no tool call succeeded with an integer reply.

    >>> calls = [{"name": "calculator", "result": "174141", "error": None}]
    >>> reply_match_reward("Answer: 174141", answer="173941", tool_calls=calls)
    1.0
    >>> reply_match_reward("Answer: 173941", answer="173941", tool_calls=calls)  # not what the tool said
    0.6666666666666666
    """
    replies = [c.get("result") for c in (tool_calls or []) if c.get("error") is None]
    reply = _integer(str(replies[-1])) if replies else None
    if reply is None:
        return 0.0
    return digit_match_reward(completion, answer=reply)
