"""Advantage estimators: group-relative (GRPO, Dr. GRPO, RLOO) and GAE for PPO.

Group estimators share one signature, ``fn(rewards [B, G], **hp) -> adv [B, G]``: row ``b`` holds the
``G`` completions sampled for prompt ``b``. A NaN reward means "no opinion" (a reward function returned
None, e.g. the reference answer could not be parsed): it is left out of the group's statistics and its
advantage is exactly 0, so that completion contributes no policy gradient. A group with fewer than two
non-NaN rewards has no baseline: every advantage in it is 0.

``ZERO_STD_TOL`` (1e-8) is the one tolerance that decides "this group's rewards are all equal": the
``grpo`` estimator zeroes such groups and :func:`zero_std_groups` reports them (DAPO's dynamic sampling,
arXiv 2503.14476, Eq. 11, drops them), so the two always agree.
"""

from __future__ import annotations

import torch

from grouprl.registry import ADVANTAGES

__all__ = [
    "ZERO_STD_TOL",
    "zero_std_groups",
    "grpo_advantages",
    "dr_grpo_advantages",
    "rloo_advantages",
    "compute_gae",
    "compute_grpo_advantages",
]

ZERO_STD_TOL = 1e-8
"""A group whose reward std is below this is "zero-std": all answers equally good, advantage 0."""

_STD_CHOICES = ("population", "unbiased")
_SCALE_CHOICES = ("group", "batch", "none")


def _check_rewards(rewards: torch.Tensor, who: str) -> torch.Tensor:
    if not isinstance(rewards, torch.Tensor):
        rewards = torch.as_tensor(rewards, dtype=torch.float32)
    if rewards.dim() != 2:
        raise ValueError(f"{who}: rewards must be [B, G] (prompts x group size), got shape {tuple(rewards.shape)}")
    if not rewards.is_floating_point():
        rewards = rewards.to(torch.float32)
    return rewards


def _group_stats(rewards: torch.Tensor, dim: int | None, unbiased: bool):
    """Mean, std and count of the non-NaN rewards, along ``dim`` (kept) or over everything."""
    valid = ~torch.isnan(rewards)
    r = torch.where(valid, rewards, torch.zeros_like(rewards))
    w = valid.to(rewards.dtype)
    if dim is None:
        n, s = w.sum(), r.sum()
    else:
        n, s = w.sum(dim=dim, keepdim=True), r.sum(dim=dim, keepdim=True)
    mean = s / n.clamp(min=1)
    sq = (torch.where(valid, rewards - mean, torch.zeros_like(rewards)) ** 2)
    sq = sq.sum() if dim is None else sq.sum(dim=dim, keepdim=True)
    den = (n - 1) if unbiased else n
    var = torch.where(den > 0, sq / den.clamp(min=1), torch.zeros_like(sq))
    return mean, var.sqrt(), n, valid


def zero_std_groups(rewards: torch.Tensor, *, eps: float = ZERO_STD_TOL, std: str = "population") -> torch.Tensor:
    """Which groups carry no learning signal: reward std < ``eps`` over their non-NaN rewards.

    Exactly the rule :func:`grpo_advantages` uses to zero a group (it calls this function), so dynamic
    sampling (DAPO, arXiv 2503.14476, Eq. 11: keep groups with 0 < #correct < G) can drop the groups
    GRPO would give zero advantage. NaN rewards ("no opinion") are ignored; a group with fewer than two
    non-NaN rewards counts as zero-std. Pass the ``eps`` / ``std`` given to ``grpo`` if they differ from
    the defaults (``ZERO_STD_TOL``, population std).

    Shapes: ``rewards [B, G]`` -> ``[B]`` bool.

    >>> nan = float("nan")
    >>> zero_std_groups(torch.tensor([[1, 1, 1], [0, 1, 1], [nan, 1, nan], [nan, 0, 1]])).tolist()
    [True, False, True, False]
    """
    if std not in _STD_CHOICES:
        raise ValueError(f"zero_std_groups: std={std!r}; choose one of {_STD_CHOICES}")
    rewards = _check_rewards(rewards, "zero_std_groups")
    _, group_std, n, _ = _group_stats(rewards, dim=1, unbiased=std == "unbiased")
    return ((group_std < eps) | (n < 2))[:, 0]


@ADVANTAGES.register("grpo")
def grpo_advantages(
    rewards: torch.Tensor,
    *,
    eps: float = ZERO_STD_TOL,
    std: str = "population",
    scale: str = "group",
) -> torch.Tensor:
    """GRPO group z-score: A_i = (r_i - mean(r)) / (std(r) + eps) within each group.

    Paper: DeepSeekMath, Shao et al. 2024, arXiv 2402.03300, Sec. 4.1.2 (outcome supervision).

    - ``std="population"`` (default: divide by G, the paper's "std" of the group's rewards) or
      ``"unbiased"`` (divide by G-1, as torch.std, TRL and verl do).
    - ``scale="group"`` (default) divides by each group's std; ``"batch"`` keeps the group mean but
      divides by the std of all rewards of the batch (Liu et al. 2025, "Part I: Tricks or Traps?",
      arXiv 2508.08221); ``"none"`` only centres (= ``dr_grpo``).
    - A group whose std is below ``eps`` (default ``ZERO_STD_TOL``; the rule of :func:`zero_std_groups`,
      which this calls) gets advantage exactly 0: every answer was equally good, there is nothing to
      learn from it. With ``scale="batch"`` so does the whole batch if its std is below ``eps``.
    - NaN rewards are excluded from mean/std and get advantage 0.

    Shapes: ``rewards [B, G]`` -> ``adv [B, G]`` (same dtype; ints become float32).
    Example: one group ``[1, 3, 2, 6]``: mean 3, population std sqrt(14/4) = 1.8708,
    so adv = [-1.069, 0, -0.535, 1.604].
    """
    if std not in _STD_CHOICES:
        raise ValueError(f"grpo advantages: std={std!r}; choose one of {_STD_CHOICES}")
    if scale not in _SCALE_CHOICES:
        raise ValueError(f"grpo advantages: scale={scale!r}; choose one of {_SCALE_CHOICES}")
    rewards = _check_rewards(rewards, "grpo advantages")
    unbiased = std == "unbiased"
    mean, group_std, _, valid = _group_stats(rewards, dim=1, unbiased=unbiased)
    centred = torch.where(valid, rewards - mean, torch.zeros_like(rewards))
    if scale == "none":
        return centred
    sigma = group_std if scale == "group" else _group_stats(rewards, dim=None, unbiased=unbiased)[1]
    adv = centred / (sigma + eps)
    flat = zero_std_groups(rewards, eps=eps, std=std).unsqueeze(-1) | (sigma < eps)
    return torch.where(flat.expand_as(adv), torch.zeros_like(adv), adv)


@ADVANTAGES.register("dr_grpo")
def dr_grpo_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """Dr. GRPO mean-centred advantage: A_i = r_i - mean(r), no std division.

    Paper: Liu et al. 2025, "Understanding R1-Zero-Like Training: A Critical Perspective",
    arXiv 2503.20783, Sec. 3.2 (removing the std term that up-weights too-easy/too-hard questions).
    NaN rewards are excluded from the mean and get 0. Shapes: ``rewards [B, G]`` -> ``adv [B, G]``.
    """
    return grpo_advantages(rewards, scale="none")


@ADVANTAGES.register("rloo")
def rloo_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """RLOO leave-one-out baseline: A_i = r_i - (1/(n-1)) sum_{j != i} r_j = n/(n-1) (r_i - mean(r)).

    Paper: Ahmadian et al. 2024, "Back to Basics: Revisiting REINFORCE Style Optimization",
    arXiv 2402.14740, Eq. (9) (Kool et al. 2019). ``n`` is the number of non-NaN rewards of the group;
    groups with n < 2 have no baseline and get 0, as do NaN rewards.
    Shapes: ``rewards [B, G]`` -> ``adv [B, G]``.
    """
    rewards = _check_rewards(rewards, "rloo advantages")
    mean, _, n, valid = _group_stats(rewards, dim=1, unbiased=False)
    factor = torch.where(n > 1, n / (n - 1).clamp(min=1), torch.zeros_like(n))
    return torch.where(valid, (rewards - mean) * factor, torch.zeros_like(rewards))


def compute_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 0.95,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation for PPO on token sequences.

    Paper: Schulman et al. 2015, arXiv 1506.02438, Eq. (16):
    delta_t = r_t + gamma * V_{t+1} - V_t,   A_t = delta_t + gamma * lam * A_{t+1},
    with V and A of positions past the end of the sequence (mask 0) taken as 0. Returns are A_t + V_t.

    Shapes: ``rewards``, ``values``, ``mask`` ``[N, T]`` -> ``(advantages [N, T], returns [N, T])``,
    both 0 at masked positions and computed without gradient (targets, not part of the graph).
    Masked positions inside a sequence are skipped: the next *real* token's value is used.
    """
    with torch.no_grad():
        m = mask.to(values.dtype)
        n_tok = rewards.shape[-1]
        next_value = torch.zeros_like(values[:, 0])
        next_adv = torch.zeros_like(values[:, 0])
        adv = torch.zeros_like(values)
        for t in reversed(range(n_tok)):
            delta = rewards[:, t] + gamma * next_value - values[:, t]
            a_t = delta + gamma * lam * next_adv
            # at a masked position carry the next real token's value/advantage through unchanged
            next_value = torch.where(m[:, t] > 0, values[:, t], next_value)
            next_adv = torch.where(m[:, t] > 0, a_t, next_adv)
            adv[:, t] = a_t * m[:, t]
        returns = (adv + values) * m
    return adv, returns


def compute_grpo_advantages(rewards: list[float], eps: float = ZERO_STD_TOL) -> list[float]:
    """GRPO advantages of ONE group, as a list (a convenience API over ``grpo_advantages``).

    ``(r_i - mean) / (std + eps)`` with the population std (divide by G); a group whose std is below
    ``eps`` gets all zeros. ``None`` or NaN entries get 0 and are left out of the statistics.
    Paper: DeepSeekMath GRPO, arXiv 2402.03300, Sec. 4.1.2 (the ``grpo`` estimator on one group).
    Shapes: ``G`` rewards (a list) -> ``G`` advantages (a list of floats).

    >>> [round(a, 3) for a in compute_grpo_advantages([1, 3, 2, 6])]
    [-1.069, 0.0, -0.535, 1.604]
    """
    values = [float("nan") if r is None else float(r) for r in rewards]
    if not values:
        return []
    adv = grpo_advantages(torch.tensor([values], dtype=torch.float64), eps=eps)
    return adv[0].tolist()
