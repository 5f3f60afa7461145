"""Pure parts: code extraction, test normalisation, and the plain-data wire codec."""

from __future__ import annotations

import pytest

from grouprl.errors import DataError
from grouprl.rewards.code import extract_code
from grouprl.sandbox._wire import WireError, decode, encode
from grouprl.sandbox.suite import normalize_tests, suite_size


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("Here:\n```python\ndef f():\n    return 1\n```\nDone.", "def f():\n    return 1\n"),
        ("```py\na = 1\n```\n```python\nb = 2\n```", "b = 2\n"),  # last python block wins
        ("```\nc = 3\n```", "c = 3\n"),  # untagged fence
        ("```python\nd = 4\n", "d = 4\n"),  # unterminated fence (truncated generation)
        ("def g(x):\n    return x\n", "def g(x):\n    return x\n"),  # bare code
        ("The answer is to add them.", None),  # prose
        ("", None),
    ],
)
def test_extract_code(completion, expected):
    assert extract_code(completion) == expected


def test_normalize_assert_block_splits_setup_and_tests():
    suite = normalize_tests("import math\nassert f(1) == 2\nx = 3\nassert f(x) == 4\n")
    assert suite == {"kind": "assert", "setup": "import math\nx = 3", "tests": ["assert f(1) == 2", "assert f(x) == 4"]}
    assert suite_size(suite) == 2


def test_normalize_forms():
    assert normalize_tests(["assert f() == 1", "assert f() != 2"])["tests"] == ["assert f() == 1", "assert f() != 2"]
    check = normalize_tests("def check(candidate):\n    assert candidate(1) == 1\n", entry_point="f")
    assert check["kind"] == "check" and suite_size(check) == 1
    call = normalize_tests([([1, 2], 3), ({"a": 1}, 1), (5, 6)], entry_point="f")
    assert call["cases"] == [
        {"args": [1, 2], "kwargs": {}, "expected": 3},
        {"args": [], "kwargs": {"a": 1}, "expected": 1},
        {"args": [5], "kwargs": {}, "expected": 6},
    ]
    stdio = normalize_tests([{"input": "1 2\n", "output": "3\n"}])
    assert stdio == {"kind": "stdio", "cases": [{"stdin": "1 2\n", "stdout": "3\n"}]}
    apps = normalize_tests({"inputs": [[1]], "outputs": [2], "fn_name": "g"})
    assert apps["kind"] == "call" and apps["entry_point"] == "g"


@pytest.mark.parametrize(
    "tests, kwargs, match",
    [
        ("def check(candidate):\n    pass\n", {}, "entry_point"),
        ("x = 1\n", {}, "no top-level assert"),
        ("assert (", {}, "does not parse"),
        ([(1, 2)], {}, "stdin/stdout tests need string"),
        ([object()], {}, r"tests\[0\]"),
        ({"inputs": [1, 2], "outputs": [1]}, {}, "same length"),
    ],
)
def test_normalize_errors_name_the_problem(tests, kwargs, match):
    with pytest.raises(DataError, match=match):
        normalize_tests(tests, **kwargs)


@pytest.mark.parametrize(
    "value",
    [None, True, 0, -7, 2**100, 1.5, float("inf"), "é\n", b"\x00\xff", 1 + 2j, [1, [2]], (1, (2,)),
     {"a": 1, 2: [3]}, {(1, 2): "t"}, {1, 2}, frozenset({3})],
)
def test_wire_roundtrip_keeps_exact_types(value):
    back = decode(encode(value))
    assert back == value and type(back) is type(value)


def test_wire_refuses_objects_with_their_own_eq():
    class AlwaysEqual:
        def __eq__(self, other):
            return True

    class SneakyInt(int):
        def __eq__(self, other):
            return True

    for bad in (AlwaysEqual(), SneakyInt(3), [SneakyInt(1)], {"k": AlwaysEqual()}):
        with pytest.raises(WireError):
            encode(bad)
    with pytest.raises(WireError):
        decode({"x": 1})  # unknown tag
    with pytest.raises(WireError):
        decode([1, 2])  # untagged container
