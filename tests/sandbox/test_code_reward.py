"""The code reward end to end: every test form, k/n scoring, statuses kept apart, the pool."""

from __future__ import annotations

import pytest

from grouprl.registry import REWARDS
from grouprl.rewards.code import code_reward, code_reward_batch, code_reward_details
from grouprl.sandbox import CodeJob, detect, run_many, run_tests

# The default isolation is "auto" = strict, which refuses to run without bubblewrap (capability tests
# cover that refusal); the code reward itself is exercised where strict is available.
pytestmark = pytest.mark.skipif(not detect().strict, reason="strict isolation (bubblewrap) not available")

ADD = "```python\ndef add(a, b):\n    return a + b\n```"


def test_registered_as_code():
    assert REWARDS.get("code") is code_reward


def test_assert_lines_score_k_over_n():
    tests = ["assert add(1, 2) == 3", "assert add(2, 2) == 5", "assert add(-1, 1) == 0", "assert add(0, 0) == 1"]
    assert code_reward(ADD, tests=tests) == 0.5  # tests 0 and 2 pass: 2/4
    details = code_reward_details(ADD, tests=tests)
    assert [t.status for t in details.tests] == ["passed", "failed", "passed", "failed"]
    assert details.status == "ok" and details.reason.startswith("test 1: AssertionError")


def test_assert_block_with_setup_and_answer_column():
    block = "import math\nassert add(1, 1) == 2\nassert math.isclose(add(0.1, 0.2), 0.3)\n"
    assert code_reward(ADD, answer=block) == 1.0


def test_input_expected_pairs_call_the_entry_point():
    pairs = [([1, 2], 3), ([2, 3], 5), ([1, 1], 3)]
    assert code_reward(ADD, tests=pairs, entry_point="add") == pytest.approx(2 / 3)


def test_stdin_stdout_pairs():
    prog = "a, b = map(int, input().split())\nprint(a + b)\n"
    cases = [{"input": "1 2\n", "output": "3\n"}, {"input": "5 5\n", "output": "10"}, {"input": "0 0\n", "output": "1\n"}]
    res = code_reward_details(prog, tests=cases)
    assert [t.status for t in res.tests] == ["passed", "passed", "failed"]
    assert res.reward == pytest.approx(2 / 3)


def test_humaneval_style_check_with_prompt_prepended():
    prompt = 'def inc(x: int) -> int:\n    """Add one."""\n'
    check = "def check(candidate):\n    assert candidate(1) == 2\n    assert candidate(-1) == 0\n"
    assert code_reward("    return x + 1\n", tests=check, entry_point="inc", prompt=prompt) == 1.0
    assert code_reward("    return x\n", tests=check, entry_point="inc", prompt=prompt) == 0.0


def test_test_code_sees_program_helpers_and_real_builtins():
    code = "def helper(x):\n    return 2 * x\ndef f(x):\n    return helper(x) + 1\nK = 10\n"
    assert run_tests(code, ["assert f(K) == helper(K) + 1 == 21", "assert len([f(1)]) == 1"], timeout=5).reward == 1.0


def test_exceptions_raised_by_the_program_are_catchable_by_tests():
    code = "def f(x):\n    if x < 0:\n        raise ValueError('negative')\n    return x\n"
    tests = ["try:\n    f(-1)\n    raise AssertionError('no error')\nexcept ValueError:\n    pass"]
    assert run_tests(code, tests, timeout=5).reward == 1.0


def test_no_code_and_syntax_error_are_reported_apart():
    res = code_reward_details("I think the answer is 42.", tests=["assert f() == 1"])
    assert (res.status, res.reward) == ("no_code", 0.0)
    res = code_reward_details("```python\ndef f(:\n```", tests=["assert f() == 1"])
    assert res.status == "error" and "SyntaxError" in res.reason and res.reward == 0.0


def test_timeout_reported_apart_from_wrong_answers():
    code = "def f(x):\n    while x == 0:\n        pass\n    return x\n"
    res = run_tests(code, ["assert f(1) == 1", "assert f(2) == 3", "assert f(0) == 0"], timeout=5, test_timeout=1)
    assert [t.status for t in res.tests] == ["passed", "failed", "timeout"]
    assert res.status == "timeout" and res.reward == pytest.approx(1 / 3)


def test_a_crash_restarts_the_program_for_the_next_test():
    code = "import os\ndef f(x):\n    if x == 0:\n        os._exit(3)\n    return x\n"
    res = run_tests(code, ["assert f(0) == 0", "assert f(1) == 1"], timeout=5)
    assert [t.status for t in res.tests] == ["error", "passed"]
    assert "exited with code 3" in res.tests[0].reason


def test_pool_matches_serial_and_keeps_order(no_leftovers):
    jobs = [CodeJob(f"def f():\n    return {i % 3}\n", ["assert f() == 0", "assert f() in (0, 1)"]) for i in range(6)]
    got = [r.reward for r in run_many(jobs, workers=2, timeout=5)]
    assert got == [1.0, 0.5, 0.0, 1.0, 0.5, 0.0]
    assert got == [run_tests(j.code, j.tests, timeout=5).reward for j in jobs]


def test_pool_overall_budget_reports_unstarted_jobs_as_timeouts():
    slow = CodeJob("import time\ndef f():\n    time.sleep(30)\n", ["assert f() is None"])
    res = run_many([slow, slow, slow], workers=1, timeout=1.5, budget=2.0)
    assert [r.status for r in res] == ["timeout", "timeout", "timeout"]
    assert "overall time budget" in res[2].reason


def test_batch_reward_for_the_trainer():
    comps = ["def f(x):\n    return x + 1", "no code here, sorry!", "def f(x):\n    return x"]
    got = code_reward_batch(comps, tests=[[(1, 2), (2, 3)]] * 3, entry_point=["f"] * 3, workers=2)
    assert got == [1.0, 0.0, 0.0]


def test_full_function_completion_keeps_the_prompt_imports():
    prompt = 'from typing import List\n\n\ndef total(xs: List[int]) -> int:\n    """Sum."""\n'
    completion = "Sure:\n```python\ndef total(xs: List[int]) -> int:\n    return sum(xs)\n```"
    check = "def check(candidate):\n    assert candidate([1, 2, 3]) == 6\n"
    assert code_reward(completion, tests=check, entry_point="total", prompt=prompt) == 1.0


def test_rows_without_usable_tests_are_no_opinion():
    assert code_reward(ADD) is None  # no tests at all
    res = code_reward_details(ADD, tests="x = 1\n")  # nothing to assert
    assert (res.status, res.reward) == ("no_tests", None) and "no top-level assert" in res.reason
    assert code_reward_batch([ADD, ADD], tests=[None, ["assert add(1, 1) == 2"]]) == [None, 1.0]


def test_configure_sets_defaults_and_checks_the_level_up_front():
    from grouprl.errors import ConfigError
    from grouprl.sandbox import SandboxConfig, configure
    from grouprl.sandbox.config import current

    try:
        cfg = configure({"isolation": "basic", "timeout": 4.0})
        assert (current().isolation, current().timeout) == ("basic", 4.0)
        assert code_reward_details(ADD, tests=["assert add(1, 1) == 2"]).isolation == "basic"
        with pytest.raises(ConfigError, match="Did you mean 'timeout'"):
            configure(timout=3)
        with pytest.raises(ConfigError, match="must be > 0"):
            configure(timeout=0)
        assert current() is cfg  # a rejected configuration changes nothing
    finally:
        configure(SandboxConfig())


def test_prose_or_chat_prompts_are_not_glued_onto_the_code():
    tests = [([2], 4)]
    prose = "Write a function f that doubles its argument."
    assert code_reward("def f(x):\n    return 2 * x\n", tests=tests, entry_point="f", prompt=prose) == 1.0
    chat = [{"role": "user", "content": prose}]
    assert code_reward("def f(x):\n    return 2 * x\n", tests=tests, entry_point="f", prompt=chat) == 1.0


def test_pairs_keep_python_types_on_the_way_to_the_judge():
    code = "def uniq(xs):\n    return set(xs)\n"
    pairs = [(([1, 1, 2],), {1, 2}), (([3],), {3}), (([],), {0})]
    res = run_tests(code, pairs, entry_point="uniq", timeout=5)
    assert [t.status for t in res.tests] == ["passed", "passed", "failed"]
