"""textarena games as conversational environments: ``environment: textarena:<EnvId>``.

textarena (github.com/LeonGuertler/TextArena; arXiv 2504.11442) plays text games behind one interface:
``ta.make(env_id)``, ``reset(num_players, seed)``, ``get_observation() -> (player_id, text)``,
``step(action) -> (done, info)`` and ``close() -> (rewards, game_info)``. :func:`textarena_env` wraps one
game id in a class that follows grouprl's conversational contract (:mod:`grouprl.envs.conversational`):

- ``reset(seed=...)`` starts a game (the row's ``seed`` column, else the row's index in the run is not
  known here, so an unseeded game is random) and returns the game's first observation as the prompt;
- each model turn without a tool call is the player's action; the game's new observation text (the part
  after what the model has already seen) is the next user message; ``done`` ends the rollout (``env_done``);
- ``get_reward()`` is the player's reward from ``close()`` (textarena's: 1 win, -1 loss, 0 draw for most
  games), 0.0 when the game did not finish (a rollout cut by ``max_turns`` or the token budget);
- ``close()`` closes the game once.

Single-player games only (``num_players=1``: GuessTheNumber, Wordle, TwentyQuestions' offline variants, ...);
a multi-player game needs opponents, which this adapter does not play. Games that call an LLM or download
word lists at run time are not offline; the tests use ``GuessTheNumber-v0``.
"""

from __future__ import annotations

from typing import Any

from grouprl.errors import ConfigError


def _make(env_id: str) -> Any:
    try:
        import textarena
    except ImportError as e:
        raise ConfigError("environment textarena:<id> needs the textarena package: pip install textarena") from e
    from textarena.envs.registration import ENV_REGISTRY

    if env_id not in ENV_REGISTRY:
        from grouprl.errors import did_you_mean

        raise ConfigError(f"textarena has no game {env_id!r}.{did_you_mean(env_id, sorted(ENV_REGISTRY))}")
    return textarena.make(env_id)


class TextArenaEnv:
    """One single-player textarena game per rollout (see the module docstring); subclass with ``env_id`` set,
    or build one with :func:`textarena_env`."""

    conversational = True
    env_id: str = ""

    def __init__(self) -> None:
        self._game = _make(self.env_id)
        self._seen, self._result, self._open = "", None, False

    def reset(self, seed: int | None = None, **row: Any) -> str:
        self._game.reset(num_players=1, seed=seed)
        self._open, self._result = True, None
        _, observation = self._game.get_observation()
        self._seen = _text(observation)
        return self._seen

    def step(self, text: str) -> tuple[str | None, float | None, bool]:
        done, _ = self._game.step(text)
        if done:
            self._finish()
            return None, None, True
        _, observation = self._game.get_observation()
        full = _text(observation)
        new = full[len(self._seen):] if full.startswith(self._seen) else full  # the history grows; send the news
        self._seen = full
        return new.strip() or full.strip(), None, False

    def get_reward(self) -> float:
        rewards = self._result[0] if self._result else None
        return float(rewards.get(0, 0.0)) if isinstance(rewards, dict) else 0.0

    def close(self) -> None:
        self._finish()

    def _finish(self) -> None:
        if self._open:
            self._open = False
            self._result = self._game.close()


def _text(observation: Any) -> str:
    """textarena's observation as text (a string, or the ``-raw`` variants' list of ``(sender, text, kind)``)."""
    if isinstance(observation, str):
        return observation
    if isinstance(observation, (list, tuple)):
        return "\n".join(str(part[1] if isinstance(part, (list, tuple)) and len(part) > 1 else part)
                         for part in observation)
    return str(observation)


def textarena_env(env_id: str) -> type:
    """A :class:`TextArenaEnv` subclass for game ``env_id`` (checked now: a typo fails at start-up)."""
    _make(env_id)  # building one checks the id (and that textarena is installed)
    name = "TextArena_" + "".join(c if c.isalnum() else "_" for c in env_id)
    # spec_name: what a recipe writes to get this class back (the run's config.yaml records it)
    return type(name, (TextArenaEnv,), {"env_id": env_id, "spec_name": f"textarena:{env_id}", "__module__": __name__})
