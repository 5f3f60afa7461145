"""Run many (code, tests) jobs in parallel, each in its own sandbox, under per-job and overall budgets.

Threads are enough: each job is a child process tree, and a thread only waits on its pipes (the GIL
is released), so ``workers`` jobs really run at once on ``workers`` cores. No ``preexec_fn`` runs in
the parent, so forking from threads is safe.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from grouprl.sandbox.capabilities import resolve_isolation
from grouprl.sandbox.result import SandboxResult
from grouprl.sandbox.runner import Limits, run_tests
from grouprl.sandbox.suite import normalize_tests, suite_size

MIN_JOB_S = 0.5  # a job needs at least this much of the overall budget left to start


@dataclass
class CodeJob:
    """One program and its tests (any form ``normalize_tests`` accepts)."""

    code: str | None
    tests: Any
    entry_point: str | None = None


def default_workers() -> int:
    """One job per core this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


def run_many(
    jobs: Sequence[CodeJob],
    *,
    workers: int | None = None,
    timeout: float = 10.0,
    budget: float | None = None,
    isolation: str = "auto",
    test_timeout: float | None = None,
    limits: Limits | None = None,
    hide_paths: tuple[str, ...] | list[str] = (),
) -> list[SandboxResult]:
    """Results in the order of ``jobs``. ``timeout`` bounds each job, ``budget`` (seconds) the whole batch:
    a job that cannot start with at least 0.5 s of the budget left is reported as a timeout, not run."""
    resolve_isolation(isolation)  # fail before starting anything
    end = time.monotonic() + budget if budget is not None else float("inf")

    def one(job: CodeJob) -> SandboxResult:
        suite = normalize_tests(job.tests, entry_point=job.entry_point)
        if job.code is None:
            return SandboxResult.not_run("no_code", "no Python code found in the completion", suite_size(suite))
        left = end - time.monotonic()
        if left < MIN_JOB_S:
            return SandboxResult.not_run("timeout", "the batch's overall time budget ran out before this job",
                                         suite_size(suite))
        return run_tests(job.code, suite, timeout=min(timeout, left), isolation=isolation,
                         test_timeout=test_timeout, limits=limits, hide_paths=hide_paths)

    with ThreadPoolExecutor(max_workers=workers or default_workers()) as pool:
        return list(pool.map(one, jobs))
