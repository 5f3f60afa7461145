"""Isolated execution of untrusted, model-written code (the one impure dependency of the rewards)."""

from grouprl.sandbox.result import SandboxResult, TestResult
from grouprl.sandbox.runner import run_tests
from grouprl.sandbox.suite import normalize_tests, suite_size

__all__ = ["SandboxResult", "TestResult", "normalize_tests", "run_tests", "suite_size"]
