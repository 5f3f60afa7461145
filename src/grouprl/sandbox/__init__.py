"""Isolated execution of untrusted, model-written code (the one impure dependency of the rewards).

``run_tests(code, tests, timeout=..., isolation="auto"|"strict"|"basic")`` runs one job;
``run_many(jobs, ...)`` runs many across cores; ``detect()`` says what isolation the machine allows.
The design and threat model are in docs/SANDBOX.md.
"""

from grouprl.sandbox.capabilities import LEVELS, Capabilities, SandboxUnavailable, detect, resolve_isolation
from grouprl.sandbox.config import SandboxConfig, configure
from grouprl.sandbox.pool import CodeJob, default_workers, run_many
from grouprl.sandbox.result import SandboxResult, TestResult
from grouprl.sandbox.runner import Limits, run_tests
from grouprl.sandbox.suite import normalize_tests, suite_size

__all__ = [
    "LEVELS", "Capabilities", "CodeJob", "Limits", "SandboxConfig", "configure", "SandboxResult", "SandboxUnavailable", "TestResult", "default_workers", "detect",
    "normalize_tests", "resolve_isolation", "run_many", "run_tests", "suite_size",
]
