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
except a sandbox failure that happened before any of the model's code ran, or a row without usable
tests, which score None ("no opinion": the trainer leaves them out of the group statistics).

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


def _code_prompt(prompt: Any) -> str | None:
    """The prompt if it is Python (a HumanEval signature + docstring); a prose or chat prompt -- which
    the trainer's reward adapter passes to every reward -- is never glued onto the code."""
    if not isinstance(prompt, str) or not prompt.strip():
        return None
    try:
        ast.parse(prompt)
    except SyntaxError:
        return None
    return prompt


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
    prompt = _code_prompt(prompt)
    if code is not None and entry_point and prompt:
        # a full function redefines the prompt's stub (and keeps the prompt's imports); a bare body
        # continues the prompt's function
        code = prompt + ("\n" + code if _defines(code, entry_point) else code)
    if code is None and prompt and entry_point and isinstance(completion, str) and completion.strip():
        code = prompt + completion
    return CodeJob(code, suite, entry_point)


def _settings(timeout, isolation, **more):
    from grouprl.sandbox.config import current

    cfg = current()
    return {"timeout": cfg.timeout if timeout is None else timeout,
            "isolation": cfg.isolation if isolation is None else isolation, **more}


def _limits():
    from grouprl.sandbox import Limits
    from grouprl.sandbox.config import current

    cfg = current()
    return Limits(memory_mb=cfg.memory_mb, nproc=cfg.nproc)


def code_reward_details(completion: str, *, timeout: float | None = None, isolation: str | None = None,
                        **kwargs: Any):
    """Run the completion and return the sandbox's :class:`~grouprl.sandbox.SandboxResult`: per-test
    status and reason, ``status`` ("ok", "error", "timeout", "sandbox_error", "no_code", "no_tests") and
    ``reward``. ``timeout`` (job budget, s) and ``isolation`` default to ``grouprl.sandbox.configure``'s."""
    from grouprl.errors import DataError
    from grouprl.sandbox import SandboxResult, run_tests, suite_size
    from grouprl.sandbox.config import current

    try:
        job = prepare_job(completion, **kwargs)
    except DataError as e:
        return SandboxResult.not_run("no_tests", str(e), 0)
    if job.code is None:
        return SandboxResult.not_run("no_code", "no Python code found in the completion", suite_size(job.tests))
    return run_tests(job.code, job.tests, **_settings(timeout, isolation), test_timeout=current().test_timeout,
                     limits=_limits(), hide_paths=tuple(current().hide_paths))


def code_reward_batch(
    completions: list[str],
    *,
    workers: int | None = None,
    timeout: float | None = None,
    budget: float | None = None,
    isolation: str | None = None,
    **columns: Any,
) -> list[float | None]:
    """Batch form for the trainer: ``columns`` are per-completion lists (tests=[...], entry_point=[...],
    prompt=[...]; a non-list value applies to every row); jobs run in parallel on ``workers`` cores and
    ``budget`` bounds the whole batch (defaults from ``grouprl.sandbox.configure``)."""
    from grouprl.errors import DataError
    from grouprl.sandbox import run_many
    from grouprl.sandbox.config import current

    cfg = current()
    rewards: list[float | None] = [None] * len(completions)
    jobs, where = [], []
    for i, c in enumerate(completions):
        row = {k: (v[i] if isinstance(v, list) else v) for k, v in columns.items()}
        try:
            jobs.append(prepare_job(c, **row))
            where.append(i)
        except DataError:
            rewards[i] = None  # no usable tests: no opinion
    results = run_many(jobs, workers=workers or cfg.workers, budget=budget if budget is not None else cfg.budget,
                       test_timeout=cfg.test_timeout, limits=_limits(), hide_paths=tuple(cfg.hide_paths),
                       **_settings(timeout, isolation))
    for i, r in zip(where, results):
        rewards[i] = r.reward
    return rewards


@REWARDS.register("code")
def code_reward(
    completion: str,
    *,
    answer: Any = None,
    tests: Any = None,
    timeout: float | None = None,
    isolation: str | None = None,
    **meta: Any,
) -> float | None:
    """Fraction k/n of the tests the completion's code passes in the sandbox (None: no usable tests).

    ``None`` also when the sandbox failed before any of the model's code ran; timeouts, crashes and
    wrong answers score their share of 0 (:func:`code_reward_details` tells them apart for logging).
    """
    result = code_reward_details(completion, answer=answer, tests=tests, timeout=timeout,
                                 isolation=isolation, **meta)
    return result.reward


code_reward.batch = code_reward_batch  # type: ignore[attr-defined]
# Options understood beyond the named parameters (checked by make_reward_func): the job's and the batch's.
prepare_job.passes_options_to = ()  # type: ignore[attr-defined]
prepare_job.extra_options = _TEST_KEYS[1:]  # type: ignore[attr-defined]
code_reward_batch.passes_options_to = (prepare_job,)  # type: ignore[attr-defined]
code_reward.passes_options_to = (prepare_job, code_reward_batch)  # type: ignore[attr-defined]
