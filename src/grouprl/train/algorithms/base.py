"""What an algorithm plug-in is: a loop registered in ``ALGORITHMS`` with a declaration of what it supports.

    register_algorithm("grpo", Algorithm(train=train))                      # the GRPO-family loop
    register_algorithm("reinforce", Algorithm(train=train), supports=Supports(loop="reinforce", ...))

``train(cfg, model, tokenizer, train_rows, eval_rows, reward_funcs, eval_reward_fn, *, resume, agent)``
trains a loaded model (``GRPOTrainer.train`` calls it, and ``grouprl train`` through the trainer) and returns
the summary dict (``global_step``, ``history``, ``evals``, log paths). An offline loop that builds its own
data and model from the config (DPO) gives ``run(cfg, resume)`` instead, and its ``dry_run``. The
declaration (:class:`grouprl.config.algorithms.Supports`) is what every start-up check reads
(docs/DESIGN.md, "Algorithms are plug-ins"; docs/EXTENDING.md, "Add an algorithm").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from grouprl.config.algorithms import Supports, declare
from grouprl.registry import ALGORITHMS


@dataclass(frozen=True)
class Algorithm:
    """One registered training loop."""

    train: Callable[..., dict[str, Any]] | None = None
    """Trains a loaded model (``GRPOTrainer``); ``None`` for a loop that loads its own (``run``)."""
    run: Callable[..., Any] | None = None
    """A whole run from the config alone, ``run(cfg, resume)`` (``grouprl train``); ``None``: the trainer's."""
    dry_run: Callable[..., list[str]] | None = None
    """``grouprl train --dry-run``: the checks made before the model loads, as notes; ``None``: the trainer's."""


def register_algorithm(name: str, algorithm: Algorithm, *, supports: Supports | None = None) -> Algorithm:
    """Register the loop ``name`` (``Supports.loop`` names it); ``supports`` declares a plug-in algorithm
    of the same name (the built-in declarations are in grouprl.config.algorithms)."""
    if supports is not None:
        declare(name, supports)
    ALGORITHMS.register(name, algorithm)
    return algorithm
