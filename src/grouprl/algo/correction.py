"""Correction for the sampler/trainer mismatch: truncated importance sampling (TIS) and sequence masking.

An inference engine (vLLM) samples completions with its own copy of the weights and its own kernels and
precision, so its per-token log-probs ``rollout_logp`` differ from those the trainer computes for the very
same policy, ``old_logp``. The policy gradient is an expectation under the trainer's policy but the samples
come from the engine's: the estimator is off-policy. Both corrections here reweight each token of the
per-token loss by a detached factor built from ``old_logp - rollout_logp``:

- ``tis``: token-level truncated importance sampling, ``w_t = min(exp(old_logp_t - rollout_logp_t), cap)``
  (Yao, Liu et al. 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training",
  https://fengyao.notion.site/off-policy-rl; verl ``rollout_is: token``, slime ``--use-tis``; cap 2.0 is
  their default). Truncation bounds the variance at the price of a small bias where the engine
  under-samples a token by more than ``cap``.
- ``mask``: sequence-level masking (masked importance sampling, Liu, Li et al. 2025, "When Speed Kills
  Stability: Demystifying RL Collapse from the Training-Inference Mismatch"): a sequence whose
  length-normalised ratio ``exp(mean_t (old_logp_t - rollout_logp_t))`` (the geometric mean of its token
  ratios, the form GSPO uses for its sequence ratio, arXiv 2507.18071 Eqs. 5-7) leaves ``[low, high]`` gets
  weight 0 on every token, every other sequence weight 1. It drops the rare badly mismatched sample
  instead of reweighting the many slightly mismatched ones.

The weight multiplies the per-token loss only; the step's token / sequence normalisers are unchanged, so a
masked sequence counts as a zero-weight sequence (as it would under TIS with weight 0). When the engine's
log-probs equal the trainer's every weight is exactly 1 and both corrections are the identity.

Every function: ``fn(old_logp [N,T], rollout_logp [N,T], mask [N,T], **hp) -> (weight [N,T], metrics)``;
``weight`` is detached (no gradient flows through the correction), 1 at masked-out positions; ``metrics``
are 0-dim tensors over the real tokens: ``logp_abs_diff`` (mean |old_logp - rollout_logp|),
``is_weight_mean``, ``is_weight_max``, ``masked_frac`` (fraction of tokens given weight 0).
"""

from __future__ import annotations

import torch

from grouprl.algo.ops import masked_mean, masked_sum

__all__ = ["CORRECTIONS", "MISMATCH_LOG_RATIO_BOUND", "sequence_mask", "tis"]

MISMATCH_LOG_RATIO_BOUND = 20.0
"""``old_logp - rollout_logp`` is clamped to +-20 before ``exp`` (as the losses' log-ratio, see losses.py)."""


def _log_ratio(old_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``old_logp - rollout_logp``, detached, clamped to +-20 (+-inf included), 0 on padding and for NaN."""
    if old_logp.shape != rollout_logp.shape or mask.shape != old_logp.shape:
        raise ValueError(f"old_logp, rollout_logp and mask must all be [N, T]; got {tuple(old_logp.shape)}, "
                         f"{tuple(rollout_logp.shape)}, {tuple(mask.shape)}")
    diff = old_logp.detach().float() - rollout_logp.detach().float()
    diff = torch.where(mask > 0, diff, torch.zeros_like(diff))
    diff = torch.nan_to_num(diff, nan=0.0)  # an engine's NaN log-prob carries no information: weight 1
    return diff.clamp(-MISMATCH_LOG_RATIO_BOUND, MISMATCH_LOG_RATIO_BOUND)


def _metrics(log_ratio: torch.Tensor, weight: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    m = mask.to(weight.dtype)
    real = torch.where(m > 0, weight, torch.full_like(weight, float("-inf")))
    big = real.max() if real.numel() else torch.tensor(float("-inf"))
    w_max = torch.where(torch.isfinite(big), big, torch.ones_like(big))  # no real token: 1
    return {"logp_abs_diff": masked_mean(log_ratio.abs(), m), "is_weight_mean": masked_mean(weight, m),
            "is_weight_max": w_max, "masked_frac": masked_mean((weight == 0).to(weight.dtype), m)}


def tis(old_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor, *, cap: float = 2.0):
    """Token-level truncated importance weights ``min(exp(old_logp - rollout_logp), cap)``.

    Shapes: ``[N,T]`` in, ``weight [N,T]`` out (detached; 1 on padding). ``cap > 0``.

    >>> w, _ = tis(torch.tensor([[0.0, 0.0]]), torch.tensor([[-0.5, -2.0]]), torch.ones(1, 2), cap=2.0)
    >>> [round(x, 4) for x in w[0].tolist()]  # exp(0.5) = 1.6487; exp(2) = 7.39 -> capped at 2
    [1.6487, 2.0]
    """
    if not cap > 0:
        raise ValueError(f"tis: cap must be > 0, got {cap}")
    log_ratio = _log_ratio(old_logp, rollout_logp, mask)
    weight = torch.exp(log_ratio).clamp(max=cap)
    weight = torch.where(mask > 0, weight, torch.ones_like(weight))
    return weight, _metrics(log_ratio, weight, mask)


def sequence_mask(old_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor, *,
                  band: tuple[float, float] = (0.99, 1.01)):
    """Weight 0 for every token of a sequence whose geometric-mean ratio leaves ``band``, else 1.

    The sequence ratio is ``exp(sum_t m_t (old_logp_t - rollout_logp_t) / sum_t m_t)``; a sequence with no
    real token keeps weight 1. ``band = (low, high)`` with ``0 < low <= 1 <= high``.

    >>> old, roll = torch.zeros(2, 2), torch.tensor([[-0.004, 0.0], [-0.1, -0.1]])
    >>> w, _ = sequence_mask(old, roll, torch.ones(2, 2), band=(0.99, 1.01))
    >>> w.tolist()  # ratios exp(0.002) = 1.002 (kept) and exp(0.1) = 1.105 (masked)
    [[1.0, 1.0], [0.0, 0.0]]
    """
    low, high = float(band[0]), float(band[1])
    if not 0 < low <= 1 <= high:
        raise ValueError(f"sequence_mask: band must satisfy 0 < low <= 1 <= high, got {band}")
    log_ratio = _log_ratio(old_logp, rollout_logp, mask)
    m = mask.to(log_ratio.dtype)
    count = m.sum(dim=1)
    seq_log_ratio = masked_sum(log_ratio, m, dim=1) / count.clamp(min=1)
    seq_ratio = torch.exp(seq_log_ratio)
    keep = ((seq_ratio >= low) & (seq_ratio <= high)) | (count == 0)
    weight = keep.to(log_ratio.dtype).unsqueeze(1).expand_as(log_ratio).clone()
    weight = torch.where(m > 0, weight, torch.ones_like(weight))
    return weight, _metrics(log_ratio, weight, mask)


CORRECTIONS = {"tis": tis, "mask": sequence_mask}
"""Correction name (the ``rollout_correction`` setting) -> function; ``none`` is the absence of one."""
