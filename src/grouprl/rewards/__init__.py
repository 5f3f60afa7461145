"""Reward functions: pure Python, string in, float out (no torch, no trainer state).

Every reward is registered in ``grouprl.registry.REWARDS`` with the signature
``fn(completion: str, *, answer=None, **meta) -> float | None`` (``None`` = no opinion, e.g. the
ground truth cannot be parsed; the trainer leaves such samples out of the group statistics):

=============  ===========================================================================
name           function
=============  ===========================================================================
accuracy       ``accuracy_reward`` (dispatches on ``task_type``)
math           ``math_reward``: final-answer extraction + math-verify + relative tolerance
exact          ``exact_match_reward``: normalised full match, no substring credit
tool_call      ``tool_call_reward``: 0.5 name + 0.5 arguments; shaped / schema options
code           ``code_reward`` (``grouprl.rewards.code``, sandboxed tests, k/n credit)
format         ``format_reward``: think/tool-call tags, hardened
efficiency     ``efficiency_reward``: steps, length (DAPO overlong option), repetition
safety         ``safety_reward`` (+ ``safety_report`` for the hits and their categories)
robust         ``robust_reward``: accuracy with anti-hacking defences
composite      ``composite_reward``: ``AgentRewardFunction`` total
countdown      ``countdown_reward``: the expression uses each number once and reaches the target
digit_match    ``digit_match_reward``: partial credit, the fraction of an integer answer's digits in place
judge          ``judge_reward``: an LLM judge over an OpenAI-compatible endpoint (batch form)
retrieval      ``retrieval_reward``: judge + citation/answer/efficiency/safety rules (batch form)
reasoning_gym  ``reasoning_gym_reward``: a reasoning-gym task's own ``score_answer`` on the answer
code_repair    ``code_repair_reward``: the code template (0.5 k/n tests + format + efficiency + safety) of a repair trajectory
tests_passed   ``tests_passed_reward``: k/n tests the final file of a repair trajectory passes
=============  ===========================================================================

``make_reward_func`` turns any of them -- and any user function in either form, per-sample or TRL's
batch ``fn(prompts, completions, **kwargs) -> list`` (see ``reward_form``) -- into a TRL
``reward_funcs`` callable; ``compute_score`` is the verl-style entry point.
"""

from __future__ import annotations

from grouprl.rewards.accuracy import accuracy_reward
from grouprl.rewards.adapters import (
    as_sample_reward,
    batch_reward,
    completion_text,
    compute_score,
    make_reward_func,
    reward_form,
    sample_reward,
)
from grouprl.rewards.code_repair import code_repair_reward, tests_passed_reward
from grouprl.rewards.coherence import text_coherence
from grouprl.rewards.composite import (
    AgentRewardFunction,
    RewardConfig,
    WeightSchedule,
    code_reward_config,
    composite_reward,
    format_first_schedule,
    math_reward_config,
    retrieval_reward_config,
)
from grouprl.rewards.countdown import countdown_reward
from grouprl.rewards.digits import digit_match_reward
from grouprl.rewards.efficiency import dapo_overlong_penalty, efficiency_reward
from grouprl.rewards.exact import exact_match_reward
from grouprl.rewards.format import format_reward
from grouprl.rewards.judge import judge_agreement, judge_reward
from grouprl.rewards.math_answer import extract_answer, math_reward
from grouprl.rewards.reasoning_gym import reasoning_gym_reward
from grouprl.rewards.retrieval import retrieval_reward
from grouprl.rewards.robust import robust_reward
from grouprl.rewards.safety import SafetyHit, safety_report, safety_reward
from grouprl.rewards.tool_call import parse_tool_call, tool_call_reward

try:
    from grouprl.rewards import code  # noqa: F401  (registers "code"; written by the sandbox module)
except ImportError:
    pass

__all__ = [
    "AgentRewardFunction",
    "RewardConfig",
    "SafetyHit",
    "WeightSchedule",
    "accuracy_reward",
    "as_sample_reward",
    "batch_reward",
    "code_repair_reward",
    "code_reward_config",
    "completion_text",
    "composite_reward",
    "compute_score",
    "reasoning_gym_reward",
    "countdown_reward",
    "dapo_overlong_penalty",
    "digit_match_reward",
    "efficiency_reward",
    "exact_match_reward",
    "extract_answer",
    "format_first_schedule",
    "format_reward",
    "judge_agreement",
    "judge_reward",
    "make_reward_func",
    "math_reward",
    "math_reward_config",
    "parse_tool_call",
    "retrieval_reward",
    "retrieval_reward_config",
    "reward_form",
    "robust_reward",
    "safety_report",
    "safety_reward",
    "sample_reward",
    "tests_passed_reward",
    "text_coherence",
    "tool_call_reward",
]
