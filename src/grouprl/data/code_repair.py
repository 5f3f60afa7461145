"""``builtin:code_repair``: one-line Python functions with one wrong operator, and the tests that catch it.

Each row is a file for the ``python`` environment (:mod:`grouprl.envs.code_repair`) and its tests::

    prompt   [{"role": "user", "content": "Fix add in solution.py."}]
    code     "def add(a, b):\\n    return a - b\\n"
    tests    ["assert add(2, 7) == 9", "assert add(5, 3) == 8", "assert add(4, 6) == 10"]
    answer   "def add(a, b):\\n    return a + b\\n"          (the repaired file)

The function's name says what it should compute (:data:`FUNCTIONS`: ``add`` +, ``sub`` -, ``mul`` *,
``mod`` %, ``less`` <, ``more`` >, ``same`` ==, ``differ`` !=); its one line uses another operator of the
same family (arithmetic or comparison), so one ``edit(old="a - b", new="a + b")`` repairs it. Three of the
four operators of a family are wrong, so a repair that guesses is right one time in three; the tests'
verdicts tell a wrong guess from the right one (``0/3 tests passed.`` and the failing asserts), and the name
tells the right operator outright.

Every wrong operator fails at least one test (the cases are drawn so), but it can pass others by coincidence
(``less(3, 3) is False`` holds for ``>`` too), so the k/n reward gives partial credit -- the unedited file
included (a comparison bug passes 1 of its 3 tests by coincidence).

``fail_to_pass=True`` (``dataset_kwargs: {fail_to_pass: true}``) draws FAIL_TO_PASS tests in SWE-bench's sense
(arXiv 2310.06770, Sec. 2.1) instead: every test fails on the buggy file, so the unedited file scores 0/3,
and every other wrong operator still fails at least one. A comparison bug that no such suite can catch is
then never drawn: ``less`` with ``==`` agrees with ``<`` on every case where ``!=`` disagrees (``a > b``), so
the bugs are those of :func:`catchable_bugs` (``less`` ``>`` only; ``more`` ``<``; ``same`` any; ``differ``
``==``); arithmetic bugs are all catchable.

The key is the function, its argument names, the wrong operator and the test cases, so the held-out split
(:func:`grouprl.data.tasks.generate_rows`) shares no row with the training split -- but every function
name occurs in both: the split tests the repair policy on new files and tests, not unseen operators.
"""

from __future__ import annotations

import random
from typing import Any

# name -> (operator, family). Arithmetic on small positive ints; comparisons return a bool.
FUNCTIONS: dict[str, tuple[str, str]] = {
    "add": ("+", "arith"), "sub": ("-", "arith"), "mul": ("*", "arith"), "mod": ("%", "arith"),
    "less": ("<", "compare"), "more": (">", "compare"), "same": ("==", "compare"), "differ": ("!=", "compare"),
}
FAMILIES: dict[str, tuple[str, ...]] = {
    "arith": ("+", "-", "*", "%"),
    "compare": ("<", ">", "==", "!="),
}
ARGUMENTS = [("a", "b"), ("x", "y"), ("m", "n"), ("p", "q"), ("u", "v"), ("i", "j")]
FILE_NAME = "solution.py"


def apply(op: str, a: int, b: int) -> int | bool:
    """``a op b`` for the operators of :data:`FAMILIES` (no eval: the generator never runs code)."""
    ops = {"+": a + b, "-": a - b, "*": a * b, "<": a < b, ">": a > b, "==": a == b, "!=": a != b}
    return a % b if op == "%" else ops[op]


def source(name: str, args: tuple[str, str], op: str) -> str:
    """The file: ``def name(a, b):`` and one ``return a op b`` line."""
    return f"def {name}({args[0]}, {args[1]}):\n    return {expression(args, op)}\n"


def expression(args: tuple[str, str], op: str) -> str:
    """The returned expression, the text an edit replaces: ``a - b``."""
    return f"{args[0]} {op} {args[1]}"


def assert_line(name: str, case: tuple[int, int], value: int | bool) -> str:
    """One test: ``assert add(2, 7) == 9`` (``is True`` / ``is False`` for comparisons)."""
    call = f"{name}({case[0]}, {case[1]})"
    return f"assert {call} is {value}" if isinstance(value, bool) else f"assert {call} == {value}"


# one case of each kind a comparison can tell apart: a < b, a > b, a == b
_COMPARE_KINDS = ((1, 2), (2, 1), (1, 1))


def _suite_ok(cases: list[tuple[int, int]], op: str, bug: str, family: str) -> bool:
    """Every case fails on ``bug`` (FAIL_TO_PASS) and every other wrong operator fails at least one case."""
    if not all(apply(bug, *c) != apply(op, *c) for c in cases):
        return False
    return all(any(apply(w, *c) != apply(op, *c) for c in cases) for w in FAMILIES[family] if w != op)


def catchable_bugs(op: str, family: str) -> list[str]:
    """The wrong operators of ``op``'s family for which a FAIL_TO_PASS suite catching every wrong operator
    exists (module docstring): for comparisons, decided on one case of each kind (a < b, a > b, a == b)."""
    wrong = [o for o in FAMILIES[family] if o != op]
    if family != "compare":
        return wrong
    def failing(bug: str) -> list[tuple[int, int]]:
        return [c for c in _COMPARE_KINDS if apply(bug, *c) != apply(op, *c)]
    return [b for b in wrong if _suite_ok(failing(b), op, b, family)]


def _any_cases(rng: random.Random, family: str, num_tests: int) -> list[tuple[int, int]]:
    """The default suite: every wrong operator fails at least one test (the buggy one may pass some)."""
    if family == "compare":  # one case each of a < b, a > b and a == b first: every wrong comparison fails one
        a, b, c = rng.randint(1, 8), rng.randint(1, 8), rng.randint(1, 9)
        lo, hi = min(a, b), max(a, b) + (a == b)
        kinds = [(lo, hi), (hi, lo), (c, c)]
        rng.shuffle(kinds)
        extra = [(rng.randint(1, 9), rng.randint(1, 9)) for _ in range(max(0, num_tests - 3))]
        return (kinds + extra)[:num_tests]
    while True:  # redrawn until every wrong operator fails at least one test (no repair passes by luck)
        cases = [(rng.randint(2, 9), rng.randint(2, 9)) for _ in range(num_tests)]
        if all(any(apply(o, *c) != apply(p, *c) for c in cases) for o in FAMILIES[family] for p in FAMILIES[family]
               if o != p):
            return cases


def _cases(rng: random.Random, op: str, bug: str, family: str, num_tests: int) -> list[tuple[int, int]]:
    """``num_tests`` cases, redrawn until :func:`_suite_ok` (FAIL_TO_PASS, every wrong operator caught)."""
    def case() -> tuple[int, int]:
        if family != "compare":
            return rng.randint(2, 9), rng.randint(2, 9)
        a, b = rng.randint(1, 8), rng.randint(1, 8)  # a < b, a > b or a == b, each with fresh numbers
        kind = rng.randrange(3)
        lo, hi = min(a, b), max(a, b) + (a == b)
        return ((lo, hi), (hi, lo), (a, a))[kind]

    for _ in range(10_000):
        cases = [case() for _ in range(num_tests)]
        if _suite_ok(cases, op, bug, family):
            return cases
    raise RuntimeError(f"code_repair: no {num_tests}-test suite catches {bug!r} for {op!r}")  # pragma: no cover


def make_code_repair(rng: random.Random, *, num_tests: int = 3, functions: list[str] | None = None,
                     fail_to_pass: bool = False) -> dict[str, Any]:
    """A one-line function with a wrong operator and ``num_tests`` assert tests, for the python environment.

    ``functions`` limits the names (default: all of :data:`FUNCTIONS`). ``fail_to_pass`` draws FAIL_TO_PASS
    suites (module docstring: every test fails on the buggy file) and only the bugs they can catch.

    ``work`` keeps what the demonstrations need: the function, its arguments, the right and the wrong
    operator and the test cases (:func:`grouprl.data.tasks.load_task` drops it).
    """
    from grouprl.errors import DataError

    names = list(functions or FUNCTIONS)
    unknown = [n for n in names if n not in FUNCTIONS]
    if unknown or num_tests < 1:
        raise DataError(f"code_repair: functions must be among {', '.join(FUNCTIONS)} and num_tests >= 1; "
                        f"got functions={functions!r}, num_tests={num_tests!r}")
    name = rng.choice(names)
    op, family = FUNCTIONS[name]
    bug = rng.choice(catchable_bugs(op, family) if fail_to_pass else [o for o in FAMILIES[family] if o != op])
    args = rng.choice(ARGUMENTS)
    cases = _cases(rng, op, bug, family, num_tests) if fail_to_pass else _any_cases(rng, family, num_tests)
    tests = [assert_line(name, case, apply(op, *case)) for case in cases]
    return {
        "prompt": [{"role": "user", "content": f"Fix {name} in {FILE_NAME}."}],
        "code": source(name, args, bug),
        "tests": tests,
        "answer": source(name, args, op),
        "key": f"{name}|{''.join(args)}|{bug}|{cases}",
        "work": {"name": name, "args": list(args), "op": op, "bug": bug, "family": family,
                 "cases": [list(c) for c in cases]},
    }


def passes(work: dict, op: str) -> list[bool]:
    """Which tests the file with operator ``op`` passes (computed, not run: for demonstrations)."""
    return [apply(op, *c) == apply(work["op"], *c) and type(apply(op, *c)) is type(apply(work["op"], *c))
            for c in work["cases"]]
