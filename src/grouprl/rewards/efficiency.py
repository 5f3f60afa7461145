"""``efficiency_reward``: penalise extra tool calls, overlong output and repetition.

Starts from 1.0 and subtracts:

- steps: ``0.1 * (#<tool_call> - expected_steps)`` when above ``expected_steps``, at most 0.5;
- length: ``0.3 * (n - max_tokens) / max_tokens`` when ``n > max_tokens``, at most 0.3, where ``n``
  counts tokens with ``tokenizer`` (anything with ``encode``, e.g. a Hugging Face tokenizer) and words
  otherwise (a CJK character is one word, unlike a whitespace split that sees a whole Chinese
  paragraph as one word);
- repeated sentences: 0.2 when there are more than 3 sentences and fewer than 70 % are distinct;
  sentences split on English (``. ! ? ;`` before a space) and Chinese (``。！？；``) punctuation and
  newlines (a Chinese-only split would miss English punctuation);
- n-gram repetition (added): ``ngram_penalty * clamp((r - 0.3) / 0.7, 0, 1)`` where ``r`` is the fraction
  of repeated word ``ngram``-grams (needs >= 20 n-grams);
- DAPO soft overlong punishment (added, opt-in with ``overlong_buffer``; arXiv 2503.14476 eq. 13):
  with ``L_max = max_tokens`` and ``L_cache = overlong_buffer``, the penalty is 0 up to
  ``L_max - L_cache``, then grows linearly to 1 at ``L_max`` (``((L_max - L_cache) - n) / L_cache`` in
  the paper's signed form), and 1 beyond. It replaces the linear length penalty.

Clamped to [0, 1]. The worked example (1 call, 19 words, 4 distinct sentences) scores 1.0.

Trajectories (multi-turn tool rollouts, docs/AGENTS.md) are scored on what happened rather than on text:
steps are the tool calls made (``tool_calls``), length and repetition are measured on the model's own turns
(``model_turns``; tool outputs are not the policy's text), and the environment's counters (``env_state``)
are held to the task's budget -- the code-repair template "<= 3 edits, <= 5 iterations" is
``max_edits=3, max_iterations=5``; retrieval's search count is ``max_searches``. Each edit, iteration or
search over its budget costs 0.1, like a step over ``expected_steps``; all these count penalties together
take at most 0.5.
"""

from __future__ import annotations

import re

from grouprl.registry import REWARDS
from grouprl.rewards import _text
from grouprl.rewards._limit import time_limited

_MARKUP = re.compile(r"</?[A-Za-z_][\w-]*>")


def count_length(text: str, tokenizer=None) -> int:
    """Tokens of ``text`` with ``tokenizer`` (no special tokens), else words (CJK characters count one,
    markup tags such as ``<think>`` none)."""
    if tokenizer is None:
        return len(_text.tokens(_MARKUP.sub(" ", text)))
    try:
        return len(tokenizer.encode(text, add_special_tokens=False))
    except TypeError:
        return len(tokenizer.encode(text))


def dapo_overlong_penalty(length: int, max_len: int, buffer: int) -> float:
    """DAPO soft overlong punishment as a penalty in [0, 1] (the paper's R_length, sign flipped).

    >>> dapo_overlong_penalty(350, 400, 100), dapo_overlong_penalty(300, 400, 100), dapo_overlong_penalty(401, 400, 100)
    (0.5, 0.0, 1.0)
    """
    if length <= max_len - buffer:
        return 0.0
    if length <= max_len:
        return (length - (max_len - buffer)) / buffer
    return 1.0


def ngram_repetition(text: str, n: int = 4) -> float:
    """Fraction of word n-grams (markup tags left out) that repeat an earlier one (0.0 below 20 n-grams)."""
    toks = [t.lower() for t in _text.tokens(_MARKUP.sub(" ", text))]
    grams = [tuple(toks[i : i + n]) for i in range(len(toks) - n + 1)]
    if len(grams) < 20:
        return 0.0
    return 1.0 - len(set(grams)) / len(grams)


def count_penalty(steps: int, expected_steps: int, env_state: dict, budgets: dict) -> float:
    """0.1 per tool call over ``expected_steps`` and per counter of ``env_state`` over its budget
    (``budgets``: counter name -> limit or None), at most 0.5 in all.

    >>> count_penalty(5, 3, {"edits": 5, "iterations": 6}, {"edits": 3, "iterations": 5})
    0.5
    """
    extra = max(0, steps - expected_steps)
    for key, limit in budgets.items():
        value = env_state.get(key)
        if limit is not None and isinstance(value, (int, float)) and not isinstance(value, bool):
            extra += max(0, value - limit)
    return min(0.1 * extra, 0.5)


@REWARDS.register("efficiency")
@time_limited
def efficiency_reward(
    completion: str,
    expected_steps: int = 3,
    max_tokens: int = 512,
    *,
    answer=None,
    tokenizer=None,
    overlong_buffer: int | None = None,
    ngram: int = 4,
    ngram_penalty: float = 0.3,
    max_edits: int | None = None,
    max_iterations: int | None = None,
    max_searches: int | None = None,
    tool_calls: list | None = None,
    model_turns: list | None = None,
    env_state: dict | None = None,
    **meta,
) -> float:
    """Efficiency in [0, 1]: 1 minus penalties for extra tool calls, overlong output and repetition.

    See the module docstring for each penalty (plus DAPO's soft overlong option).

    >>> efficiency_reward("<think>r = 5, so S = 25 pi = 78.54</think><tool_call>calc(x='25*pi')</tool_call>")
    1.0
    """
    if model_turns is not None:  # a trajectory: the model's own text, tool outputs left out
        completion = "\n".join(str(t) for t in model_turns)
    steps = len(tool_calls) if tool_calls is not None else completion.count(_text.TOOL_OPEN)
    score = 1.0 - count_penalty(steps, expected_steps, env_state or {},
                                {"edits": max_edits, "iterations": max_iterations, "num_searches": max_searches})
    length = count_length(completion, tokenizer)
    if overlong_buffer:
        score -= dapo_overlong_penalty(length, max_tokens, min(overlong_buffer, max_tokens))
    elif length > max_tokens:
        score -= min(0.3 * (length - max_tokens) / max_tokens, 0.3)
    sents = _text.sentences(completion)
    if len(sents) > 3 and len(set(sents)) / len(sents) < 0.7:
        score -= 0.2
    if ngram_penalty:
        rep = ngram_repetition(completion, ngram)
        score -= ngram_penalty * min(1.0, max(0.0, (rep - 0.3) / 0.7))
    return round(max(0.0, min(1.0, score)), 10)


# fixed options (make_reward_func, reward_kwargs) must be named parameters: **meta only takes dataset columns
efficiency_reward.passes_options_to = ()
