"""grouprl.algo: pure tensor math for group-relative RL, each function registered by paper name.

Importing this package fills the registries ADVANTAGES, POLICY_LOSSES, AGGREGATIONS and KL_ESTIMATORS
(see ``grouprl list``). Nothing here touches files, devices, configs or logging; metrics come back as
tensors. docs/ALGORITHMS.md maps every registry name to its paper, equation, function and test.
"""

from __future__ import annotations

from grouprl.algo import advantages, aggregate, compat, kl, losses, ops, turns
from grouprl.algo.advantages import (
    ZERO_STD_TOL,
    compute_gae,
    compute_grpo_advantages,
    dr_grpo_advantages,
    grpo_advantages,
    rloo_advantages,
    zero_std_groups,
)
from grouprl.algo.aggregate import seq_mean_token_mean, seq_mean_token_sum_norm, token_mean
from grouprl.algo.compat import compute_grpo_loss, compute_gspo_loss
from grouprl.algo.kl import (
    KL_LOG_RATIO_BOUND,
    add_kl_term,
    kl_categorical,
    kl_k1,
    kl_k2,
    kl_k3,
    kl_k3_st,
    kl_penalized_rewards,
)
from grouprl.algo.losses import (
    LOG_RATIO_BOUND,
    SEQ_LOG_RATIO_BOUND,
    Metrics,
    cispo_loss,
    dpo_ipo_loss,
    dpo_sigmoid_loss,
    grpo_loss,
    gspo_loss,
    gspo_token_loss,
    ppo_value_loss,
)
from grouprl.algo.ops import (
    entropy_from_logits,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
    selective_log_softmax,
)
from grouprl.algo.turns import mt_grpo_advantages, turn_token_advantages

__all__ = [
    "advantages", "aggregate", "compat", "kl", "losses", "ops", "turns",
    "KL_LOG_RATIO_BOUND",
    "LOG_RATIO_BOUND",
    "Metrics",
    "SEQ_LOG_RATIO_BOUND",
    "ZERO_STD_TOL",
    "add_kl_term",
    "cispo_loss",
    "compute_gae",
    "compute_grpo_advantages",
    "compute_grpo_loss",
    "compute_gspo_loss",
    "dpo_ipo_loss",
    "dpo_sigmoid_loss",
    "dr_grpo_advantages",
    "entropy_from_logits",
    "grpo_advantages",
    "grpo_loss",
    "gspo_loss",
    "gspo_token_loss",
    "kl_categorical",
    "kl_k1",
    "kl_k2",
    "kl_k3",
    "kl_k3_st",
    "kl_penalized_rewards",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "mt_grpo_advantages",
    "ppo_value_loss",
    "rloo_advantages",
    "selective_log_softmax",
    "seq_mean_token_mean",
    "seq_mean_token_sum_norm",
    "token_mean",
    "turn_token_advantages",
    "zero_std_groups",
]
