"""KL divergence: per-token Monte-Carlo estimators and the exact categorical KL.

The estimators follow J. Schulman, "Approximating KL Divergence" (2020,
http://joschu.net/blog/kl-approx.html), used by GRPO (arXiv 2402.03300, Eq. 4 is k3). Tokens are sampled
from pi_theta, so with ``log_r = ref_logp - logp`` (log of r = pi_ref / pi_theta) each VALUE estimates
KL(pi_theta || pi_ref) per token:

- ``k1 = -log_r``                  unbiased, high variance, can be negative;
- ``k2 = 0.5 * log_r**2``           biased (exact to second order), always >= 0;
- ``k3 = exp(log_r) - 1 - log_r``   unbiased, always >= 0, low variance (GRPO's choice);
- ``k3_st``                        k3's value with k2's gradient (straight-through).

Used as a LOSS term, what matters is the expected GRADIENT over y ~ pi_theta, not the value. With
l = logp - ref_logp and E_pi[grad logp] = sum_y grad pi(y) = grad 1 = 0:

- k1: grad = grad logp, expectation 0. No pull towards pi_ref at all, only noise.
- k2: grad = l * grad logp, expectation sum_y pi (log pi - log ref) grad log pi = grad KL(pi_theta || pi_ref)
  (the other term of that gradient, E_pi[grad logp], is 0): the gradient of the KL the value estimates.
- k3: grad = (1 - ref/pi) grad logp, expectation 0 - sum_y ref grad log pi = -E_ref[grad logp]
  = grad KL(pi_ref || pi_theta): the REVERSE direction of what its value estimates. It still vanishes
  at pi_theta = pi_ref, but it is a different (mass-covering) penalty, and its per-token weight
  1 - ref/pi grows like ref/pi on tokens pi_theta has made unlikely.
- k3_st: value k3 (unbiased, >= 0: what gets logged), gradient k2's = grad KL(pi_theta || pi_ref).
  Recommended for ``kl_coef > 0``. verl calls it ``k3+`` / ``low_var_kl+``.

(These hold on-policy. With several optimizer steps per generation tokens come from pi_old and every
estimator's expected gradient carries the ratio pi_theta / pi_old, which is near 1 inside the clip range.)

Numerical bound: every estimator clamps ``log_r`` to [-KL_LOG_RATIO_BOUND, KL_LOG_RATIO_BOUND] = [-10, 10]
before use, so values and gradients stay finite (k3 <= e^10 - 11 = 2.2e4, |grad k3| <= e^10 - 1) whatever
the inputs, and +-inf / NaN on padding positions cannot put NaN into the gradient once the caller masks
them. A token beyond the bound gets the boundary value and no gradient from the KL term. verl
(``kl_penalty_forward`` in ``verl/trainer/ppo/core_algos.py``) clamps k3's ``log_r`` at +-20 and then
the k3 VALUE at +-10; the value clamp removes the KL gradient from every token with k3 > 10 (pi_theta <
pi_ref / 12.9), the very tokens the penalty should pull back, so we bound the input at 10 instead.

KL can enter training two ways (both built from these per-token values):

- as a loss term: ``per_token_loss + beta * kl`` then aggregated (GRPO, Eq. 3);
- as a reward penalty: ``rewards - beta * sum_t kl`` before the advantages, with ``kl`` detached
  (InstructGPT, arXiv 2203.02155, Eq. 2); see :func:`kl_penalized_rewards`.
"""

from __future__ import annotations

import torch

from grouprl.algo.ops import masked_sum
from grouprl.registry import KL_ESTIMATORS

__all__ = [
    "KL_LOG_RATIO_BOUND",
    "kl_k1",
    "kl_k2",
    "kl_k3",
    "kl_k3_st",
    "kl_categorical",
    "kl_penalized_rewards",
    "add_kl_term",
]

KL_LOG_RATIO_BOUND = 10.0
"""``log(pi_ref / pi_theta)`` is clamped to [-KL_LOG_RATIO_BOUND, KL_LOG_RATIO_BOUND] in every estimator."""


def _log_r(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """log(pi_ref / pi_theta), clamped to +-KL_LOG_RATIO_BOUND (clamp passes no gradient beyond it)."""
    return torch.clamp(ref_logp - logp, -KL_LOG_RATIO_BOUND, KL_LOG_RATIO_BOUND)


@KL_ESTIMATORS.register("k1")
def kl_k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k1 = log pi_theta - log pi_ref: the naive unbiased estimator of KL(pi_theta || pi_ref).

    Source: Schulman 2020 (blog "Approximating KL Divergence"). As a loss its expected gradient is 0
    (grad k1 = grad logp and E_pi[grad logp] = 0): it does not pull pi_theta towards pi_ref; use it as
    a reward penalty or a metric. log(pi_ref / pi_theta) is clamped to +-10 (module docstring).
    Shapes: ``[N, T], [N, T] -> [N, T]``.
    Example: logp = log 0.5, ref_logp = log 0.25 -> log 2 = 0.6931; gradient d/d logp = 1.
    """
    return -_log_r(logp, ref_logp)


@KL_ESTIMATORS.register("k2")
def kl_k2(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k2 = 0.5 * (log pi_ref - log pi_theta)^2: low-variance, slightly biased, non-negative.

    Source: Schulman 2020. As a loss, grad = (logp - ref_logp) grad logp, whose expectation over
    y ~ pi_theta is grad KL(pi_theta || pi_ref). log(pi_ref / pi_theta) is clamped to +-10.
    Shapes: ``[N, T], [N, T] -> [N, T]``.
    Example: logp = log 0.5, ref_logp = log 0.25 -> 0.5 * (log 2)^2 = 0.2402; d/d logp = log 2 = 0.6931.
    """
    return 0.5 * _log_r(logp, ref_logp) ** 2


@KL_ESTIMATORS.register("k3")
def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k3 = pi_ref/pi_theta - 1 - log(pi_ref/pi_theta): unbiased and non-negative (GRPO's KL).

    Paper: DeepSeekMath GRPO, arXiv 2402.03300, Eq. (4); Schulman 2020. As a loss, grad =
    (1 - pi_ref/pi_theta) grad logp, whose expectation is grad KL(pi_ref || pi_theta) -- the reverse of
    the KL its value estimates (see ``k3_st``). log(pi_ref / pi_theta) is clamped to +-10.
    Shapes: ``[N, T], [N, T] -> [N, T]``.
    Example: logp = log 0.5, ref_logp = log 0.25 -> 0.5 - 1 + log 2 = 0.1931; d/d logp = 1 - 0.5 = 0.5.
    """
    log_r = _log_r(logp, ref_logp)
    return torch.expm1(log_r) - log_r


@KL_ESTIMATORS.register("k3_st")
def kl_k3_st(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k3's value with k2's gradient (straight-through): sg(k3) + k2 - sg(k2).

    Paper: GRPO's KL term, arXiv 2402.03300, Eq. (4), with the gradient fixed per Schulman 2020: the
    value is the unbiased, non-negative k3 estimate of KL(pi_theta || pi_ref) (what is logged), the
    gradient (logp - ref_logp) grad logp has expectation grad KL(pi_theta || pi_ref), the divergence
    GRPO's Eq. (3) penalises. verl's ``k3+``. log(pi_ref / pi_theta) is clamped to +-10.
    Shapes: ``[N, T], [N, T] -> [N, T]``.
    Example: logp = log 0.5, ref_logp = log 0.25 -> value 0.1931 (k3), d/d logp = log 2 = 0.6931 (k2's).
    """
    k2 = kl_k2(logp, ref_logp)
    return kl_k3(logp, ref_logp).detach() + (k2 - k2.detach())


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
