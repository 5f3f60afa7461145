"""Conversational environments: the environment answers the model's free-text turn with the next user message.

textarena games, verifiers' ``MultiTurnEnv`` and SkyRL's ``BaseTextEnv`` treat the model's whole turn as the
action and reply with an observation (arXiv 2504.20073 calls this the multi-turn "agent-environment" loop).
The contract here is TRL's ``environment_factory`` class plus two things:

- ``conversational = True`` as a class attribute, and
- ``step(self, text) -> (observation, reward, done)``: called with the model's turn (decoded, special tokens
  skipped) whenever that turn has no ``<tool_call>``. ``observation`` (a string) becomes the next user
  message; ``reward`` (a float or None) is added to the episode's reward; ``done=True`` ends the rollout
  with end reason ``env_done`` (its observation, if any, is not appended: no model turn would read it).

Tools still work: a turn with a tool call runs the tools (the environment's public methods) as usual, a turn
without one goes to ``step``. The environment's reward is ``get_reward()`` when the class defines it, else
the sum of the rewards ``step`` returned. The user turn is appended token-exact after the sampled
end-of-turn token (the chat template's glue + the user message + the next generation prompt, all loss mask 0),
the same path as a tool turn (:func:`grouprl.rollout.chat.tool_turn_ids`). ``step`` runs under the tool
timeout; one that raises, times out or returns something else ends the rollout with ``env_error`` (logged).
"""

from __future__ import annotations

import math
import threading
from typing import Any

from grouprl.errors import GroupRLError


class StepError(GroupRLError):
    """A conversational environment's ``step`` broke its contract (wrong return shape or types)."""


def check_step_result(owner: str, out: Any) -> tuple[str | None, float | None, bool]:
    """``(observation, reward, done)`` from what ``step`` returned; StepError naming ``owner`` otherwise.

    >>> check_step_result("Game", ("higher", 0, False))
    ('higher', 0.0, False)
    """
    if not isinstance(out, (tuple, list)) or len(out) != 3:
        raise StepError(f"{owner}.step(text) returned {out!r:.80}; it must return (observation, reward, done)")
    observation, reward, done = out
    if observation is not None and not isinstance(observation, str):
        raise StepError(f"{owner}.step(text) returned an observation of type {type(observation).__name__}; "
                        f"it must be a string (the next user message) or None")
    if reward is not None:
        try:
            reward = float(reward)
        except (TypeError, ValueError):
            raise StepError(f"{owner}.step(text) returned reward {reward!r:.40}; it must be a float or None") from None
        if not math.isfinite(reward):
            raise StepError(f"{owner}.step(text) returned reward {reward}; it must be finite")
    return observation, reward, bool(done)


def step_with_timeout(env: Any, text: str, timeout_s: float) -> tuple[tuple[str | None, float | None, bool] | None,
                                                                       str | None]:
    """``env.respond(text)`` in a worker thread for at most ``timeout_s`` seconds. Never raises.

    Returns ``(result, None)`` or ``(None, message)`` when the step raised, broke its contract or ran out of
    time (its daemon thread then keeps running until it returns: environments are trusted code)."""
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            box["out"] = env.respond(text)
        except BaseException as e:  # noqa: BLE001 -- reported, the rollout ends with env_error
            box["error"] = e

    worker = threading.Thread(target=work, name="grouprl-env-step", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        return None, f"step did not finish within {timeout_s:g}s"
    if "error" in box:
        err = box["error"]
        return None, f"step raised {type(err).__name__}: {err}"
    return box["out"], None
