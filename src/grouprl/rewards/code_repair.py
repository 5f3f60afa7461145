"""Rewards of a code-repair trajectory (the ``python`` environment): ``tests_passed`` and ``code_repair``.

``tests_passed``: k/n, the fraction of the row's tests that the FINAL file passes -- the environment's own
``get_reward()`` (a sandboxed run of the file as the trajectory left it; an unchanged file is not run
again), or, without the environment object, ``passed / total`` of the trajectory's last test run
(``env_state``). The execution reward of code RL (CodeRL, arXiv:2207.01780) and the held-out metric of
recipes/code_repair.yaml.

``code_repair``: the code template of the multi-dimensional reward (:data:`grouprl.rewards.composite.
code_reward_config`), scored on the trajectory rather than on one text::

    R = 0.50 accuracy + 0.10 format + 0.25 efficiency + 0.15 safety

- accuracy: ``tests_passed`` (k/n of the final file);
- format: the fraction of the model's turns that are well formed -- a turn whose tool calls all parsed and
  named a known tool with valid arguments, or the final answer (a call that ran but failed, such as an
  ``edit`` whose text is not in the file, is well formed);
- efficiency: :func:`grouprl.rewards.efficiency.efficiency_reward` on the trajectory with the template's
  budgets: at most ``expected_steps`` (3) tool calls, ``max_edits`` (3) file edits and ``max_iterations``
  (5) test runs, 0.1 off per call, edit or run over its budget (at most 0.5), the model's own text
  held to ``max_tokens`` (1024);
- safety: :func:`grouprl.rewards.safety.safety_reward` on the model's turns and every call that ran.

``efficiency_on_success=True`` pays the efficiency term only on a trajectory whose final file passes every
test (k/n = 1), 0 otherwise, as length/efficiency penalties are applied only to correct responses in Kimi
k1.5 (arXiv 2501.12599, Sec. 2.3.3): the efficiency of a failed repair is meaningless, and paying it in
full rewards doing nothing -- answering at once (0 tool calls) earns format 1, efficiency 1 and safety 1,
so stopping is never worse than a failed attempt. ``format_on_success=True`` does the same for the format
term. With both, a failure earns at most 0.5 k/n + 0.15 safety and a repair 1.0.

``clean_success=True`` counts a repair as a success for those two options only when it also ended cleanly
(:func:`ended_cleanly`): the model answered (``end_reason`` ``answered``), none of its calls was malformed,
named an unknown tool or had invalid arguments, and it ran the tests after its last edit. Without it, a policy
that makes the right edit and then writes a broken call instead of testing keeps nearly all of a clean
repair's reward (k/n is scored on the final file whatever follows; one bad turn of four costs 0.025 of
format), and RL drifts there: in recipes/code_repair.yaml one seed pair stopped running the tests at all. The
agent's own check of its work is the behaviour the code template pays efficiency for (SWE-agent, arXiv
2405.15793, and SWE-bench agents end on a passing test run).

``include_accuracy=False`` leaves the accuracy term out (0.10 f + 0.25 e + 0.15 s): for a run whose
environment adds its k/n to the total itself (the trainer adds ``get_reward()``, TRL's rule), so that with
``reward_weights: [2.0]`` the total is ``k/n + 2 (0.10 f + 0.25 e + 0.15 s)``, exactly twice the template's
R; GRPO's group z-score is unchanged by the factor 2.
"""

from __future__ import annotations

from typing import Any

from grouprl.registry import REWARDS
from grouprl.rewards.composite import code_reward_config
from grouprl.rewards.efficiency import efficiency_reward
from grouprl.rewards.safety import safety_reward

_FORMAT_ERRORS = ("malformed", "unknown_tool", "bad_arguments")
_EDIT_TOOLS = ("edit", "write")
_TEST_TOOL = "run_tests"


def _final_file_score(environments: Any, env_state: Any) -> float | None:
    env = getattr(environments, "instance", environments)
    if env is not None and callable(getattr(env, "get_reward", None)):
        return env.get_reward()
    state = env_state if isinstance(env_state, dict) else {}
    total = state.get("total")
    if isinstance(total, int) and total > 0:
        return state.get("passed", 0) / total
    return None


@REWARDS.register("tests_passed")
def tests_passed_reward(completion: str, *, answer=None, environments: Any = None, env_state: Any = None,
                        **meta) -> float | None:
    """Fraction of the row's tests that the final file of a repair trajectory passes (k/n).

    See the module docstring; ``None`` when nothing says (no environment object and no test run in
    ``env_state``, or the sandbox itself failed).

    >>> tests_passed_reward("Done.", env_state={"passed": 2, "total": 3})
    0.6666666666666666
    """
    return _final_file_score(environments, env_state)


def format_score(model_turns: list | None, tool_calls: list | None) -> float:
    """Fraction of well-formed model turns: every turn but the last called tools; a turn is well formed when
    none of its calls failed to parse, named an unknown tool or had invalid arguments. The calls are matched
    to turns in order, one tool turn per model turn that called (the rollout's order)."""
    turns = list(model_turns or [])
    if not turns:
        return 0.0
    bad = sum(c.get("error") in _FORMAT_ERRORS for c in tool_calls or [])
    return max(0.0, (len(turns) - min(bad, len(turns))) / len(turns))


def ended_cleanly(tool_calls: list | None, end_reason: str | None = None) -> bool:
    """Whether a repair trajectory ended as a finished repair: it answered (``end_reason`` ``"answered"``;
    unknown counts as answered), no call was malformed, named an unknown tool or had invalid arguments, and a
    test run (``run_tests`` that ran) came after its last applied ``edit`` / ``write`` (no edit: nothing to
    check).

    >>> ok = {"error": None}
    >>> ended_cleanly([{"name": "edit", **ok}, {"name": "run_tests", **ok}], "answered")
    True
    >>> ended_cleanly([{"name": "edit", **ok}, {"name": None, "error": "malformed"}], "tool_error_budget")
    False
    >>> ended_cleanly([{"name": "run_tests", **ok}, {"name": "edit", **ok}], "answered")  # edited after its last run
    False
    """
    calls = list(tool_calls or [])
    if end_reason not in (None, "", "answered") or any(c.get("error") in _FORMAT_ERRORS for c in calls):
        return False
    edits = [i for i, c in enumerate(calls) if c.get("name") in _EDIT_TOOLS and c.get("error") is None]
    return not edits or any(c.get("name") == _TEST_TOOL and c.get("error") is None for c in calls[edits[-1] + 1:])


@REWARDS.register("code_repair")
def code_repair_reward(completion: str, *, answer=None, include_accuracy: bool = True, max_edits: int = 3,
                       max_iterations: int = 5, efficiency_on_success: bool = False, format_on_success: bool = False,
                       clean_success: bool = False, model_turns: list | None = None, tool_calls: list | None = None,
                       end_reason: str | None = None, env_state: Any = None, environments: Any = None,
                       **meta) -> float | None:
    """The code template's weighted total on a repair trajectory (0.5 k/n + 0.1 format + 0.25 efficiency + 0.15 safety).

    See the module docstring; ``None`` when the accuracy is unknown (see :func:`tests_passed_reward`) and
    ``include_accuracy`` is on.

    >>> calls = [{"name": "view", "arguments": {}, "error": None}, {"name": "edit", "arguments": {}, "error": None},
    ...          {"name": "run_tests", "arguments": {}, "error": None}]
    >>> turns = ["<tool_call>view()</tool_call>", "<tool_call>edit(...)</tool_call>", "<tool_call>run_tests()</tool_call>",
    ...          "Done."]
    >>> state = {"passed": 3, "total": 3, "edits": 1, "iterations": 1}
    >>> code_repair_reward("Done.", model_turns=turns, tool_calls=calls, env_state=state)
    1.0
    >>> round(code_repair_reward("Done.", model_turns=turns, tool_calls=calls, env_state={**state, "passed": 1}), 6)
    0.666667
    >>> round(code_repair_reward("Done.", model_turns=turns, tool_calls=calls, env_state={**state, "passed": 1},
    ...                          efficiency_on_success=True), 6)
    0.416667
    """
    cfg = code_reward_config
    state = env_state if isinstance(env_state, dict) else {}
    turns = model_turns if model_turns is not None else [completion]
    needs_accuracy = include_accuracy or efficiency_on_success or format_on_success
    accuracy = _final_file_score(environments, state) if needs_accuracy else None
    if needs_accuracy and accuracy is None:
        return None
    solved = accuracy is not None and accuracy >= 1.0 and (not clean_success or ended_cleanly(tool_calls, end_reason))
    efficiency = 0.0 if efficiency_on_success and not solved else efficiency_reward(
        completion, cfg.expected_steps, cfg.max_tokens, tool_calls=tool_calls or [], model_turns=turns,
        env_state=state, max_edits=max_edits, max_iterations=max_iterations)
    fmt = 0.0 if format_on_success and not solved else format_score(turns, tool_calls)
    rest = (cfg.format_weight * fmt + cfg.efficiency_weight * efficiency
            + cfg.safety_weight * safety_reward(completion, tool_calls=tool_calls or [], model_turns=turns))
    return cfg.accuracy_weight * accuracy + rest if include_accuracy else rest


# fixed options (make_reward_func, reward_kwargs) must be named parameters: **meta only takes dataset columns
code_repair_reward.passes_options_to = ()
tests_passed_reward.passes_options_to = ()
