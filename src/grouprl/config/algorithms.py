"""What each training loop supports: the declarations the start-up checks read instead of algorithm names.

An ``algorithm`` in a recipe names a :class:`Supports` entry of :data:`SUPPORTS`. The entry names the loop
that trains it (``loop``: an entry of ``grouprl.train.algorithms.ALGORITHMS``), the preset that fills the
loss fields the user left unset, and what the loop can run (groups, process count, DeepSpeed, the bf16 lean
sampler, a critic, its own fields). Every check -- here in config/, in train/parallel/, in train/engine/ --
reads these fields; no code outside ``grouprl/train/algorithms/`` compares ``cfg.algorithm`` to a name
(docs/DESIGN.md, "Algorithms are plug-ins").

The table lives in config/ because the config is checked when it is built, before torch loads, and the
config sits below train/ (imports flow one way). A plug-in algorithm adds its own entry with
``grouprl.train.algorithms.register_algorithm(name, train, supports=Supports(...))`` (docs/EXTENDING.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from grouprl.errors import ConfigError, did_you_mean

PPO_FIELDS = ("critic_model", "critic_learning_rate", "vf_coef", "cliprange_value", "gamma", "lam",
              "whiten_advantages", "kl_mode")
"""Fields read only by a loop with a critic (``algorithm: ppo``, grouprl.train.algorithms.ppo)."""


@dataclass(frozen=True)
class Supports:
    """What one algorithm's loop can run."""

    loop: str
    """The ``ALGORITHMS`` entry (grouprl.train.algorithms) that trains it."""
    preset: str | None = None
    """The ``ALGORITHM_PRESETS`` entry (config/presets.py) that fills unset loss fields; ``None``: the loop
    calls no registered policy loss or advantage (only the preset's off switches apply)."""
    groups: bool = True
    """Needs at least 2 completions per prompt (a group baseline)."""
    offline: bool = False
    """Trains on preference pairs: no sampler, reward, advantage or policy loss; its batch counts pairs."""
    critic: bool = False
    """Trains a value model next to the policy: the critic fields apply and are checked."""
    max_processes: int | None = None
    """The most processes its loop runs on (``None``: any number)."""
    deepspeed: bool = True
    """Runs under DeepSpeed ZeRO-2/3 (its optimizer steps go through the engine)."""
    lean_bf16_rollout: bool = True
    """Its single-turn rollouts may sample from the lean sampler's bf16 copy (``rollout_dtype``)."""
    async_rollouts: bool = False
    """Runs a rollout worker that generates while it trains (``max_staleness`` >= 1, grouprl.train.pipeline)."""
    own_fields: tuple[str, ...] = ()
    """Config fields only this loop reads: setting one for another algorithm is an error."""
    fields_reason: str = ""
    """Why the own fields need this loop (completes "only algorithm: <name> ...")."""


_GROUP = {name: Supports(loop="grpo", preset=name, async_rollouts=True) for name in ("grpo", "gspo", "dr_grpo", "dapo", "rloo")}
SUPPORTS: dict[str, Supports] = {
    **_GROUP,  # GRPO-family: one loop, presets of losses and estimators (grouprl.train.algorithms.grpo)
    "ppo": Supports(loop="ppo", preset="ppo", groups=False, critic=True, max_processes=1, lean_bf16_rollout=False,
                    own_fields=PPO_FIELDS, fields_reason="has a critic"),
    "dpo": Supports(loop="dpo", preset=None, groups=False, offline=True, deepspeed=False, lean_bf16_rollout=False),
}
"""Algorithm name -> what its loop supports (plug-ins add theirs with :func:`declare`)."""


def declare(name: str, supports: Supports) -> Supports:
    """Add a plug-in algorithm's declaration (an existing name may be declared again only identically)."""
    if name in SUPPORTS and SUPPORTS[name] != supports:
        raise ValueError(f"algorithm {name!r} is already declared as {SUPPORTS[name]!r}")
    SUPPORTS[name] = supports
    return supports


def supports_of(name: str) -> Supports:
    """The declaration of algorithm ``name``; an unknown name is an error listing the known ones."""
    if name not in SUPPORTS:
        raise ConfigError(f"algorithm={name!r} is not a known preset.{did_you_mean(str(name), SUPPORTS)} "
                          f"Known: {', '.join(SUPPORTS)}. Any combination can be built by setting policy_loss, "
                          f"advantage and loss_aggregation directly.")
    return SUPPORTS[name]


def owner_of(field: str) -> tuple[str, Supports] | None:
    """The first algorithm declaring ``field`` as its own, with its declaration."""
    return next(((n, s) for n, s in SUPPORTS.items() if field in s.own_fields), None)
