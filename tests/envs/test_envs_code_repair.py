"""The python environment: edit a buggy file, run its tests in the sandbox, read failures, fix, pass."""

from __future__ import annotations

import pytest

from grouprl.envs import CodeRepairEnv, call_with_timeout, make_env_factory
from grouprl.errors import DataError
from grouprl.sandbox import configure, detect
from grouprl.sandbox.config import current

pytestmark = pytest.mark.skipif(not (detect().strict or detect().basic_python),
                                reason="no sandbox isolation available on this machine")

BUGGY = "def add(a, b):\n    return a - b\n"
TESTS = "assert add(1, 2) == 3\nassert add(0, 0) == 0\nassert add(-1, 5) == 4\n"


@pytest.fixture(autouse=True)
def sandbox_settings():
    """Strict isolation where the machine has it, else basic (named explicitly), restored afterwards."""
    before = current()
    configure(isolation="strict" if detect().strict else "basic", timeout=10.0)
    yield
    configure(before)


def test_repair_loop_end_to_end(no_leftovers):
    env = make_env_factory(environment_factory=CodeRepairEnv)()
    assert sorted(t["function"]["name"] for t in env.tools) == ["edit", "run_tests", "view", "write"]
    assert env.reset({"prompt": "Fix add.", "code": BUGGY, "tests": TESTS}) is None
    assert env.call("view", {}) == "   1 | def add(a, b):\n   2 |     return a - b"

    report = env.call("run_tests", {})
    lines = report.splitlines()
    # add(1, 2) = -1 and add(-1, 5) = -6 fail; add(0, 0) = 0 passes
    assert lines[0] == "1/3 tests passed."
    assert lines[1].startswith("FAILED test 0 `assert add(1, 2) == 3` (failed):")
    assert lines[2].startswith("FAILED test 2 `assert add(-1, 5) == 4` (failed):")
    assert env.instance.iterations == 1 and env.instance.edits == 0
    assert env.reward() == pytest.approx(1 / 3)

    text, kind = call_with_timeout(env, "edit", {"old": "a * b", "new": "a + b"}, 5.0)
    assert kind == "exception" and "was not found in solution.py" in text and env.instance.edits == 0
    assert env.call("edit", {"old": "a - b", "new": "a + b"}) == "edited solution.py (2 lines)"
    assert env.call("run_tests", {}) == "3/3 tests passed."
    assert (env.instance.edits, env.instance.iterations) == (1, 2)
    assert (env.instance.passed, env.instance.total) == (3, 3)
    assert env.reward() == 1.0
    env.close()


def test_write_syntax_error_and_reward_of_the_final_file(no_leftovers):
    env = CodeRepairEnv()
    env.reset(code=BUGGY, tests=TESTS)
    assert env.write("def add(a, b)\n    return a + b\n") == "wrote solution.py (2 lines)"
    report = env.run_tests()
    assert report.startswith("0/3 tests passed.") and "FAILED test 0" in report
    assert env.get_reward() == 0.0
    env.write("def add(a, b):\n    return b + a\n")
    # get_reward runs the current file even if the model never ran the tests after its last edit
    assert env.get_reward() == 1.0 and env.iterations == 1 and env.edits == 2


def test_edit_must_match_once_and_rows_need_tests():
    env = CodeRepairEnv()
    env.reset(code="x = 1\nx = 1\n", tests="assert x == 1")
    with pytest.raises(ValueError, match="occurs 2 times"):
        env.edit("x = 1", "x = 2")
    with pytest.raises(DataError, match="needs a 'tests' column"):
        CodeRepairEnv().reset(code="x = 1")


def test_failures_show_the_programs_output(no_leftovers):
    env = CodeRepairEnv()
    env.reset(code="import sys\ndef add(a, b):\n    print('debug', a, b)\n    print('warn', file=sys.stderr)\n"
                   "    return a - b\n", tests=TESTS)
    report = env.run_tests()
    assert report.startswith("1/3 tests passed.")
    # stderr is unbuffered and reaches the report; the program's stdout is block-buffered in the sandbox
    # and lost when its process is killed, so only stderr is asserted here
    assert report.endswith("stderr:\nwarn\nwarn\nwarn")
