"""Import the modules whose decorators fill the registries (the built-in algorithms, rewards, environments).

This sits above both ``grouprl.registry`` (which knows none of its plug-ins) and the packages that register
into it (``grouprl.algo``, ``grouprl.rewards``, ``grouprl.envs``), so neither side imports the other.
"""

from __future__ import annotations

import importlib

from grouprl.registry import ALL_REGISTRIES, Registry

BUILTIN_MODULES = ("grouprl.algo", "grouprl.rewards", "grouprl.envs", "grouprl.scorers")


def load_builtins() -> dict[str, Registry]:
    """Import the modules whose decorators fill the registries, and return them all."""
    for name in BUILTIN_MODULES:
        importlib.import_module(name)
    return ALL_REGISTRIES
