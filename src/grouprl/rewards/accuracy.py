"""``accuracy_reward``: one entry point, one function per task type.

=============  =============================================================================
task_type      function
=============  =============================================================================
``math``       ``math_reward`` (final-answer extraction + math-verify + relative tolerance)
``code``       ``grouprl.rewards.code.code_reward`` with ``ground_truth`` as the tests (k/n credit)
``tool_call``  ``tool_call_reward`` (0.5 name + 0.5 exact arguments)
``exact``      ``exact_match_reward`` (normalised full match; the generic branch)
=============  =============================================================================
"""

from __future__ import annotations

from grouprl.errors import ConfigError, did_you_mean
from grouprl.registry import REWARDS
from grouprl.rewards.exact import exact_match_reward
from grouprl.rewards.math_answer import math_reward
from grouprl.rewards.tool_call import tool_call_reward

TASK_TYPES = ("math", "code", "tool_call", "exact")


def _code(completion: str, ground_truth, **meta) -> float | None:
    from grouprl.rewards.code import code_reward  # owned by the sandbox module; imported lazily

    tests = meta.pop("tests", None)
    return code_reward(
        completion, answer=meta.pop("answer", None), tests=ground_truth if tests is None else tests, **meta
    )


@REWARDS.register("accuracy")
def accuracy_reward(
    prediction: str,
    ground_truth=None,
    task_type: str = "math",
    tolerance: float = 1e-2,
    *,
    answer=None,
    **meta,
) -> float | None:
    """Task accuracy in [0, 1] by task_type (math, code, tool_call, exact); None if the truth is unusable.

    ``None`` when the ground truth is missing or cannot be parsed (the sample is skipped, not scored 0).

    ``ground_truth`` and ``answer`` are the same thing (``answer`` is the registry's keyword); extra
    keywords go to the task's function (``strict=True`` for math, ``shaped=True`` for tool calls, ...).

    >>> accuracy_reward("<think>S = pi * 5^2 = 78.54</think><tool_call>calculator(expression='3.14159 * 5**2')</tool_call>", "78.54")
    1.0
    """
    truth = ground_truth if ground_truth is not None else answer
    task_type = task_type or "math"
    if task_type == "math":
        return math_reward(prediction, answer=truth, tolerance=tolerance, **meta)
    if task_type == "code":
        return _code(prediction, truth, **meta)
    if task_type == "tool_call":
        return tool_call_reward(prediction, answer=truth, **meta)
    if task_type in ("exact", "string", "qa"):
        return exact_match_reward(prediction, answer=truth, **meta)
    raise ConfigError(
        f"accuracy_reward: unknown task_type {task_type!r}; use one of {', '.join(TASK_TYPES)}."
        + did_you_mean(str(task_type), TASK_TYPES)
    )


# fixed options (make_reward_func, reward_kwargs) may be any task function's: checked against all of them
accuracy_reward.passes_options_to = (
    math_reward, "grouprl.rewards.code:code_reward", tool_call_reward, exact_match_reward,
)
