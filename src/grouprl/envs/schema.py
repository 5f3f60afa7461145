"""What makes a tool: which methods of an environment class are tools, their OpenAI-style JSON schemas (from
the type hints and docstrings, as TRL builds them), argument checking against a schema, and how a result
becomes the text the model reads. The tool-call error types live here too; :mod:`grouprl.envs.base`
re-exports every name.
"""

from __future__ import annotations

import functools
import inspect
import json
from collections.abc import Callable, Mapping
from typing import Any

from grouprl.errors import ConfigError, GroupRLError

# TRL: every other public method is a tool; ``close`` is the end-of-rollout hook (a tool could end the session)
NOT_TOOLS = frozenset({"reset", "get_reward", "close"})


CONVERSATIONAL_NOT_TOOLS = NOT_TOOLS | {"step"}


class ToolError(GroupRLError):
    """A tool call the environment refused; the message is written for the model to read."""


class UnknownToolError(ToolError):
    """The model called a tool this environment does not have."""


class BadArgumentsError(ToolError):
    """The model's arguments do not match the tool's schema."""


def is_conversational(cls: type) -> bool:
    """Whether instances of ``cls`` answer free-text model turns (``conversational = True`` and a ``step``)."""
    return bool(getattr(cls, "conversational", False)) and callable(getattr(cls, "step", None))


def public_methods(cls: type) -> list[str]:
    """TRL's rule: the public methods of ``cls`` (no leading ``_``; instance or class methods, not static
    ones), except ``reset``, ``get_reward`` and ``close`` (and ``step`` of a conversational environment)."""
    out = []
    skip = CONVERSATIONAL_NOT_TOOLS if is_conversational(cls) else NOT_TOOLS
    for name in dir(cls):
        if name.startswith("_") or name in skip:
            continue
        attr = inspect.getattr_static(cls, name)
        if inspect.isfunction(attr) or isinstance(attr, classmethod):
            out.append(name)
    return out


@functools.lru_cache(maxsize=256)
def method_schemas(cls: type) -> list[dict]:
    """Schemas of the tool methods of ``cls`` (built once per class; ConfigError names the method)."""
    out = []
    for name in public_methods(cls):
        fn = getattr(cls, name)
        # a plain function still has ``self``: bind it to a placeholder so the schema leaves it out
        if inspect.isfunction(inspect.getattr_static(cls, name)):
            fn = fn.__get__(object(), cls)
        out.append(tool_schema(fn, owner=cls.__name__))
    return out


def tool_schema(fn: Callable[..., Any], owner: str = "") -> dict:
    """The OpenAI-style schema of ``fn`` from ``transformers.utils.get_json_schema``; ConfigError if it
    cannot be built (no docstring, an argument without a type hint or without an ``Args:`` line)."""
    from transformers.utils import get_json_schema

    where = f"{owner}.{fn.__name__}" if owner else getattr(fn, "__name__", repr(fn))
    if owner and not inspect.getdoc(fn):
        fn = _described(fn, where)
    try:
        return get_json_schema(fn)
    except Exception as e:  # transformers raises DocstringParsingException / TypeHintParsingException
        raise ConfigError(
            f"tool {where!r} cannot be shown to the model: {e}. A tool needs a type hint on every argument "
            f"and a Google-style docstring: a one-line description, then 'Args:' with one "
            f"'name: description' line per argument."
        ) from e


def _described(method: Callable[..., Any], where: str) -> Callable[..., Any]:
    """A stand-in for an environment method without a docstring, so a schema can still be built from its
    type hints (TRL's documentation elides the docstrings of its second ``IncrementEnv``): the model is
    shown the method's name and argument types, with the argument names as their descriptions."""
    import logging
    import typing

    hints = typing.get_type_hints(method)
    params = [p for p in inspect.signature(method).parameters.values() if p.name != "self"]

    def stand_in(*args: Any, **kwargs: Any) -> Any:
        return method(*args, **kwargs)

    stand_in.__name__, stand_in.__signature__ = method.__name__, inspect.signature(method)
    stand_in.__annotations__ = hints
    args = "".join(f"    {p.name}: {p.name}\n" for p in params)
    stand_in.__doc__ = f"{method.__name__.replace('_', ' ')}.\n\n" + (f"Args:\n{args}" if args else "")
    logging.getLogger("grouprl").warning("tool %s has no docstring: the model sees only its name and argument "
                                         "types; add a Google-style docstring to describe it", where)
    return stand_in


def validate_arguments(name: str, params: Mapping[str, Any], arguments: Any) -> None:
    """BadArgumentsError (worded for the model) unless ``arguments`` fit the tool's parameter schema."""
    import jsonschema

    props = params.get("properties") or {}
    expected = ", ".join(props) or "no arguments"
    if not isinstance(arguments, Mapping):
        raise BadArgumentsError(f"arguments of tool {name!r} must be a JSON object; expected: {expected}")
    for key in arguments:
        if key not in props:
            raise BadArgumentsError(f"unknown argument {key!r} for tool {name!r}; expected: {expected}")
    for key in params.get("required") or []:
        if key not in arguments:
            raise BadArgumentsError(f"missing argument {key!r} for tool {name!r}; expected: {expected}")
    try:
        jsonschema.validate(dict(arguments), {k: v for k, v in params.items() if k != "description"})
    except jsonschema.ValidationError as e:
        path = ".".join(str(p) for p in e.absolute_path)
        where = f"argument {path!r}" if path else "arguments"
        raise BadArgumentsError(f"{where} of tool {name!r}: {e.message}") from None


def format_result(value: Any) -> str:
    """A tool's return value as the text the model reads (strings as they are, other values as JSON)."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return str(value)
