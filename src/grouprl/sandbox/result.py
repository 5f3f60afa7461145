"""Results of a sandboxed run: one :class:`TestResult` per test, one :class:`SandboxResult` per job."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class TestResult:
    """The judge's verdict for one test (``reason`` is empty when it passed)."""

    __test__ = False  # not a pytest class

    index: int
    status: str
    """"passed", "failed" (assertion / wrong value / exception in the model's code), "error" (the program
    process died), "timeout" or "not_run"."""
    reason: str = ""
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return self.status == "passed"


@dataclass
class SandboxResult:
    """Outcome of one (code, tests) job; ``reward`` is k/n, or None ("no opinion") after a sandbox
    failure or when the row has no usable tests."""

    passed: int
    total: int
    status: str
    """"ok": every test reached a verdict (pass or wrong answer). "error": the program crashed or could not
    be loaded (syntax error, exception or exit at import, killed by a limit). "timeout": a test or the job
    ran past its deadline. "sandbox_error": the sandbox failed before any model code ran. "no_code" /
    "no_tests": nothing to run."""
    reason: str = ""
    tests: list[TestResult] = field(default_factory=list)
    seconds: float = 0.0
    isolation: str = ""
    stdout: str = ""
    stderr: str = ""

    @property
    def reward(self) -> float | None:
        if self.status in ("sandbox_error", "no_tests"):
            return None
        return self.passed / self.total if self.total else 0.0

    @classmethod
    def not_run(cls, status: str, reason: str, total: int, isolation: str = "") -> SandboxResult:
        tests = [TestResult(i, "not_run", reason) for i in range(total)]
        return cls(0, total, status, reason, tests, isolation=isolation)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"reward": self.reward}
