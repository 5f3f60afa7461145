"""Reward plug-ins, one in each of the two accepted forms.

Per-sample: ``fn(completion, *, answer=None, **meta) -> float | None`` (one completion, its answer).
Batch, TRL's ``reward_funcs`` signature: ``fn(completions, **kwargs) -> list[float | None]`` (dataset
columns arrive as lists, one value per completion). grouprl tells them apart by the parameter name
``completions`` (``grouprl.rewards.adapters.reward_form``).
"""

from __future__ import annotations

import re

from grouprl.registry import REWARDS


@REWARDS.register("mentions_answer")
def mentions_answer(completion, *, answer=None, **meta):
    """1.0 when the reference answer appears as a whole number/word in the completion, else 0.0;
    None (no opinion) when the row has no answer.

    >>> [mentions_answer(c, answer="12") for c in ("so it is 12.", "112", "12.5")]
    [1.0, 0.0, 0.0]
    """
    if answer is None:
        return None
    return 1.0 if re.search(rf"(?<![\w.-]){re.escape(str(answer))}(?!\w|\.\d)", completion) else 0.0


def length_penalty(completions, target_chars: int = 40, **kwargs):
    """Batch form: 1 - |len - target| / target, floored at 0, for each completion (text or chat messages).

    >>> length_penalty(["x" * 40, "x" * 20, "x" * 100])
    [1.0, 0.5, 0.0]
    """
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    return [max(0.0, 1.0 - abs(len(t) - target_chars) / target_chars) for t in texts]
