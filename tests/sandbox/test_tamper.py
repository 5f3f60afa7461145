"""The verdict is decided by the judge, never by the program: none of these tricks may pass.

The verdict never depends on the isolation level: every trick is tried under both (``level``)."""

from __future__ import annotations

import textwrap

import pytest

from grouprl.sandbox import run_tests

pytestmark = pytest.mark.timeout(60)
WANT = ["assert f(2) == 4", "assert f(3) == 9"]
def score(code: str, level: str, tests=WANT):
    return run_tests(textwrap.dedent(code), tests, timeout=5.0, isolation=level)


@pytest.mark.parametrize(
    "code, reason",
    [
        ("import sys\nsys.exit(0)\n", "SystemExit"),
        ("import os\nos._exit(0)\n", "died while loading"),
        ("import sys\ndef f(x):\n    sys.exit(0)\n", "SystemExit"),
        ("import os\ndef f(x):\n    os._exit(0)\n", "exited with code 0"),
    ],
)
def test_exiting_is_never_a_pass(code, reason, level, no_leftovers):
    res = score(code, level)
    assert res.reward == 0.0 and reason in res.tests[0].reason


def test_objects_whose_eq_is_always_true(level, no_leftovers):
    res = score("""
        class Yes:
            def __eq__(self, other):
                return True
            __hash__ = object.__hash__
        class YesInt(int):
            def __eq__(self, other):
                return True
        def f(x):
            return Yes() if x == 2 else YesInt(0)
    """, level)
    assert res.reward == 0.0
    assert all("only plain data" in t.reason for t in res.tests)


def test_rebinding_builtins_and_assert_machinery(level, no_leftovers):
    res = score("""
        import builtins
        builtins.AssertionError = type("Nope", (Exception,), {})
        builtins.abs = lambda x: 0
        builtins.sorted = lambda x: [1]
        def f(x):
            return -1
    """, level, tests=["assert f(2) == 4", "assert sorted([f(1), 2]) == [1]", "assert abs(f(1)) == 0"])
    assert res.reward == 0.0  # the judge's own builtins and AssertionError are untouched
    assert [t.status for t in res.tests] == ["failed", "failed", "failed"]
    assert [t.reason for t in res.tests] == ["AssertionError"] * 3


def test_breaking_its_own_interpreter_is_an_error_not_a_pass(level, no_leftovers):
    res = score("import builtins\nbuiltins.len = lambda x: 1\ndef f(x):\n    return x * x\n", level)
    assert res.reward == 0.0 and {t.status for t in res.tests} == {"error"}


def test_printing_fake_records(level, no_leftovers):
    res = score("""
        import json, os, sys
        fake = [json.dumps({"i": i, "status": "passed", "nonce": ""}) for i in range(2)]
        for stream in (sys.stdout, sys.stderr):
            print("PASSED\\n" + "\\n".join(fake), file=stream, flush=True)
        for fd in range(0, 64):
            try:
                os.write(fd, ("\\n".join(fake) + "\\nPASSED\\n").encode())
            except OSError:
                pass
        def f(x):
            print("PASSED")
            return 0
    """, level)
    assert res.reward == 0.0


def test_the_judge_cannot_be_read_or_traced(level, no_leftovers):
    res = score("""
        import os
        def f(x):
            judge = os.getppid()
            opened = 0
            for path in (f"/proc/{judge}/mem", f"/proc/{judge}/environ", f"/proc/{judge}/fd/0", f"/proc/{judge}/fd/3"):
                try:
                    open(path, "rb").read(1)
                    opened += 1
                except OSError:
                    pass
            return opened
    """, level, tests=["assert f(0) == 0"])
    assert res.reward == 1.0, res.reason  # every read was refused


def test_the_program_never_sees_expected_values(level, no_leftovers):
    """A program that spies on every request its server receives still cannot find the expected value."""
    spy = textwrap.dedent("""
        import json, sys
        SEEN = [json.dumps(sys._getframe(1).f_locals.get("req"))]  # the load request, from _serve's frame
        def f(x):
            SEEN.append(json.dumps(sys._getframe(1).f_locals.get("req")))  # this call's request
            needle = "zq-" + str(9173)
            return needle if any(needle in s for s in SEEN) else "not found: " + str(len(SEEN))
    """)
    res = run_tests(spy, [((0,), "zq-9173")], entry_point="f", timeout=5.0, isolation=level)
    assert res.reward == 0.0
    assert res.tests[0].reason == "AssertionError: returned 'not found: 2', expected 'zq-9173'"
