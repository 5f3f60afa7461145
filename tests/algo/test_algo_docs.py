"""The worked examples in grouprl.algo's docstrings run and print what they claim."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import grouprl.algo

MODULES = [m.name for m in pkgutil.iter_modules(grouprl.algo.__path__, "grouprl.algo.")]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_hold(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0, f"{result.failed} of {result.attempted} docstring examples failed (see output)"


def test_the_worked_example_is_among_them():
    # compute_grpo_advantages carries the must-hold example: [1, 3, 2, 6] -> [-1.069, 0, -0.535, 1.604]
    result = doctest.testmod(importlib.import_module("grouprl.algo.advantages"))
    assert result.attempted >= 1 and result.failed == 0
