"""Algorithm presets, TRL aliases and importance-sampling levels, and how they resolve into a run.

Rules (each one exists because its absence once trained a different algorithm than the config named):

* A preset fills only the fields the user left unset; it never overrides one the user set.
* A preset's clip range (epsilon, epsilon_high) belongs to its policy loss: it applies only while that loss
  is used. Choose another loss (``policy_loss: cispo``, ``importance_sampling_level: sequence``) and that
  loss runs with its own defaults, whatever preset is named -- so writing ``algorithm: grpo`` explicitly or
  not gives the same run. Likewise ``scale_rewards`` follows the advantage estimator: it is taken from the
  preset built around the chosen estimator (dr_grpo and rloo: ``none``).
* A function gets only the hyper-parameters it declares (read from its signature), its own defaults
  otherwise. An option the user set that the chosen function cannot honour is an error naming the option,
  the function and the fix; two options that say different things are an error naming both.

:func:`resolved` is the single answer to "what will training call": it reads the registries lazily (they
import torch), so building and validating a config stays torch-free.
"""

from __future__ import annotations

import inspect
from typing import Any

from grouprl.errors import ConfigError, did_you_mean

_COMMON = dict(kl_coef=0.0, dynamic_sampling="none", mask_truncated_completions=False)
ALGORITHM_PRESETS: dict[str, dict[str, Any]] = {
    # GRPO, arXiv:2402.03300, Eq. 3 (clip 0.2 as PPO).
    "grpo": dict(policy_loss="grpo", epsilon=0.2, epsilon_high=0.2, advantage="grpo",
                 loss_aggregation="seq_mean_token_mean", **_COMMON),
    # GSPO, arXiv:2507.18071, Eqs. 5-7; clip 3e-4 / 4e-4 from its Sec. 5.1.
    "gspo": dict(policy_loss="gspo", epsilon=3e-4, epsilon_high=4e-4, advantage="grpo",
                 loss_aggregation="seq_mean_token_mean", **_COMMON),
    # Dr. GRPO, arXiv:2503.20783, Sec. 3.2: no std division, constant length normaliser.
    "dr_grpo": dict(policy_loss="grpo", epsilon=0.2, epsilon_high=0.2, advantage="dr_grpo", scale_rewards="none",
                    loss_aggregation="seq_mean_token_sum_norm", **_COMMON),
    # DAPO, arXiv:2503.14476: clip-higher 0.2 / 0.28 (Eq. 8), token-level loss, dynamic sampling, overlong mask.
    "dapo": dict(policy_loss="grpo", epsilon=0.2, epsilon_high=0.28, advantage="grpo", loss_aggregation="token_mean",
                 kl_coef=0.0, dynamic_sampling="resample", mask_truncated_completions=True),
    # RLOO, arXiv:2402.14740, Eq. 9: leave-one-out baseline, no std division.
    "rloo": dict(policy_loss="grpo", epsilon=0.2, epsilon_high=0.2, advantage="rloo", scale_rewards="none",
                 loss_aggregation="token_mean", **_COMMON),
    # PPO, arXiv:1707.06347, Eq. 7 on token advantages from GAE over a critic (grouprl.train.algorithms.ppo); with
    # kl_coef > 0 the KL is a per-token reward (kl_mode, InstructGPT arXiv:2203.02155 Eq. 2). `advantage`
    # is not used: PPO's advantages come from the critic (validate.check_critic rejects setting it).
    "ppo": dict(policy_loss="grpo", epsilon=0.2, epsilon_high=0.2, advantage="grpo", loss_aggregation="token_mean",
                **_COMMON),
}
LOSS_OWNED = ("epsilon", "epsilon_high")
"""Preset fields that belong to the preset's policy loss (applied only while that loss is used)."""
ADVANTAGE_OWNED = ("scale_rewards",)
"""Preset fields that belong to the preset's advantage estimator."""
IMPORTANCE_LEVELS = {"token": "grpo", "sequence": "gspo", "sequence_token": "gspo_token"}
"""TRL's importance_sampling_level -> the policy loss that computes its ratio at that level."""
ALIASES = {"beta": "kl_coef", "max_completion_length": "max_new_tokens"}
"""TRL's names -> ours."""
LOSS_OPTIONS = {"epsilon": "eps_low", "epsilon_high": "eps_high"}
"""Config field -> the policy-loss parameter it sets."""


def _mark_explicit(cfg: Any, name: str, instead_of: str) -> None:
    cfg.__dict__["_explicit"] = (cfg.explicit_fields - {instead_of}) | {name}


def resolve_aliases(cfg: Any) -> None:
    """TRL's names into ours; an alias and its target set to different values is an error naming both."""
    if isinstance(cfg.scale_rewards, bool):  # TRL's older boolean form
        cfg.scale_rewards = "group" if cfg.scale_rewards else "none"
    for alias, target in ALIASES.items():
        value = getattr(cfg, alias)
        if value is None:
            continue
        current = getattr(cfg, target)
        if target in cfg.explicit_fields and current != value:
            raise ConfigError(f"{alias}={value!r} and {target}={current!r} disagree: {alias} is TRL's name for "
                              f"{target}; set only one of them.")
        setattr(cfg, target, value)
        setattr(cfg, alias, None)
        _mark_explicit(cfg, target, instead_of=alias)


def apply_preset(cfg: Any) -> None:
    """Fill the unset algorithm fields from importance_sampling_level and the ``algorithm`` preset."""
    from grouprl.config.algorithms import supports_of

    if cfg.algorithm is None:
        cfg.algorithm = "grpo"
    supports = supports_of(cfg.algorithm)  # an unknown name fails here, with the known ones
    if supports.preset is None:  # no sampler, policy loss or advantage: only "off" switches
        for name, value in _COMMON.items():
            if getattr(cfg, name) is None:
                setattr(cfg, name, value)
        return
    level = cfg.importance_sampling_level
    if level is not None:
        if level not in IMPORTANCE_LEVELS:
            raise ConfigError(f"importance_sampling_level={level!r} must be one of {', '.join(IMPORTANCE_LEVELS)}."
                              + did_you_mean(str(level), IMPORTANCE_LEVELS))
        loss = IMPORTANCE_LEVELS[level]
        if cfg.policy_loss is not None and cfg.policy_loss != loss:
            raise ConfigError(
                f"importance_sampling_level={level!r} and policy_loss={cfg.policy_loss!r} disagree: that level is "
                f"policy_loss {loss!r}. Fix: set only one of them (policy_loss names any loss)."
            )
        cfg.policy_loss = loss
    preset = ALGORITHM_PRESETS[supports.preset]
    explicit = cfg.explicit_fields
    for name, value in preset.items():
        if name not in LOSS_OWNED + ADVANTAGE_OWNED and name not in explicit and getattr(cfg, name) is None:
            setattr(cfg, name, value)
    # the estimator's settings come from the preset built around it (rloo on the grpo preset: rloo's "none")
    owner = preset if cfg.advantage == preset["advantage"] else next(
        (p for p in ALGORITHM_PRESETS.values() if p["advantage"] == cfg.advantage), {})
    for name in ADVANTAGE_OWNED:
        if name in owner and name not in explicit:
            setattr(cfg, name, owner[name])
    _fill_clip_range(cfg, preset if cfg.policy_loss == preset["policy_loss"] else None)


def _fill_clip_range(cfg: Any, preset: dict[str, Any] | None) -> None:
    """epsilon / epsilon_high: the user's, else the preset's (only for the preset's own loss), else None
    (= the loss function's own default). epsilon set alone keeps the preset's clip-higher gap (0 without)."""
    if cfg.epsilon is not None and cfg.epsilon_high is None and isinstance(cfg.epsilon, (int, float)):
        gap = preset["epsilon_high"] - preset["epsilon"] if preset else 0.0
        cfg.epsilon_high = cfg.epsilon + gap
    if preset is not None:
        for name in LOSS_OWNED:
            if getattr(cfg, name) is None:
                setattr(cfg, name, preset[name])


# ---- resolution through the registries (lazy: they import torch) -------------------------------------
def _keyword_params(fn: Any) -> tuple[dict[str, Any], bool]:
    """(keyword parameter -> default, or ``inspect.Parameter.empty``), and whether it takes ``**kwargs``."""
    params = inspect.signature(fn).parameters.values()
    kinds = (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return ({p.name: p.default for p in params if p.kind in kinds},
            any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params))


def _defaults(fn: Any) -> dict[str, Any]:
    params, _ = _keyword_params(fn)
    return {k: v for k, v in params.items() if v is not inspect.Parameter.empty}


def _takes(fn: Any, name: str) -> bool:
    params, var_kw = _keyword_params(fn)
    return var_kw or name in params


def _who(kind: str, name: str, fn: Any) -> str:
    where = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', '?')}"
    return f"{kind} {name!r} ({where})"


def loss_hparams(cfg: Any, fn: Any) -> dict[str, Any]:
    """Keyword arguments for the policy loss ``fn`` (the function cfg.policy_loss names): its own defaults,
    then epsilon / epsilon_high where it declares eps_low / eps_high, then loss_kwargs."""
    from grouprl.registry import POLICY_LOSSES

    POLICY_LOSSES.check_kwargs(cfg.policy_loss, cfg.loss_kwargs, where="loss_kwargs")
    hp = _defaults(fn)
    for option, param in LOSS_OPTIONS.items():
        value = getattr(cfg, option)
        if value is None:
            continue
        if param in cfg.loss_kwargs and option in cfg.explicit_fields and cfg.loss_kwargs[param] != value:
            raise ConfigError(f"{option}={value!r} and loss_kwargs.{param}={cfg.loss_kwargs[param]!r} disagree: "
                              f"both set the loss's {param}. Fix: set only {option}.")
        if _takes(fn, param):
            hp[param] = value
        elif option in cfg.explicit_fields:
            takers = [n for n, f in POLICY_LOSSES.items() if _takes(f, param) and not _keyword_params(f)[1]]
            raise ConfigError(
                f"{option}={value!r} is set, but {_who('policy loss', cfg.policy_loss, fn)} takes no {param!r}: "
                f"it has no clip range to apply it to. Fix: remove {option}, or choose a policy_loss that "
                f"takes it ({', '.join(takers)})."
            )
    hp.update(cfg.loss_kwargs)
    return hp


def advantage_hparams(cfg: Any, fn: Any) -> dict[str, Any]:
    """Keyword arguments for the advantage estimator ``fn``: its own defaults, ``scale`` = scale_rewards when
    it declares one, then advantage_kwargs."""
    from grouprl.registry import ADVANTAGES

    ADVANTAGES.check_kwargs(cfg.advantage, cfg.advantage_kwargs, where="advantage_kwargs")
    hp = _defaults(fn)
    user_scale = "scale_rewards" in cfg.explicit_fields
    if _takes(fn, "scale"):
        kw = cfg.advantage_kwargs.get("scale", cfg.scale_rewards)
        if user_scale and kw != cfg.scale_rewards:
            raise ConfigError(f"scale_rewards={cfg.scale_rewards!r} and advantage_kwargs.scale={kw!r} disagree: "
                              f"both set the estimator's scale. Fix: set only scale_rewards.")
        hp["scale"] = cfg.scale_rewards
    elif user_scale and cfg.scale_rewards != "none":
        takers = [n for n, f in ADVANTAGES.items() if _takes(f, "scale") and not _keyword_params(f)[1]]
        raise ConfigError(
            f"scale_rewards={cfg.scale_rewards!r} is set, but {_who('advantage estimator', cfg.advantage, fn)} "
            f"takes no 'scale': it never divides by a std, so the setting would be ignored. Fix: remove "
            f"scale_rewards (or set it to 'none'), or choose an advantage that takes it ({', '.join(takers)})."
        )
    hp.update(cfg.advantage_kwargs)
    return hp


def resolved(cfg: Any) -> dict[str, Any]:
    """What training calls, by name, with the exact keyword arguments::

        {"policy_loss": name, "loss_hparams": {...}, "advantage": name, "advantage_hparams": {...},
         "aggregation": name, "kl_estimator": name, "kl_coef": float}

    ``POLICY_LOSSES.get(r["policy_loss"])(logp, old_logp, adv, mask, **r["loss_hparams"])`` and
    ``ADVANTAGES.get(r["advantage"])(rewards, **r["advantage_hparams"])``. Unknown names, unknown keyword
    arguments, options a function cannot honour and contradicting options raise ConfigError here.
    """
    from grouprl.builtins import load_builtins
    from grouprl.registry import ADVANTAGES, AGGREGATIONS, KL_ESTIMATORS, POLICY_LOSSES

    load_builtins()
    loss_fn, adv_fn = POLICY_LOSSES.get(cfg.policy_loss), ADVANTAGES.get(cfg.advantage)
    AGGREGATIONS.get(cfg.loss_aggregation)
    KL_ESTIMATORS.get(cfg.kl_estimator)
    return {
        "policy_loss": cfg.policy_loss,
        "loss_hparams": loss_hparams(cfg, loss_fn),
        "advantage": cfg.advantage,
        "advantage_hparams": advantage_hparams(cfg, adv_fn),
        "aggregation": cfg.loss_aggregation,
        "kl_estimator": cfg.kl_estimator,
        "kl_coef": cfg.kl_coef,
    }
