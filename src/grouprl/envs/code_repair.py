"""The ``python`` environment: repair a Python file by editing it and running its tests in the sandbox.

Each trajectory gets one file (the row's ``code`` column, the buggy program) and a test suite (the
row's ``tests`` column, any form :func:`grouprl.sandbox.normalize_tests` accepts, with an optional
``entry_point``). The model calls ``view()``, ``edit(old, new)`` / ``write(content)`` and
``run_tests()``; each test run is a fresh job in :mod:`grouprl.sandbox` (never in the trainer process),
bounded by the sandbox settings (``sandbox.timeout``, ``sandbox.isolation``, ``sandbox.memory_mb``).
The environment's reward is the fraction of tests the final file passes, the usual execution reward of
code RL (e.g. CodeRL, arXiv:2207.01780); ``edits`` and ``iterations`` are kept for efficiency rewards.
"""

from __future__ import annotations

from typing import Any

from grouprl.errors import DataError
from grouprl.registry import ENVIRONMENTS

FILE_NAME = "solution.py"
MAX_FAILURES_SHOWN = 5
MAX_REASON_CHARS = 400


def _clip(text: str, limit: int) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[: limit - 15] + " ...[truncated]"


@ENVIRONMENTS.register("python")
class CodeRepairEnv:
    """Code repair: view and edit a Python file, run its tests in the sandbox, edit again until they pass.

    Row columns: ``code`` (the file to repair), ``tests`` (its tests), optional ``entry_point``.
    Attributes read by rewards: ``edits`` (changes applied), ``iterations`` (test runs),
    ``passed`` / ``total`` (the last run), ``code`` (the current file).
    """

    def reset(self, code: str = "", tests: Any = None, entry_point: str | None = None, **row: Any) -> str | None:
        from grouprl.sandbox import normalize_tests

        if tests is None:
            raise DataError("the python environment needs a 'tests' column in each row (assert lines, "
                            "(input, expected) pairs or a check(candidate) function)")
        if not isinstance(code, str):
            raise DataError(f"the python environment's 'code' column must be a string, got {type(code).__name__}")
        self.code = code
        self.suite = normalize_tests(tests, entry_point=entry_point)
        self.edits = 0
        self.iterations = 0
        self.passed = 0
        self.total = 0
        self._last: tuple[str, Any] | None = None  # (code, SandboxResult) of the last sandbox run
        return None

    def view(self) -> str:
        """
        Show the current contents of solution.py with line numbers.

        Returns:
            The file, one numbered line per line.
        """
        if not self.code:
            return f"{FILE_NAME} is empty"
        return "\n".join(f"{i:4d} | {line}" for i, line in enumerate(self.code.splitlines(), 1))

    def edit(self, old: str, new: str) -> str:
        """
        Replace one exact occurrence of a piece of text in solution.py.

        Args:
            old: The text to replace; it must occur exactly once in the file (copy it from view()).
            new: The text to put in its place.

        Returns:
            A confirmation, or why the edit was not applied.
        """
        count = self.code.count(old) if old else 0
        if count == 0:
            raise ValueError(f"the text to replace was not found in {FILE_NAME}; call view() and copy it exactly")
        if count > 1:
            raise ValueError(f"the text to replace occurs {count} times in {FILE_NAME}; include more "
                             f"surrounding lines so that it occurs once")
        self.code = self.code.replace(old, new, 1)
        self.edits += 1
        return f"edited {FILE_NAME} ({len(self.code.splitlines())} lines)"

    def write(self, content: str) -> str:
        """
        Replace the whole of solution.py.

        Args:
            content: The new contents of the file.

        Returns:
            A confirmation.
        """
        self.code = content
        self.edits += 1
        return f"wrote {FILE_NAME} ({len(self.code.splitlines())} lines)"

    def run_tests(self) -> str:
        """
        Run the tests against the current solution.py in a sandbox.

        Returns:
            How many tests passed, and the failures with their messages.
        """
        self.iterations += 1
        result = self._run()
        return self._summary(result)

    def get_reward(self) -> float | None:
        """Fraction of the tests the current file passes (None when the sandbox itself failed)."""
        return self._run().reward

    def _run(self) -> Any:
        """The sandbox's result for the current file (cached: an unchanged file is not run twice)."""
        from grouprl.sandbox import Limits, run_tests
        from grouprl.sandbox.config import current

        if self._last is not None and self._last[0] == self.code:
            return self._last[1]
        cfg = current()
        result = run_tests(self.code, self.suite, timeout=cfg.timeout, isolation=cfg.isolation,
                           test_timeout=cfg.test_timeout, limits=Limits(memory_mb=cfg.memory_mb, nproc=cfg.nproc),
                           hide_paths=tuple(cfg.hide_paths))
        self._last = (self.code, result)
        self.passed, self.total = result.passed, result.total
        return result

    def _summary(self, result: Any) -> str:
        if result.status == "sandbox_error":
            return f"the tests could not be run (sandbox error: {_clip(result.reason, MAX_REASON_CHARS)})"
        lines = [f"{result.passed}/{result.total} tests passed."]
        sources = self.suite.get("tests") if self.suite.get("kind") == "assert" else None
        failures = [t for t in result.tests if not t.passed]
        for t in failures[:MAX_FAILURES_SHOWN]:
            what = f" `{_clip(sources[t.index], 200)}`" if sources and t.index < len(sources) else ""
            lines.append(f"FAILED test {t.index}{what} ({t.status}): {_clip(t.reason, MAX_REASON_CHARS)}")
        if len(failures) > MAX_FAILURES_SHOWN:
            lines.append(f"... and {len(failures) - MAX_FAILURES_SHOWN} more failures")
        for stream in ("stdout", "stderr") if failures else ():  # the model's own prints help it debug
            text = getattr(result, stream)
            if text.strip():
                lines.append(f"{stream}:\n" + _clip(text, MAX_REASON_CHARS))
        return "\n".join(lines)
