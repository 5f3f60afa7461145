"""KL divergence: per-token Monte-Carlo estimators and the exact categorical KL.

The estimators follow J. Schulman, "Approximating KL Divergence" (2020,
http://joschu.net/blog/kl-approx.html), used by GRPO (arXiv 2402.03300, Eq. 4 is k3). Tokens are sampled
from pi_theta, so with ``log_r = ref_logp - logp`` (log of r = pi_ref / pi_theta) each estimates
KL(pi_theta || pi_ref) per token:

- ``k1 = -log_r``                  unbiased, high variance, can be negative;
- ``k2 = 0.5 * log_r**2``           biased (exact to second order), always >= 0;
- ``k3 = exp(log_r) - 1 - log_r``   unbiased, always >= 0, low variance (GRPO's choice).

KL can enter training two ways (both built from these per-token values):

- as a loss term: ``per_token_loss + beta * kl`` then aggregated (GRPO, Eq. 3);
- as a reward penalty: ``rewards - beta * sum_t kl`` before the advantages, with ``kl`` detached
  (InstructGPT, arXiv 2203.02155, Eq. 2); see :func:`kl_penalized_rewards`.
"""

from __future__ import annotations

import torch

from grouprl.algo.ops import masked_sum
from grouprl.registry import KL_ESTIMATORS

__all__ = ["kl_k1", "kl_k2", "kl_k3", "kl_categorical", "kl_penalized_rewards", "add_kl_term"]


@KL_ESTIMATORS.register("k1")
def kl_k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k1 = log pi_theta - log pi_ref: the naive unbiased estimator of KL(pi_theta || pi_ref).

    Source: Schulman 2020 (blog "Approximating KL Divergence"). Shapes: ``[N, T], [N, T] -> [N, T]``.
    Example: logp = log 0.5, ref_logp = log 0.25 -> log 2 = 0.6931.
    """
    return logp - ref_logp


@KL_ESTIMATORS.register("k2")
def kl_k2(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k2 = 0.5 * (log pi_ref - log pi_theta)^2: low-variance, slightly biased, non-negative.

    Source: Schulman 2020. Shapes: ``[N, T], [N, T] -> [N, T]``.
    Example: logp = log 0.5, ref_logp = log 0.25 -> 0.5 * (log 2)^2 = 0.2402.
    """
    return 0.5 * (ref_logp - logp) ** 2


@KL_ESTIMATORS.register("k3")
def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k3 = pi_ref/pi_theta - 1 - log(pi_ref/pi_theta): unbiased and non-negative (GRPO's KL).

    Paper: DeepSeekMath GRPO, arXiv 2402.03300, Eq. (4); Schulman 2020.
    Shapes: ``[N, T], [N, T] -> [N, T]``.
    Example: logp = log 0.5, ref_logp = log 0.25 -> 0.5 - 1 + log 2 = 0.1931.
    """
    log_r = ref_logp - logp
    return torch.expm1(log_r) - log_r


def kl_categorical(p: torch.Tensor, q: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Exact KL(p || q) = sum_k p_k (log p_k - log q_k) between categorical distributions.

    ``p`` and ``q`` are probabilities (lists or tensors) along ``dim``; terms with p_k = 0 are 0, and
    the result is +inf where p_k > 0 = q_k. Shapes: ``[..., K], [..., K] -> [...]``.
    Example: KL([0.5, 0.5] || [0.25, 0.75]) = 0.5 ln 2 + 0.5 ln(2/3) = 0.1438; the reverse is
    0.25 ln(1/2) + 0.75 ln(3/2) = 0.1308.
    """
    p = torch.as_tensor(p, dtype=torch.float64 if not isinstance(p, torch.Tensor) else None)
    q = torch.as_tensor(q, dtype=p.dtype)
    terms = torch.where(p > 0, p * (torch.log(p) - torch.log(q)), torch.zeros_like(p))
    return terms.sum(dim=dim)


def kl_penalized_rewards(
    rewards: torch.Tensor, kl: torch.Tensor, mask: torch.Tensor, beta: float
) -> torch.Tensor:
    """Reward-penalty form of KL: r_i - beta * sum_t kl_{i,t} over the completion's real tokens.

    Paper: InstructGPT, Ouyang et al. 2022, arXiv 2203.02155, Eq. (2). ``kl`` is detached: the penalty
    shapes the reward (and so the advantage), it is not differentiated through.
    Shapes: ``rewards [N]`` (or ``[B, G]`` with ``kl``/``mask`` ``[B, G, T]``), ``kl [N, T]``,
    ``mask [N, T]`` -> ``[N]``. NaN rewards stay NaN ("no opinion").
    """
    return rewards - beta * masked_sum(kl.detach(), mask, dim=-1).to(rewards.dtype)


def add_kl_term(per_token_loss: torch.Tensor, kl: torch.Tensor, beta: float) -> torch.Tensor:
    """Loss-term form of KL (GRPO, arXiv 2402.03300, Eq. 3): per_token_loss + beta * kl, per token.

    Shapes: ``[N, T], [N, T] -> [N, T]``; aggregate the result with the same aggregation as the loss.
    """
    return per_token_loss + beta * kl
