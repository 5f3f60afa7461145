"""Normalise the ways a dataset can give tests into one JSON-able suite the judge runs.

Accepted forms (``tests=``):

- assert lines: a string of Python whose top-level ``assert`` statements are the tests (every other
  top-level statement, e.g. an import or a helper, is shared set-up), or a list of such strings, one
  test each (MBPP's ``test_list``);
- a HumanEval ``check(candidate)`` function (a string that defines ``check``) plus ``entry_point``:
  one test, passed when ``check(<entry_point>)`` returns;
- ``(input, expected)`` pairs, a list of ``{"input": ..., "output": ...}`` dicts, or an APPS-style
  ``{"inputs": [...], "outputs": [...], "fn_name": ...}`` dict. With an entry point each input is the
  argument list of a call (a list/tuple is spread, a dict is passed as keywords, anything else is the
  single argument); without one, input is the program's stdin and expected is its stdout.

The suite is plain data: ``{"kind": "assert" | "check" | "call" | "stdio", ...}``.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping, Sequence
from typing import Any

from grouprl.errors import DataError


def _split_asserts(source: str) -> tuple[str, list[str]]:
    """(shared set-up source, one source string per top-level assert)."""
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        raise DataError(f"tests: the assert block does not parse ({e.msg}, line {e.lineno})") from e
    setup, asserts = [], []
    for node in tree.body:
        seg = ast.get_source_segment(source, node) or ast.unparse(node)
        (asserts if isinstance(node, ast.Assert) else setup).append(seg)
    return "\n".join(setup), asserts


def _defines(source: str, name: str) -> bool:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return False
    return any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name for n in tree.body)


def _pairs(items: Sequence[Any]) -> list[tuple[Any, Any]]:
    out = []
    for i, item in enumerate(items):
        if isinstance(item, Mapping):
            if "input" not in item or not ({"output", "expected"} & set(item)):
                raise DataError(f"tests[{i}]: a dict test needs 'input' and 'output' (or 'expected') keys")
            out.append((item["input"], item["output"] if "output" in item else item["expected"]))
        elif isinstance(item, (list, tuple)) and len(item) == 2:
            out.append((item[0], item[1]))
        else:
            raise DataError(f"tests[{i}]: expected an assert string, an (input, expected) pair or a dict, "
                            f"got {type(item).__name__}")
    return out


def _io_suite(pairs: list[tuple[Any, Any]], entry_point: str | None) -> dict[str, Any]:
    if entry_point:
        cases = []
        for inp, expected in pairs:
            if isinstance(inp, Mapping):
                cases.append({"args": [], "kwargs": dict(inp), "expected": expected})
            elif isinstance(inp, (list, tuple)):
                cases.append({"args": list(inp), "kwargs": {}, "expected": expected})
            else:
                cases.append({"args": [inp], "kwargs": {}, "expected": expected})
        return {"kind": "call", "entry_point": entry_point, "cases": cases}
    for i, (inp, out) in enumerate(pairs):
        if not isinstance(inp, str) or not isinstance(out, str):
            raise DataError(f"tests[{i}]: stdin/stdout tests need string input and output; give an "
                            f"entry_point to call a function with arguments instead")
    return {"kind": "stdio", "cases": [{"stdin": i, "stdout": o} for i, o in pairs]}


def normalize_tests(tests: Any, *, entry_point: str | None = None) -> dict[str, Any]:
    """Turn any accepted test form into a suite dict (see the module docstring)."""
    if isinstance(tests, Mapping) and "kind" in tests:
        return dict(tests)
    if isinstance(tests, Mapping) and "inputs" in tests:
        outputs = tests.get("outputs", tests.get("expected"))
        if outputs is None or len(outputs) != len(tests["inputs"]):
            raise DataError("tests: 'inputs' and 'outputs' must be lists of the same length")
        return _io_suite(list(zip(tests["inputs"], outputs)), entry_point or tests.get("fn_name"))
    if isinstance(tests, str):
        if _defines(tests, "check"):
            if not entry_point:
                raise DataError("tests: a check(candidate) function needs entry_point= (the function to test)")
            return {"kind": "check", "check": tests, "entry_point": entry_point, "n": 1}
        setup, asserts = _split_asserts(tests)
        if not asserts:
            raise DataError("tests: the string has no top-level assert statement and defines no check()")
        return {"kind": "assert", "setup": setup, "tests": asserts}
    if isinstance(tests, Sequence) and tests:
        if all(isinstance(t, str) for t in tests):
            return {"kind": "assert", "setup": "", "tests": list(tests)}
        return _io_suite(_pairs(tests), entry_point)
    raise DataError(f"tests: got {type(tests).__name__} {tests!r:.80}; give assert lines, (input, expected) "
                    f"pairs or a check(candidate) function")


def suite_size(suite: Mapping[str, Any]) -> int:
    """Number of tests in a normalised suite."""
    kind = suite["kind"]
    if kind == "check":
        return 1
    return len(suite["tests"] if kind == "assert" else suite["cases"])
