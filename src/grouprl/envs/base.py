"""The tool-environment contract the multi-turn rollout drives: one live :class:`ToolEnv` per trajectory.

Two ways in, both TRL's (``GRPOTrainer(tools=...)`` and ``GRPOTrainer(environment_factory=...)``,
docs/source/grpo_trainer.md, "Agent Training"):

- ``tools=[fn, ...]``: plain functions with type hints and a Google-style docstring. They hold no state,
  so every trajectory shares them.
- ``environment_factory=Cls``: a class built fresh for each trajectory. ``reset(**row) -> str | None``
  receives the dataset row's columns as keyword arguments (a returned string is appended to the last
  user message, as TRL does; with no dataset it is the whole prompt); every public method other than
  ``reset``, ``get_reward`` and ``close`` is a tool; an optional ``get_reward()`` is the environment's own
  reward, added to the reward functions' sum; an optional ``close()`` is called once the rollout's
  environment is done with (after its reward was read), e.g. to end an HTTP session.
  ``{name: Cls}`` picks the class by the row's ``environment`` column (not forwarded to ``reset``).
- a *conversational* environment (``conversational = True`` on the class, see
  :mod:`grouprl.envs.conversational`) also answers the model's free-text turns: ``step(text) ->
  (observation, reward, done)``; its ``step`` is not a tool either.
- both together: the plain functions are offered next to the environment's methods.

Tools and ``get_reward`` may be ``async def``; they are awaited in the calling thread.

Tool schemas come from ``transformers.utils.get_json_schema`` (the OpenAI ``{"type": "function",
"function": {...}}`` format chat templates render); arguments are checked against them with
``jsonschema`` before a tool runs, so a model's wrong call gets a message it can act on. What is
hand-written here is only the adapter between those two libraries and the rollout.

:func:`call_with_timeout` bounds one call, and caps what it returns (:class:`OutputCap`: bytes, then tokens) at
the point where the result is produced: a tool that returns 10 MB costs milliseconds, and the model reads
the first ``max_bytes`` / ``max_tokens`` with a note; such a call counts as a failed one (``output_too_long``). A Python tool that ignores the deadline keeps its (daemon)
thread running until it returns: tools are trusted code. Model-written code never runs in this process;
it goes to :mod:`grouprl.sandbox` (the ``python`` environment), whose jobs are killed at their deadline.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import inspect
import threading
from collections.abc import Callable, Mapping
from typing import Any

from grouprl.envs.guard import DEFAULT_OUTPUT_CAP, OutputCap, checked_env_reward
from grouprl.envs.guard import (
    BadEnvReward as BadEnvReward,  # re-exported: the rollout's contract types live here
)
from grouprl.envs.schema import (
    CONVERSATIONAL_NOT_TOOLS,
    NOT_TOOLS,
    BadArgumentsError,
    ToolError,
    UnknownToolError,
    format_result,
    is_conversational,
    method_schemas,
    public_methods,
    tool_schema,
    validate_arguments,
)
from grouprl.errors import ConfigError, GroupRLError

# the tool contract's names from envs/schema.py and envs/guard.py are importable from here too
__all__ = [
    "BadArgumentsError",
    "BadEnvReward",
    "CONVERSATIONAL_NOT_TOOLS",
    "ClassToolEnv",
    "DEFAULT_OUTPUT_CAP",
    "ERROR_KINDS",
    "EnvironmentResetError",
    "NOT_TOOLS",
    "OutputCap",
    "ToolEnv",
    "ToolError",
    "UnknownToolError",
    "call_with_timeout",
    "format_result",
    "is_conversational",
    "make_env_factory",
    "method_schemas",
    "public_methods",
    "tool_schema",
    "validate_arguments",
]

ERROR_KINDS = ("unknown_tool", "bad_arguments", "exception", "timeout", "output_too_long")


class EnvironmentResetError(GroupRLError):
    """An environment's ``reset()`` raised on a row (the message names the environment and the row)."""


class ToolEnv:
    """A live environment for ONE trajectory: its tools, their state, and an optional reward.

    ``tools`` are the JSON schemas shown to the model. ``reset(row)`` starts the trajectory (a returned
    string is appended to the prompt), ``call(name, arguments)`` runs one tool and returns its text,
    ``reward()`` is the environment-owned reward (None when it has none), ``close()`` frees resources.
    ``instance`` is the user's environment object (None for plain ``tools=``): reward functions read
    its attributes (e.g. ``edits``, ``returned_ids``).
    """

    tools: list[dict]
    instance: Any = None
    conversational: bool = False  # True: ``respond(text)`` answers a model turn without a tool call
    output_cap: OutputCap = DEFAULT_OUTPUT_CAP  # set per run by make_env_factory(output_cap=...)

    def __init__(self, fns: Mapping[str, Callable[..., Any]], tools: list[dict]) -> None:
        self._fns = dict(fns)
        self.tools = tools
        self._params = {t["function"]["name"]: t["function"].get("parameters") or {} for t in tools}

    @property
    def tool_names(self) -> list[str]:
        return list(self._fns)

    def reset(self, row: Mapping[str, Any]) -> str | None:
        return None

    def call(self, name: str, arguments: Any) -> str:
        """Run tool ``name``; raises UnknownToolError / BadArgumentsError, or whatever the tool raises."""
        if name not in self._fns:
            known = ", ".join(self._fns) or "(none)"
            raise UnknownToolError(f"unknown tool {name!r}; available tools: {known}")
        arguments = {} if arguments is None else arguments
        validate_arguments(name, self._params[name], arguments)
        return format_result(_resolve(self._fns[name](**arguments)))

    def reward(self) -> float | None:
        return None

    def close(self) -> None:
        return None


class ClassToolEnv(ToolEnv):
    """A TRL ``environment_factory`` object seen through the :class:`ToolEnv` contract (plus any
    stand-alone ``extra`` tools, given as ``(functions by name, their schemas)``)."""

    def __init__(self, instance: Any, extra: tuple[dict, list[dict]] = ({}, [])) -> None:
        if not callable(getattr(instance, "reset", None)):
            raise ConfigError(f"environment {type(instance).__name__} has no reset() method; TRL's contract "
                              f"needs reset(self, **kwargs) -> str | None, called at the start of each rollout")
        fns = {name: getattr(instance, name) for name in public_methods(type(instance))}
        schemas = copy.deepcopy(method_schemas(type(instance)))
        clash = sorted(set(fns) & set(extra[0]))
        if clash:
            raise ConfigError(f"tool name(s) {clash} are both a method of {type(instance).__name__} and a "
                              f"function in tools=; rename one")
        super().__init__({**fns, **extra[0]}, schemas + extra[1])
        self.instance = instance
        self.conversational = is_conversational(type(instance))
        self._step_rewards: list[float] = []

    def respond(self, text: str) -> tuple[str | None, float | None, bool]:
        """A conversational environment's answer to the model's free-text turn (``step(text)``)."""
        from grouprl.envs.conversational import check_step_result

        out = check_step_result(type(self.instance).__name__, _resolve(self.instance.step(text)))
        if out[1] is not None:
            self._step_rewards.append(out[1])
        return out

    def reset(self, row: Mapping[str, Any]) -> str | None:
        reset = self.instance.reset
        try:
            out = _resolve(reset(**_accepted_kwargs(reset, row)))
        except GroupRLError:
            raise
        except Exception as e:  # the user's environment: name it and the row, not only the traceback's last line
            prompt = str(row.get("prompt", ""))
            raise EnvironmentResetError(
                f"{type(self.instance).__name__}.reset() raised {type(e).__name__}: {e} -- on the row with "
                f"prompt {prompt[:80]!r}{'...' if len(prompt) > 80 else ''} (columns: {', '.join(map(str, row))}). "
                f"Fix the environment's reset(**row) for such rows, or drop them from the data.") from e
        if out is not None and not isinstance(out, str):
            raise TypeError(f"{type(self.instance).__name__}.reset() returned {type(out).__name__}; "
                            f"it must return a string (added to the prompt) or None")
        return out

    def reward(self) -> float | None:
        get_reward = getattr(self.instance, "get_reward", None)
        if get_reward is None:  # a conversational environment's step rewards, when it gave any
            return sum(self._step_rewards) if self._step_rewards else None
        return checked_env_reward(_resolve(get_reward()), type(self.instance).__name__)

    def close(self) -> None:
        close = getattr(self.instance, "close", None)
        if callable(close):
            _resolve(close())


def _resolve(value: Any) -> Any:
    """Await ``value`` when an ``async def`` tool, reset or get_reward returned a coroutine."""
    if inspect.isawaitable(value):
        async def wait() -> Any:
            return await value

        return asyncio.run(wait())
    return value


def _accepted_kwargs(fn: Callable[..., Any], row: Mapping[str, Any]) -> dict[str, Any]:
    """``row`` for ``fn(**row)``: all of it when ``fn`` takes ``**kwargs``, else only the names it takes."""
    params = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return dict(row)
    return {k: v for k, v in row.items() if k in params}


def make_env_factory(tools: list[Callable[..., Any]] | None = None, environment_factory: Any = None,
                     output_cap: OutputCap | None = None) -> Callable[[], ToolEnv]:
    """A zero-argument callable that builds one fresh :class:`ToolEnv` per trajectory.

    Give ``tools`` (plain functions), ``environment_factory`` (a class, a zero-argument callable returning
    an environment object, or ``{name: Cls}`` whose row column ``environment`` picks one), or both (as in
    TRL, the functions are offered next to the environment's methods). Schemas are built here, so a tool
    the model could not be shown fails at start-up. ``output_cap`` bounds every result (default
    :data:`DEFAULT_OUTPUT_CAP`).
    """
    if tools is None and environment_factory is None:
        raise ConfigError("give tools=[fn, ...] (plain functions) and/or environment_factory=Cls (a class "
                          "whose public methods are tools); got neither")
    extra = _functions(tools) if tools is not None else ({}, [])
    if environment_factory is None:
        build: Callable[[], ToolEnv] = lambda: ToolEnv(*extra)  # noqa: E731
    elif isinstance(environment_factory, Mapping):
        build = _dict_factory(environment_factory, extra)
    else:
        build = _class_factory(environment_factory, extra)
    return build if output_cap is None else functools.partial(_capped, build, output_cap)


def _capped(build: Callable[[], ToolEnv], cap: OutputCap) -> ToolEnv:
    env = build()
    env.output_cap = cap
    return env


def _functions(tools: list[Callable[..., Any]]) -> tuple[dict, list[dict]]:
    """(functions by name, their schemas) for ``tools=``."""
    if not isinstance(tools, (list, tuple)) or not tools:
        raise ConfigError(f"tools must be a non-empty list of functions, got {tools!r:.80}")
    fns: dict[str, Callable[..., Any]] = {}
    for fn in tools:
        if not callable(fn) or isinstance(fn, type):
            raise ConfigError(f"tools: {fn!r:.80} is not a function; give plain functions, or a class as "
                              f"environment_factory=")
        if fn.__name__ in fns:
            raise ConfigError(f"tools: two tools are named {fn.__name__!r}; tool names must be unique")
        fns[fn.__name__] = fn
    return fns, [tool_schema(fn) for fn in fns.values()]


def _class_factory(factory: Any, extra: tuple[dict, list[dict]] = ({}, [])) -> Callable[[], ToolEnv]:
    if not callable(factory):
        raise ConfigError(f"environment_factory must be a class (or a zero-argument callable returning an "
                          f"environment), got {factory!r:.80}")
    cls = factory if isinstance(factory, type) else None
    if cls is not None:
        if not callable(getattr(cls, "reset", None)):
            raise ConfigError(f"environment_factory {cls.__name__} has no reset() method; TRL's contract needs "
                              f"reset(self, **kwargs) -> str | None, called at the start of each rollout")
        if not public_methods(cls) and not extra[0] and not is_conversational(cls):
            raise ConfigError(f"environment_factory {cls.__name__} has no public methods, so the model "
                              f"would have no tools; give it methods with type hints and docstrings")
        method_schemas(cls)  # fail at start-up, not at the first rollout
    return lambda: ClassToolEnv(factory(), extra)


class _Selecting(ToolEnv):
    """A ``{name: Cls}`` factory: the row's ``environment`` column picks the class at reset."""

    def __init__(self, factories: Mapping[str, Callable[[], ToolEnv]]) -> None:
        super().__init__({}, [])
        self._factories = factories
        self._env: ToolEnv | None = None

    def reset(self, row: Mapping[str, Any]) -> str | None:
        name = row.get("environment")
        if name not in self._factories:
            raise ConfigError(f"row column 'environment' is {name!r}; with several environments it must be "
                              f"one of: {', '.join(self._factories)}")
        self._env = self._factories[name]()
        self.tools, self.instance = self._env.tools, self._env.instance
        self.conversational = self._env.conversational
        return self._env.reset({k: v for k, v in row.items() if k != "environment"})  # TRL: not forwarded

    def call(self, name: str, arguments: Any) -> str:
        if self._env is None:
            raise UnknownToolError(f"unknown tool {name!r}: the environment was not reset yet")
        return self._env.call(name, arguments)

    def respond(self, text: str) -> tuple[str | None, float | None, bool]:
        return self._env.respond(text)

    def reward(self) -> float | None:
        return None if self._env is None else self._env.reward()

    def close(self) -> None:
        if self._env is not None:
            self._env.close()


def _dict_factory(factories: Mapping[str, Any], extra: tuple[dict, list[dict]]) -> Callable[[], ToolEnv]:
    if not factories:
        raise ConfigError("environment_factory={} is empty; give {name: Cls, ...}")
    built = {str(k): _class_factory(v, extra) for k, v in factories.items()}
    return lambda: _Selecting(built)


def call_with_timeout(env: ToolEnv, name: str, arguments: Any, timeout_s: float) -> tuple[str, str | None]:
    """Run ``env.call(name, arguments)`` in a worker thread for at most ``timeout_s`` seconds. Never raises.

    Returns ``(text, error_kind)``: the tool's text and None, or a short message for the model and one
    of ``"unknown_tool"``, ``"bad_arguments"``, ``"exception"``, ``"timeout"``, ``"output_too_long"`` (the
    text is then the result's head cut by the environment's :class:`OutputCap`, with a note). A Python tool that
    ignores the deadline keeps its daemon thread until it returns (tools are trusted code; untrusted
    code belongs in the sandbox, whose jobs are killed at their deadline), and may still change the
    environment's state after the timeout was reported. Calls on one environment are meant to be made
    one at a time (a trajectory's tool calls in order); different environments may be called concurrently.
    """
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            box["text"] = env.call(name, arguments)
        except BaseException as e:  # noqa: BLE001 -- everything a tool raises is reported to the model
            box["error"] = e

    worker = threading.Thread(target=work, name=f"grouprl-tool-{name}", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        return f"error: tool {name!r} did not finish within {timeout_s:g}s", "timeout"
    err = box.get("error")
    if err is None:
        text, over = getattr(env, "output_cap", DEFAULT_OUTPUT_CAP).apply(format_result(box.get("text", "")))
        return text, None if over is None else "output_too_long"
    if isinstance(err, UnknownToolError):
        return f"error: {err}", "unknown_tool"
    if isinstance(err, BadArgumentsError):
        return f"error: {err}", "bad_arguments"
    detail = f": {err}" if str(err) else ""
    return f"error: tool {name!r} raised {type(err).__name__}{detail}", "exception"
