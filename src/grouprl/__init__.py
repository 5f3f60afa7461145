"""grouprl: GRPO and GSPO reinforcement learning for language models, with a hardened reward library.

Public names are imported lazily so that ``import grouprl`` stays cheap (no torch until needed)::

    from grouprl import GRPOConfig, GRPOTrainer, compute_grpo_advantages, accuracy_reward
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    # algorithms (grouprl.algo)
    "compute_grpo_advantages": "grouprl.algo",
    "compute_grpo_loss": "grouprl.algo",
    "compute_gspo_loss": "grouprl.algo",
    # rewards (grouprl.rewards)
    "accuracy_reward": "grouprl.rewards",
    "format_reward": "grouprl.rewards",
    "efficiency_reward": "grouprl.rewards",
    "safety_reward": "grouprl.rewards",
    "robust_reward": "grouprl.rewards",
    "RewardConfig": "grouprl.rewards",
    "AgentRewardFunction": "grouprl.rewards",
    "math_reward_config": "grouprl.rewards",
    "code_reward_config": "grouprl.rewards",
    "retrieval_reward_config": "grouprl.rewards",
    # training (grouprl.config, grouprl.train)
    "GRPOConfig": "grouprl.config",
    "GRPOTrainer": "grouprl.train",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'grouprl' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
