"""The ``code`` reward: run the model's program against tests in the sandbox, score k/n passed.

Worked example::

    >>> code_reward("```python\\ndef add(a, b):\\n    return a + b\\n```",
    ...             tests=["assert add(1, 2) == 3", "assert add(2, 2) == 5"])
    0.5

The code is the last fenced ``python`` block of the completion (else the last fenced block of any
language tag), or the whole completion when it parses as Python. Tests can be assert lines, (input,
expected) pairs, or a HumanEval ``check(candidate)`` function with ``entry_point=`` (see
``grouprl.sandbox.suite``). A completion with no code scores 0. Timeouts, crashes and sandbox failures
are kept apart from wrong answers in :func:`code_reward_details` so they can be logged; they score 0,
except a sandbox failure that happened before any of the model's code ran, which scores None ("no
opinion": the trainer leaves it out of the group statistics).

The reward is a thin, picklable wrapper; all the isolation lives in ``grouprl.sandbox``.
"""

from __future__ import annotations

import ast
import re
from typing import Any

from grouprl.registry import REWARDS

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+.-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)
_PY_TAGS = {"python", "py", "python3", "py3"}
_TEST_KEYS = ("tests", "test", "test_list")


def extract_code(completion: str) -> str | None:
    """The program in ``completion``: last ```python block, else last fenced block, else bare code."""
    if not isinstance(completion, str) or not completion.strip():
        return None
    blocks = [(tag.lower(), body) for tag, body in _FENCE.findall(completion)]
    python_blocks = [body for tag, body in blocks if tag in _PY_TAGS]
    if python_blocks:
        return python_blocks[-1]
    if blocks:
        return blocks[-1][1]
    try:
        ast.parse(completion)
    except SyntaxError:
        return None
    return completion


def _defines(code: str, name: str) -> bool:
    return re.search(rf"^\s*(async\s+)?def\s+{re.escape(name)}\s*\(", code, re.MULTILINE) is not None


def _tests_from(answer: Any, tests: Any, meta: dict[str, Any]) -> Any:
    if tests is not None:
        return tests
    for key in _TEST_KEYS[1:]:
        if meta.get(key) is not None:
            return meta[key]
    return answer


def prepare_job(completion: str, *, answer: Any = None, tests: Any = None, entry_point: str | None = None,
                prompt: str | None = None, **meta: Any):
    """The sandbox job for one completion: a :class:`~grouprl.sandbox.CodeJob` (``code`` None when the
    completion holds no code). With ``prompt`` and ``entry_point`` the prompt is prepended: a completion
    that defines ``entry_point`` replaces the prompt's stub, one that does not continues its body."""
    from grouprl.sandbox import CodeJob, normalize_tests

    suite_src = _tests_from(answer, tests, meta)
    if suite_src is None:
        from grouprl.errors import DataError

        raise DataError("code reward: no tests given; pass tests= (or a 'test'/'test_list' column, or answer=)")
    suite = normalize_tests(suite_src, entry_point=entry_point)
    code = extract_code(completion)
    if code is not None and entry_point and prompt:
        # a full function redefines the prompt's stub (and keeps the prompt's imports); a bare body
        # continues the prompt's function
        code = prompt + ("\n" + code if _defines(code, entry_point) else code)
    if code is None and prompt and entry_point and isinstance(completion, str) and completion.strip():
        code = prompt + completion
    return CodeJob(code, suite, entry_point)


def code_reward_details(completion: str, *, timeout: float = 10.0, isolation: str = "auto", **kwargs: Any):
    """Run the completion and return the sandbox's :class:`~grouprl.sandbox.SandboxResult`: per-test
    status and reason, ``status`` ("ok", "error", "timeout", "sandbox_error", "no_code") and ``reward``.
    ``timeout`` is the job's wall-clock budget in seconds."""
    from grouprl.sandbox import SandboxResult, run_tests, suite_size

    job = prepare_job(completion, **kwargs)
    if job.code is None:
        return SandboxResult.not_run("no_code", "no Python code found in the completion", suite_size(job.tests))
    return run_tests(job.code, job.tests, timeout=timeout, isolation=isolation)


def code_reward_batch(
    completions: list[str],
    *,
    workers: int | None = None,
    timeout: float = 10.0,
    budget: float | None = None,
    isolation: str = "auto",
    **columns: Any,
) -> list[float | None]:
    """Batch form for the trainer: ``columns`` are per-completion lists (tests=[...], entry_point=[...],
    prompt=[...]); jobs run in parallel on ``workers`` cores, ``budget`` bounds the whole batch."""
    from grouprl.sandbox import run_many

    rows = [{k: v[i] for k, v in columns.items() if isinstance(v, list)} for i in range(len(completions))]
    jobs = [prepare_job(c, **row) for c, row in zip(completions, rows)]
    results = run_many(jobs, workers=workers, timeout=timeout, budget=budget, isolation=isolation)
    return [r.reward for r in results]


@REWARDS.register("code")
def code_reward(
    completion: str,
    *,
    answer: Any = None,
    tests: Any = None,
    timeout: float = 10.0,
    isolation: str = "auto",
    **meta: Any,
) -> float | None:
    """Fraction of tests the completion's code passes in the sandbox (k/n); None if the sandbox failed."""
    result = code_reward_details(completion, answer=answer, tests=tests, timeout=timeout,
                                 isolation=isolation, **meta)
    return result.reward


code_reward.batch = code_reward_batch  # type: ignore[attr-defined]
