"""Checks of the agent fields (``tools``, ``environment``, ``max_turns``, ...) that need no import.

Run when a config is built. Resolving the names (importing ``pkg.mod:fn``, building the tool schemas) needs
transformers and the user's modules; it happens at start-up, before the model loads
(:func:`grouprl.train.agent.build_agent`).
"""

from __future__ import annotations

from typing import Any

from grouprl.errors import ConfigError

AGENT_FIELDS = ("tools", "environment", "max_turns", "max_tool_failures", "tool_timeout_s",
                "max_tool_output_bytes", "max_tool_output_tokens", "trajectory_timeout_s", "chat_template",
                "max_concurrent_tools", "agent_schedule")


def uses_tools(cfg: Any) -> bool:
    """True when rollouts are multi-turn: tools or an environment are configured."""
    return bool(cfg.tools) or cfg.environment is not None


def check_agent_fields(cfg: Any) -> None:
    """Each message names the field, the value and the fix."""
    for spec in cfg.tools:
        if not isinstance(spec, str) and not callable(spec):
            raise ConfigError(f"tools entry {spec!r} must be a 'package.module:function' string (or, in Python, "
                              f"a function).")
        if isinstance(spec, str) and (spec.count(":") != 1 or not all(spec.split(":"))):
            raise ConfigError(f"tools entry {spec!r} must look like 'package.module:function' (one colon between "
                              f"the module and the function's name).")
    env = cfg.environment
    adapter = isinstance(env, str) and env.startswith(("textarena:", "openenv:")) and len(env.split(":", 1)[1]) > 0
    if isinstance(env, str) and not adapter and (not env.strip() or env.count(":") > 1 or env.startswith(":")
                                                 or env.endswith(":")):
        raise ConfigError(f"environment={env!r} must be a built-in name (calculator, python, search, guess_number), "
                          f"'textarena:<GameId>', 'openenv:<http url>' or 'package.module:ClassName'.")
    for name, what in (("max_turns", "model turns per rollout"), ("max_concurrent_tools", "tool calls at once")):
        value = getattr(cfg, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{name}={value!r} must be a whole number >= 1 ({what}).")
    failures = cfg.max_tool_failures
    if failures is not None and (isinstance(failures, bool) or not isinstance(failures, int) or failures < 1):
        raise ConfigError(f"max_tool_failures={failures!r} must be a whole number >= 1, or null for no limit.")
    for name in ("max_tool_output_bytes", "max_tool_output_tokens"):
        value = getattr(cfg, name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ConfigError(f"{name}={value!r} must be a whole number >= 1 (a cap on one tool result), or null "
                              f"for no limit.")
    for name in ("tool_timeout_s", "trajectory_timeout_s"):
        value = getattr(cfg, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ConfigError(f"{name}={value!r} must be a number of seconds > 0.")
    if cfg.chat_template is not None and not str(cfg.chat_template).strip():
        raise ConfigError("chat_template='' is empty: give a .jinja file (or leave it null for the tokenizer's).")
