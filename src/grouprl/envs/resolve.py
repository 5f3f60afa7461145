"""Tools and environments named in a recipe: ``tools: ["pkg.mod:fn", ...]``, ``environment: calculator``.

A built-in environment is given by its registry name (``grouprl list environments``); anything else
as ``"package.module:attribute"``, imported from the Python path (run from the folder that holds your
module, or add it to ``PYTHONPATH``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from grouprl.errors import ConfigError, did_you_mean
from grouprl.registry import ENVIRONMENTS


def _import(spec: str, what: str) -> Any:
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"{what} {spec!r} must look like 'package.module:name'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        hint = ""
        if isinstance(e, ModuleNotFoundError) and e.name and module_name.startswith(e.name):
            hint = (" If it is a file of yours, run from the folder that holds it or add that folder to "
                    "PYTHONPATH (e.g. PYTHONPATH=. grouprl train ...).")
        raise ConfigError(f"{what} {spec!r}: cannot import {module_name!r} ({e}).{hint}") from e
    except Exception as e:  # a SyntaxError, or anything the module raised while it ran
        from grouprl.errors import import_failure

        raise ConfigError(import_failure(what, spec, module_name, e)) from e
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"{what} {spec!r}: {module_name!r} has no attribute {attr!r}."
                              + did_you_mean(part, [n for n in dir(obj) if not n.startswith("_")]))
        obj = getattr(obj, part)
    return obj


def resolve_tools(specs: list[str | Callable[..., Any]]) -> list[Callable[..., Any]]:
    """Functions for ``tools:`` entries, each a ``"pkg.mod:fn"`` string or already a function."""
    if isinstance(specs, str) or not isinstance(specs, (list, tuple)):
        raise ConfigError(f"tools must be a list like ['pkg.mod:fn', ...], got {specs!r:.80}")
    out = []
    for spec in specs:
        fn = _import(spec, "tool") if isinstance(spec, str) else spec
        if not callable(fn) or isinstance(fn, type):
            raise ConfigError(f"tool {spec!r} is not a function; a class goes under environment: instead")
        out.append(fn)
    return out


def resolve_environment(spec: str | type) -> Any:
    """The environment class for ``environment:``: a built-in name (``calculator``, ``python``,
    ``search``, ``guess_number``), ``textarena:<GameId>`` (:mod:`grouprl.envs.textarena`),
    ``openenv:<pkg.mod:Client>@<url>`` (:mod:`grouprl.envs.openenv`), a ``"pkg.mod:Cls"`` string, or
    already a class."""
    if not isinstance(spec, str):
        return spec
    if spec.startswith("textarena:"):
        from grouprl.envs.textarena import textarena_env

        return textarena_env(spec.split(":", 1)[1])
    if spec.startswith("openenv:"):
        from grouprl.envs.openenv import openenv_spec

        return openenv_spec(spec.split(":", 1)[1])
    if ":" in spec:
        return _import(spec, "environment")
    if spec in ENVIRONMENTS:
        return ENVIRONMENTS.get(spec)
    raise ConfigError(f"unknown environment {spec!r}. Built-in: {', '.join(ENVIRONMENTS.names()) or '(none)'}."
                      f"{did_you_mean(spec, ENVIRONMENTS.names())} Your own class can be given as "
                      f"'package.module:ClassName'.")
