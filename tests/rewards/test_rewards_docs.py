"""Every worked example in the rewards' docstrings runs and gives the printed value (DESIGN rule 8)."""

from __future__ import annotations

import doctest
import importlib
import inspect
import pkgutil

import pytest

import grouprl.rewards
from grouprl.builtins import load_builtins
from grouprl.registry import REWARDS

MODULES = [m.name for m in pkgutil.iter_modules(grouprl.rewards.__path__, "grouprl.rewards.")]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_hold(name):
    module = importlib.import_module(name)
    if name.endswith(".code"):
        from grouprl.sandbox import detect

        if not detect().strict:
            pytest.skip("the code reward's example runs in the sandbox (strict isolation not available)")
    result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0, f"{result.failed} of {result.attempted} docstring examples failed (see output)"


@pytest.mark.parametrize("name", sorted(load_builtins()["rewards"]))
def test_every_registered_reward_has_a_worked_example(name):
    fn = REWARDS.get(name)
    docs = (inspect.getdoc(fn) or "") + (inspect.getmodule(fn).__doc__ or "")
    assert ">>> " in docs, f"reward {name!r}: no worked example in its docstring or its module's"
