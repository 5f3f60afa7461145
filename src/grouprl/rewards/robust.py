"""``robust_reward``: accuracy with anti-hacking defences.

``accuracy_reward`` times a factor for each defence that fires:

1. incoherent reasoning: the think content (also when the chat template opened ``<think>``) has
   ``text_coherence`` below ``coherence_threshold`` -> x ``incoherent_factor`` (defaults: 0.5 below 0.5).
   ``text_coherence`` also catches letter gibberish and repetition, which a valid-character ratio
   passes;
2. overlong output: more than ``max_words`` words (tokens with ``tokenizer``) -> x 0.7;
3. tool-call flooding: ``n > max_tool_calls`` calls -> x ``max(0.5, 1 - 0.05 (n - max_tool_calls))``.

A fourth defence ("the answer comes from the reasoning") is not implemented; number spam and hedged
answers are already refused by the math extraction.
"""

from __future__ import annotations

from grouprl.registry import REWARDS
from grouprl.rewards import _text
from grouprl.rewards._limit import time_limited
from grouprl.rewards.accuracy import accuracy_reward
from grouprl.rewards.coherence import text_coherence
from grouprl.rewards.efficiency import count_length


@REWARDS.register("robust")
@time_limited(in_process=lambda args, kw: (args[1] if len(args) > 1 else kw.get("task_type")) == "code")
def robust_reward(
    completion: str,
    ground_truth=None,
    task_type: str = "math",
    *,
    answer=None,
    coherence_threshold: float = 0.5,
    incoherent_factor: float = 0.5,
    max_words: int = 1000,
    max_tool_calls: int = 8,
    tokenizer=None,
    **meta,
) -> float | None:
    """Accuracy scaled down for incoherent reasoning, overlong output and tool-call floods.

    ``None`` when accuracy has no opinion; see the module docstring for each factor.

    >>> robust_reward("<think>qwpoe zmxn asdkj lkjh poiu mnbv zxcv qwer</think> \\\\boxed{4}", "4")
    0.5
    """
    base = accuracy_reward(completion, ground_truth, task_type, answer=answer, **meta)
    if base is None:
        return None
    if _text.THINK_CLOSE in completion:
        if text_coherence(_text.split_think(completion).reasoning) < coherence_threshold:
            base *= incoherent_factor
    if count_length(completion, tokenizer) > max_words:
        base *= 0.7
    calls = completion.count(_text.TOOL_OPEN)
    if calls > max_tool_calls:
        base *= max(0.5, 1.0 - 0.05 * (calls - max_tool_calls))
    return base


robust_reward.passes_options_to = (accuracy_reward,)  # other options go to accuracy_reward
