"""The training loops, each a registered plug-in: ``grpo`` (the GRPO family), ``ppo`` (with a critic),
``dpo`` (preference pairs). :func:`algorithm_for` is how the trainer and the CLI dispatch: through the
``ALGORITHMS`` registry and the config's declaration (``grouprl.config.algorithms``), never a name compare.
The pieces every loop shares (step plan, save cadence, restore, logger, evaluate-and-log, final save) are in
``shared``; the GRPO-family round (generate, score, advantages, micro-batches) in ``rounds``."""

from __future__ import annotations

from grouprl.config.algorithms import Supports, supports_of
from grouprl.registry import ALGORITHMS
from grouprl.train.algorithms.base import Algorithm, register_algorithm


def load_algorithms() -> None:
    """Import the built-in loops, whose modules register them."""
    from grouprl.train.algorithms import dpo_run, grpo, ppo  # noqa: F401 -- registration on import


def algorithm_for(cfg) -> Algorithm:
    """The registered loop that trains ``cfg.algorithm`` (its declaration names it)."""
    load_algorithms()
    return ALGORITHMS.get(supports_of(cfg.algorithm).loop)


__all__ = ["ALGORITHMS", "Algorithm", "Supports", "algorithm_for", "load_algorithms", "register_algorithm"]
