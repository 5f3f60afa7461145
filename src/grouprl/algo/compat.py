"""``compute_grpo_loss`` / ``compute_gspo_loss``: one-call scalar losses built on the registries.

GRPO's objective (arXiv 2402.03300, Eq. 3) and GSPO's (arXiv 2507.18071, Eq. 5) average per sequence
first, (1/G) sum_i (1/|y_i|) sum_t. Many reference implementations instead divide by all tokens of the
batch, sum_{i,t} / sum_i |y_i| (DAPO's token-level loss, arXiv 2503.14476, Eq. 8). The two differ as
soon as completions have different lengths. We follow the papers' equations by default
(``aggregation="seq_mean_token_mean"``) and give the all-token mean as ``aggregation="token_mean"``.
"""

from __future__ import annotations

import torch

from grouprl.algo.kl import kl_k3
from grouprl.registry import AGGREGATIONS, POLICY_LOSSES

__all__ = ["compute_grpo_loss", "compute_gspo_loss"]


def _scalar_loss(
    name: str,
    per_token_logps: torch.Tensor,
    old_per_token_logps: torch.Tensor,
    advantages: torch.Tensor,
    completion_mask: torch.Tensor,
    clip_eps: float,
    aggregation: str,
    beta: float,
    ref_per_token_logps: torch.Tensor | None,
) -> torch.Tensor:
    per_token, _ = POLICY_LOSSES.get(name)(
        per_token_logps, old_per_token_logps, advantages, completion_mask, eps_low=clip_eps, eps_high=clip_eps
    )
    if beta != 0.0:
        if ref_per_token_logps is None:
            raise ValueError(f"compute_{name}_loss: beta={beta} needs ref_per_token_logps (the reference model)")
        per_token = per_token + beta * kl_k3(per_token_logps, ref_per_token_logps)
    return AGGREGATIONS.get(aggregation)(per_token, completion_mask)


def compute_grpo_loss(
    per_token_logps: torch.Tensor,
    old_per_token_logps: torch.Tensor,
    advantages: torch.Tensor,
    completion_mask: torch.Tensor,
    clip_eps: float = 0.2,
    *,
    aggregation: str = "seq_mean_token_mean",
    beta: float = 0.0,
    ref_per_token_logps: torch.Tensor | None = None,
) -> torch.Tensor:
    """GRPO loss (arXiv 2402.03300, Eq. 3) as one scalar to minimise.

    -(1/G) sum_i (1/|y_i|) sum_t [min(rho A, clip(rho, 1 - eps, 1 + eps) A) - beta * KL_k3], with
    rho_{i,t} = exp(logp - old_logp). By default tokens are averaged per sequence first, as Eq. 3
    writes; ``aggregation="token_mean"`` divides by all tokens of the batch (``completion_mask.sum()``,
    DAPO's Eq. 8 normaliser). ``beta > 0`` adds the k3 KL (Eq. 4) to the reference model.

    Shapes: ``per_token_logps, old_per_token_logps, completion_mask [N, T]``, ``advantages [N]`` -> ``[]``.
    """
    return _scalar_loss(
        "grpo", per_token_logps, old_per_token_logps, advantages, completion_mask,
        clip_eps, aggregation, beta, ref_per_token_logps,
    )


def compute_gspo_loss(
    per_token_logps: torch.Tensor,
    old_per_token_logps: torch.Tensor,
    advantages: torch.Tensor,
    completion_mask: torch.Tensor,
    clip_eps: float = 3e-4,
    *,
    aggregation: str = "seq_mean_token_mean",
    beta: float = 0.0,
    ref_per_token_logps: torch.Tensor | None = None,
) -> torch.Tensor:
    """GSPO loss (arXiv 2507.18071, Eqs. 5-7) as one scalar to minimise.

    -(1/G) sum_i min(s_i A_i, clip(s_i, 1 - eps, 1 + eps) A_i), s_i = exp(mean_t(logp - old_logp)),
    with one symmetric ``clip_eps`` (the registered ``gspo`` loss defaults to the paper's 3e-4 / 4e-4,
    Sec. 5.1). By default this follows Eq. 5 (per-sequence mean, so the value and gradient are the
    paper's sequence objective); ``aggregation="token_mean"`` divides by all tokens of the batch and so
    weights each sequence by its length.

    Shapes: ``per_token_logps, old_per_token_logps, completion_mask [N, T]``, ``advantages [N]`` -> ``[]``.
    """
    return _scalar_loss(
        "gspo", per_token_logps, old_per_token_logps, advantages, completion_mask,
        clip_eps, aggregation, beta, ref_per_token_logps,
    )
