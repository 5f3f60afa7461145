"""Exact match: the final answer equals the reference after normalisation, and nothing else counts.

Normalisation: Unicode NFKC, whitespace runs collapsed, surrounding whitespace and one trailing full
stop removed; ``case_sensitive=False`` also folds case. The compared text is what follows ``</think>``
(the whole completion when there is no think block); when that text is a single ``<answer>...</answer>``
block (DeepSeek-R1 format), its content. There is no substring or prefix credit: partial
credit for "contains the answer" teaches a policy to print everything (or, with prefix credit,
nothing).
"""

from __future__ import annotations

import unicodedata

from grouprl.registry import REWARDS
from grouprl.rewards import _text
from grouprl.rewards._limit import time_limited


def normalize_text(text: str, *, case_sensitive: bool = True) -> str:
    """NFKC, collapsed whitespace, stripped, one trailing '.'/'。' removed, optionally case-folded."""
    s = " ".join(unicodedata.normalize("NFKC", text).split())
    if s.endswith((".", "。")):
        s = s[:-1].rstrip()
    return s if case_sensitive else s.casefold()


@REWARDS.register("exact")
@time_limited
def exact_match_reward(completion: str, *, answer=None, case_sensitive: bool = True, **meta) -> float | None:
    """1.0 when the final answer equals the gold answer after normalisation; no substring credit.

    ``answer`` may be a list of accepted answers; see :func:`normalize_text` for the normalisation
    (case is folded only with ``case_sensitive=False``).

    >>> exact_match_reward("<think>capital of France</think> Paris.", answer="paris", case_sensitive=False)
    1.0
    >>> exact_match_reward("Paris, Lyon, Marseille", answer="Paris")
    0.0
    >>> exact_match_reward("<think>capital of France</think><answer>Paris</answer>", answer="Paris")
    1.0
    """
    if answer is None:
        return None
    golds = answer if isinstance(answer, (list, tuple)) else [answer]
    golds = [normalize_text(str(g), case_sensitive=case_sensitive) for g in golds if g is not None]
    golds = [g for g in golds if g]
    if not golds:
        return None
    split = _text.split_think(completion)
    final = split.final if split.final is not None else completion
    blocks, outside = _text.answer_blocks(final)
    if len(blocks) == 1 and not outside.strip():
        final = blocks[0]
    pred = normalize_text(final, case_sensitive=case_sensitive)
    return 1.0 if pred in golds else 0.0


# fixed options (make_reward_func, reward_kwargs) must be named parameters: **meta only takes dataset columns
exact_match_reward.passes_options_to = ()
