"""Training: ``GRPOTrainer`` (facade) and ``train`` (the loop in ``grouprl.train.algorithms.grpo``)."""

from __future__ import annotations

from grouprl.train.trainer import GRPOTrainer

__all__ = ["GRPOTrainer"]
