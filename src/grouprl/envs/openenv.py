"""OpenEnv environments over HTTP as conversational environments: ``environment: openenv:<url>``.

OpenEnv (github.com/meta-pytorch/OpenEnv, ``openenv-core``) serves a Gymnasium-like environment -- ``reset()``,
``step(action)`` returning an observation with ``reward`` and ``done`` -- behind a FastAPI/WebSocket server; a
client holds one *session* on the server, and the server admits at most ``max_concurrent_envs`` sessions at
a time ("Server at capacity: 1/1 sessions active" beyond that). :func:`openenv_env` builds a class that
follows grouprl's conversational contract (:mod:`grouprl.envs.conversational`), one session per rollout:

- ``reset(seed=...)`` opens a session (``GenericEnvClient(base_url).sync()``), resets it and returns the
  observation's text as the prompt;
- each model turn without a tool call is sent as the action ``{action_key: text}``; the observation's text
  is the next user message, its ``reward`` is summed into the rollout's reward, its ``done`` ends the
  rollout (``env_done``);
- ``close()`` ends the session: grouprl calls it once the rollout's reward was read, so a server with
  ``max_concurrent_envs = B x G`` serves a whole run.

The observation's text is ``observation[observation_key]`` when given, else the first string among the
keys ``prompt``, ``message``, ``echoed_message``, ``text``, ``observation``, ``content``, else the observation
as JSON. ``openenv:http://host:port?action=message&observation=echoed_message`` sets both keys in a recipe.
``GenericEnvClient`` speaks plain dicts, so no environment-specific package is needed on the trainer's side.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import parse_qs, urlsplit, urlunsplit

from grouprl.errors import ConfigError

TEXT_KEYS = ("prompt", "message", "echoed_message", "text", "observation", "content")


def _client(base_url: str, timeout_s: float) -> Any:
    try:
        from openenv.core.generic_client import GenericEnvClient
    except ImportError as e:
        raise ConfigError("environment openenv:<url> needs the OpenEnv client: pip install openenv-core") from e
    return GenericEnvClient(base_url=base_url, message_timeout_s=timeout_s).sync()


class OpenEnvEnv:
    """One OpenEnv session per rollout (see the module docstring); build one with :func:`openenv_env`."""

    conversational = True
    base_url: str = ""
    action_key: str = "message"
    observation_key: str | None = None
    timeout_s: float = 30.0

    def __init__(self) -> None:
        self._session: Any = None

    def reset(self, seed: int | None = None, **row: Any) -> str | None:
        self.close()  # a reused object: the previous episode's session ends first
        self._session = _client(self.base_url, self.timeout_s)
        self._session.connect()
        result = self._session.reset(**({} if seed is None else {"seed": seed}))
        return self._text(result.observation) or None

    def step(self, text: str) -> tuple[str | None, float | None, bool]:
        result = self._session.step({self.action_key: text})
        reward = None if result.reward is None else float(result.reward)
        return (None if result.done else self._text(result.observation)), reward, bool(result.done)

    def close(self) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            session.close()

    def _text(self, observation: Any) -> str:
        data = observation if isinstance(observation, dict) else getattr(observation, "__dict__", {})
        if self.observation_key is not None:
            if self.observation_key not in data:
                raise KeyError(f"OpenEnv observation has no key {self.observation_key!r} (keys: {', '.join(data)})")
            return str(data[self.observation_key])
        for key in TEXT_KEYS:
            if isinstance(data.get(key), str):
                return data[key]
        return json.dumps(data, default=str)


def openenv_env(base_url: str, *, action_key: str = "message", observation_key: str | None = None,
                timeout_s: float = 30.0) -> type:
    """An :class:`OpenEnvEnv` subclass for the server at ``base_url`` (``http://`` or ``https://``)."""
    if not base_url.startswith(("http://", "https://")):
        raise ConfigError(f"openenv: {base_url!r} must be an http(s) URL, e.g. openenv:http://127.0.0.1:8000")
    query = "&".join(f"{k}={v}" for k, v in (("action", action_key), ("observation", observation_key)) if v)
    return type("OpenEnvEnv", (OpenEnvEnv,), {
        "base_url": base_url, "action_key": action_key, "observation_key": observation_key, "timeout_s": timeout_s,
        "spec_name": f"openenv:{base_url}" + (f"?{query}" if query else ""), "__module__": __name__})


def openenv_spec(spec: str) -> type:
    """The class for ``environment: openenv:<url>[?action=KEY&observation=KEY]``."""
    parts = urlsplit(spec)
    options = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    unknown = sorted(set(options) - {"action", "observation"})
    if unknown:
        raise ConfigError(f"openenv:{spec}: unknown option(s) {unknown}; known: action, observation")
    url = urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))
    return openenv_env(url, action_key=options.get("action", "message"), observation_key=options.get("observation"))
