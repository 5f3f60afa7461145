"""A policy loss plug-in: the unclipped importance-weighted surrogate L^CPI.

PPO, Schulman et al. 2017, arXiv 1707.06347, Eq. 6 (the "conservative policy iteration" objective of
Kakade & Langford 2002): L^CPI = E_t[rho_t A_t] with rho_t = pi_theta(y_t) / pi_old(y_t). PPO's Eq. 7
clips rho; this loss does not, so it shows what the clip changes. On-policy (rho = 1) its gradient is
REINFORCE's, -A * grad log pi (Eq. 2 of the same paper).
"""

from __future__ import annotations

import torch

from grouprl.registry import POLICY_LOSSES


@POLICY_LOSSES.register("cpi")
def cpi_loss(logp, old_logp, adv, mask, *, max_log_ratio: float = 20.0):
    """Unclipped surrogate: L_t = -rho_t A, rho_t = exp(logp - old_logp) (PPO arXiv 1707.06347, Eq. 6).

    ``max_log_ratio`` bounds |logp - old_logp| before ``exp`` (no gradient beyond it), so a stale
    token cannot overflow the ratio. Example: rho = 1.5, A = 1 -> loss -1.5, d loss / d logp = -1.5
    (the clipped ``grpo`` loss gives -1.2 and gradient 0 there).

    Shapes: logp, old_logp [N, T]; adv [N] or [N, T]; mask [N, T] -> (per_token [N, T], metrics).
    """
    real = mask > 0

    def real_only(x):  # padding may hold inf / NaN: replace it before any arithmetic touches it
        return torch.where(real, x, torch.zeros_like(x))

    log_ratio = real_only(logp) - real_only(old_logp).detach()
    ratio = torch.exp(log_ratio.clamp(-max_log_ratio, max_log_ratio))
    a = adv.unsqueeze(-1) if adv.dim() == 1 else adv
    per_token = torch.where(real, -ratio * a, torch.zeros_like(ratio))
    n = real.sum().clamp(min=1)
    metrics = {"ratio_mean": (ratio.detach() * real).sum() / n}
    return per_token, metrics
