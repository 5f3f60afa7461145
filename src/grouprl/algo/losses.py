"""Policy losses (GRPO/PPO-clip, GSPO, GSPO-token, CISPO), the PPO value loss and DPO losses.

Every policy loss has one signature::

    fn(logp [N, T], old_logp [N, T], adv [N] or [N, T], mask [N, T], **hp) -> (per_token_loss [N, T], metrics)

``adv`` is one advantage per sequence (``[N]``: GRPO, GSPO, RLOO ...) or one per token (``[N, T]``: PPO's
GAE, arXiv 1506.02438). Every loss takes both through the same code: a sequence advantage is broadcast to
the sequence's tokens (``[N, 1]``), a token advantage is used as it is, so no caller branches on an
algorithm. For GSPO a token advantage multiplies the one sequence ratio s_i at each token (the form
arXiv 2507.18071 Eq. 13 states for GSPO-token).
``per_token_loss`` is the NEGATIVE surrogate (we minimise it), zero at masked positions; how tokens are
averaged is a separate choice (``grouprl.algo.aggregate``). ``metrics`` maps names to detached 0-dim
tensors computed over the real tokens of the given batch:

- ``ratio_mean``, ``ratio_min``, ``ratio_max``: the importance ratio the loss uses (per token, or the
  sequence ratio broadcast to its tokens for GSPO);
- ``clip_frac_low``: fraction of tokens with ratio < 1 - eps_low and A < 0 (clipped from below);
- ``clip_frac_high``: ratio > 1 + eps_high and A > 0; ``clip_frac``: either (no gradient there);
- ``approx_kl``: k3 estimate of KL(pi_old || pi_theta) = mean(ratio - 1 - log ratio) on the tokens.

A loss may return any subset of these (or other) names; the trainer logs whatever it gets.

Numerical bounds (applied inside every loss, before ``exp``):

- ``LOG_RATIO_BOUND = 20``: the token log-ratio ``logp - old_logp`` is clamped to [-20, 20] before
  ``exp`` (verl's ``compute_policy_loss_*`` in ``verl/trainer/ppo/core_algos.py`` clamps at the same
  +-20). e^20 = 4.85e8 is finite in fp32 and bf16, so the ratio, the loss and ``0 * ratio`` in a
  backward pass stay finite; unclamped, a log-ratio of 89 already overflows fp32 and turns a branch that
  ``min``/``where`` did not select into ``0 * inf = NaN`` in the gradient (e.g. ``grpo`` with
  ``dual_clip``). A token beyond the bound gets the boundary value and no gradient through the ratio --
  for A > 0 (ratio > 1 + eps_high) and A < 0 (ratio < 1 - eps_low) PPO-clip gives it none anyway.
  fp16 log-probs are not supported here (e^20 > 65504); grouprl computes log-probs in fp32.
- ``SEQ_LOG_RATIO_BOUND = 10``: GSPO's sequence log-ratio (1/|y_i|) sum_t (logp - old_logp) is clamped
  to [-10, 10] before ``exp`` (verl's ``compute_policy_loss_gspo`` clamps it at ``max=10.0``; we clamp
  both sides so the ratio metrics are bounded both ways -- below e^-10 the gradient s_i |A_i| / |y_i|
  is < 4.6e-5 |A_i| anyway). With clip ranges of 3e-4 / 4e-4 such a sequence is far outside the trust
  region: it is clipped (no gradient) or, for A_i < 0 and s_i > 1, pushed down with weight <= e^10.
"""

from __future__ import annotations

import torch

from grouprl.algo.ops import masked_mean
from grouprl.registry import POLICY_LOSSES, PREFERENCE_LOSSES

__all__ = [
    "LOG_RATIO_BOUND",
    "SEQ_LOG_RATIO_BOUND",
    "grpo_loss",
    "gspo_loss",
    "gspo_token_loss",
    "cispo_loss",
    "ppo_value_loss",
    "dpo_sigmoid_loss",
    "dpo_ipo_loss",
    "Metrics",
]

Metrics = dict[str, torch.Tensor]

LOG_RATIO_BOUND = 20.0
"""Token log-ratio ``logp - old_logp`` is clamped to [-LOG_RATIO_BOUND, LOG_RATIO_BOUND] before exp."""
SEQ_LOG_RATIO_BOUND = 10.0
"""GSPO's sequence log-ratio is clamped to [-SEQ_LOG_RATIO_BOUND, SEQ_LOG_RATIO_BOUND] before exp."""


def _check(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, who: str):
    if logp.dim() != 2 or old_logp.shape != logp.shape or mask.shape != logp.shape:
        raise ValueError(
            f"{who}: logp, old_logp and mask must all be [N, T]; got {tuple(logp.shape)}, "
            f"{tuple(old_logp.shape)}, {tuple(mask.shape)}"
        )
    if adv.shape != logp.shape[:1] and adv.shape != logp.shape:
        raise ValueError(f"{who}: adv must be [N] = [{logp.shape[0]}] (one per sequence) or [N, T] = "
                         f"{list(logp.shape)} (one per token), got {tuple(adv.shape)}")
    m = mask.to(logp.dtype)
    # Zero both log-probs on padding (ratio 1 there) so garbage or inf in padded positions can never turn
    # into a NaN gradient through torch.where's unselected branch.
    zero = torch.zeros_like(logp)
    logp = torch.where(m > 0, logp, zero)
    old_logp = torch.where(m > 0, old_logp.to(logp.dtype), zero)
    a = adv.to(logp.dtype)
    a = a.unsqueeze(-1) if a.dim() == 1 else torch.where(m > 0, a, torch.zeros_like(a))  # [N,1] or [N,T]
    return logp, old_logp, a, m


def _token_ratio(logp: torch.Tensor, old_logp: torch.Tensor) -> torch.Tensor:
    """exp(clamp(logp - old_logp, +-LOG_RATIO_BOUND)): finite for any finite inputs (see module doc)."""
    return torch.exp(torch.clamp(logp - old_logp, -LOG_RATIO_BOUND, LOG_RATIO_BOUND))


def _masked_extreme(x: torch.Tensor, mask: torch.Tensor, largest: bool) -> torch.Tensor:
    fill = torch.full_like(x, float("-inf") if largest else float("inf"))
    vals = torch.where(mask > 0, x, fill)
    out = vals.max() if largest else vals.min()
    return torch.where(torch.isfinite(out), out, torch.ones_like(out))


def _ratio_metrics(
    ratio: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, eps_low: float, eps_high: float
) -> Metrics:
    """Metrics of one ratio tensor ``[N, T]`` (``adv`` ``[N, 1]`` or ``[N, T]``) over the masked tokens; detached."""
    with torch.no_grad():
        r = ratio.detach()
        low = ((r < 1.0 - eps_low) & (adv < 0)).to(r.dtype)
        high = ((r > 1.0 + eps_high) & (adv > 0)).to(r.dtype)
        log_r = torch.log(r.clamp(min=torch.finfo(r.dtype).tiny))
        return {
            "ratio_mean": masked_mean(r, mask),
            "ratio_min": _masked_extreme(r, mask, largest=False),
            "ratio_max": _masked_extreme(r, mask, largest=True),
            "clip_frac_low": masked_mean(low, mask),
            "clip_frac_high": masked_mean(high, mask),
            "clip_frac": masked_mean(torch.maximum(low, high), mask),
            "approx_kl": masked_mean(r - 1.0 - log_r, mask),
        }


def _clipped_surrogate_loss(
    ratio: torch.Tensor, adv: torch.Tensor, eps_low: float, eps_high: float
) -> torch.Tensor:
    """-min(ratio * A, clip(ratio, 1 - eps_low, 1 + eps_high) * A), elementwise."""
    clipped = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    return -torch.minimum(ratio * adv, clipped * adv)


@POLICY_LOSSES.register("grpo")
def grpo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    dual_clip: float | None = None,
    delta: float | None = None,
) -> tuple[torch.Tensor, Metrics]:
    """GRPO / PPO-clip per-token loss with clip-higher, optional dual-clip and two-sided cap.

    Paper: GRPO, arXiv 2402.03300, Eq. (3); PPO, arXiv 1707.06347, Eq. (7). With
    rho_{i,t} = exp(logp - old_logp):

        L_{i,t} = -min(rho_{i,t} A_i, clip(rho_{i,t}, 1 - eps_low, 1 + eps_high) A_i)

    - ``eps_high > eps_low`` is DAPO's clip-higher (arXiv 2503.14476, Eq. 8; 0.2 / 0.28 there).
    - ``dual_clip = c > 1``: for A < 0 the loss is additionally capped at -c A (Ye et al. 2020,
      arXiv 1912.09729), bounding the push-down of tokens whose ratio exploded.
    - ``delta > 1 + eps_high``: the unclipped ratio is capped at delta, so for A < 0 the loss is at most
      delta |A| (INTELLECT-2 two-sided clipping, arXiv 2505.07291).

    rho is exp of the log-ratio clamped to +-``LOG_RATIO_BOUND`` = 20 (module docstring).

    Shapes: ``logp, old_logp, mask [N, T]``, ``adv [N]`` or ``[N, T]`` -> ``(per_token_loss [N, T], metrics)``.
    Example: rho = 1.5, A = 1, eps = 0.2 -> objective min(1.5, 1.2) = 1.2, loss -1.2, zero gradient.
    """
    logp, old_logp, a, m = _check(logp, old_logp, adv, mask, "grpo loss")
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"grpo loss: dual_clip={dual_clip} must be > 1 (3.0 is usual) or None")
    if delta is not None and delta <= 1.0 + eps_high:
        raise ValueError(f"grpo loss: delta={delta} must be > 1 + eps_high = {1.0 + eps_high} or None")
    ratio = _token_ratio(logp, old_logp)
    clipped = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    unclipped = ratio if delta is None else torch.clamp(ratio, max=delta)
    loss = -torch.minimum(unclipped * a, clipped * a)
    if dual_clip is not None:
        loss = torch.where(a < 0, torch.minimum(loss, -dual_clip * a), loss)
    loss = torch.where(m > 0, loss, torch.zeros_like(loss))
    return loss, _ratio_metrics(ratio, a, m, eps_low, eps_high)


def _sequence_log_ratio(logp: torch.Tensor, old_logp: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """(1/|y_i|) sum_t (logp - old_logp) over real tokens, clamped to +-SEQ_LOG_RATIO_BOUND -> [N, 1];
    0 for empty sequences."""
    seq = masked_mean(logp - old_logp, m, dim=-1).unsqueeze(-1)
    return torch.clamp(seq, -SEQ_LOG_RATIO_BOUND, SEQ_LOG_RATIO_BOUND)


@POLICY_LOSSES.register("gspo")
def gspo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    *,
    eps_low: float = 3e-4,
    eps_high: float = 4e-4,
) -> tuple[torch.Tensor, Metrics]:
    """GSPO sequence-level clipped loss, broadcast to the sequence's tokens.

    Paper: Zheng et al. 2025, "Group Sequence Policy Optimization", arXiv 2507.18071, Eqs. (5)-(7):

        s_i = exp((1/|y_i|) sum_t log(pi_theta(y_{i,t}) / pi_old(y_{i,t})))
        J = (1/G) sum_i min(s_i A_i, clip(s_i, 1 - eps_low, 1 + eps_high) A_i)

    s_i carries gradient through the mean log-ratio (not detached), so every token of sequence i gets
    the same per-token loss -min(s_i A_i, clip(s_i) A_i). Aggregated with ``seq_mean_token_mean`` this is
    exactly -J in value and gradient; ``token_mean`` would weight sequences by their length instead.
    Defaults 3e-4 / 4e-4 are the paper's (Sec. 5.1). The sequence log-ratio is clamped to
    +-``SEQ_LOG_RATIO_BOUND`` = 10 before exp (module docstring).

    Shapes: ``logp, old_logp, mask [N, T]``, ``adv [N]`` or ``[N, T]`` -> ``(per_token_loss [N, T], metrics)``;
    metrics use s_i broadcast to the tokens.
    """
    logp, old_logp, a, m = _check(logp, old_logp, adv, mask, "gspo loss")
    seq_ratio = torch.exp(_sequence_log_ratio(logp, old_logp, m))  # [N, 1]
    loss = _clipped_surrogate_loss(seq_ratio, a, eps_low, eps_high).expand_as(logp)
    loss = torch.where(m > 0, loss, torch.zeros_like(loss))
    return loss, _ratio_metrics(seq_ratio.expand_as(logp), a, m, eps_low, eps_high)


@POLICY_LOSSES.register("gspo_token")
def gspo_token_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    *,
    eps_low: float = 3e-4,
    eps_high: float = 4e-4,
) -> tuple[torch.Tensor, Metrics]:
    """GSPO-token: the stop-gradient per-token form that admits token-level advantages.

    Paper: arXiv 2507.18071, Eqs. (13)-(14):

        s_{i,t} = sg[s_i] * pi_theta(y_{i,t}) / sg[pi_theta(y_{i,t})]
        L_{i,t} = -min(s_{i,t} A_i, clip(s_{i,t}, 1 - eps_low, 1 + eps_high) A_i)

    s_{i,t} equals s_i in value; its gradient is s_i * grad log pi_theta(y_{i,t}). With one advantage per
    sequence and ``seq_mean_token_mean`` aggregation it has the same value and gradient as ``gspo``.
    log s_{i,t} is clamped to +-``SEQ_LOG_RATIO_BOUND`` = 10 as ``gspo``'s log s_i is (no gradient beyond).

    Shapes: ``logp, old_logp, mask [N, T]``, ``adv [N]`` or ``[N, T]`` -> ``(per_token_loss [N, T], metrics)``.
    """
    logp, old_logp, a, m = _check(logp, old_logp, adv, mask, "gspo_token loss")
    # log s_{i,t} = sg[log s_i] + logp - sg[logp], clamped as a whole: beyond the bound the token gets no
    # gradient, exactly like ``gspo`` (whose clamp sits on log s_i itself).
    seq_log_ratio = masked_mean(logp - old_logp, m, dim=-1).unsqueeze(-1).detach()
    token_log_ratio = seq_log_ratio + (logp - logp.detach())
    token_ratio = torch.exp(torch.clamp(token_log_ratio, -SEQ_LOG_RATIO_BOUND, SEQ_LOG_RATIO_BOUND))
    loss = _clipped_surrogate_loss(token_ratio, a, eps_low, eps_high)
    loss = torch.where(m > 0, loss, torch.zeros_like(loss))
    return loss, _ratio_metrics(token_ratio, a, m, eps_low, eps_high)


@POLICY_LOSSES.register("cispo")
def cispo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    *,
    eps_low: float = 1.0,
    eps_high: float = 0.28,
) -> tuple[torch.Tensor, Metrics]:
    """CISPO: REINFORCE with a clipped, stop-gradient importance weight; no token is dropped.

    Paper: MiniMax-M1, arXiv 2506.13585, Eqs. (4)-(5):

        L_{i,t} = -sg[clip(rho_{i,t}, 1 - eps_low, 1 + eps_high)] * A_i * log pi_theta(y_{i,t})

    The gradient is clip(rho) A grad log pi for every token (unlike PPO-clip, which zeroes clipped
    tokens). The paper sets no lower bound (``eps_low = 1.0`` -> bound 0) and tunes the upper one;
    0.28 is our default (DAPO's eps_high), not a value from the paper. The loss VALUE is not a
    surrogate objective (it scales with log pi); only its gradient is meaningful.
    Here ``clip_frac*`` count tokens whose weight was clipped (any advantage sign). rho uses the
    log-ratio clamped to +-``LOG_RATIO_BOUND`` = 20 (module docstring).

    Shapes: ``logp, old_logp, mask [N, T]``, ``adv [N]`` or ``[N, T]`` -> ``(per_token_loss [N, T], metrics)``.
    """
    logp, old_logp, a, m = _check(logp, old_logp, adv, mask, "cispo loss")
    ratio = _token_ratio(logp, old_logp)
    weight = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high).detach()
    loss = -weight * a * logp
    loss = torch.where(m > 0, loss, torch.zeros_like(loss))
    metrics = _ratio_metrics(ratio, a, m, eps_low, eps_high)
    with torch.no_grad():
        low = (ratio < 1.0 - eps_low).to(ratio.dtype)
        high = (ratio > 1.0 + eps_high).to(ratio.dtype)
        metrics["clip_frac_low"] = masked_mean(low, m)
        metrics["clip_frac_high"] = masked_mean(high, m)
        metrics["clip_frac"] = masked_mean(torch.maximum(low, high), m)
    return loss, metrics


def ppo_value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_eps: float | None = 0.2,
) -> tuple[torch.Tensor, Metrics]:
    """PPO clipped value loss, per token: 0.5 * max((V - R)^2, (clip(V, V_old +- eps) - R)^2).

    Paper: PPO implementation (Schulman et al. 2017, arXiv 1707.06347; OpenAI baselines), as in
    "The 37 Implementation Details of PPO" (Huang et al. 2022, detail 9). ``clip_eps=None`` gives the
    unclipped 0.5 (V - R)^2. Shapes: ``[N, T]`` x 4 -> ``(per_token [N, T], {"vf_clip_frac"})``.
    """
    m = mask.to(values.dtype)
    err = (values - returns) ** 2
    if clip_eps is None:
        loss, clip_frac = 0.5 * err, torch.zeros((), dtype=values.dtype)
    else:
        v_clip = old_values + torch.clamp(values - old_values, -clip_eps, clip_eps)
        err_clip = (v_clip - returns) ** 2
        loss = 0.5 * torch.maximum(err, err_clip)
        clip_frac = masked_mean((err_clip > err).to(values.dtype), m).detach()
    loss = torch.where(m > 0, loss, torch.zeros_like(loss))
    return loss, {"vf_clip_frac": clip_frac}


def _dpo_margin(chosen_logp, rejected_logp, ref_chosen_logp, ref_rejected_logp) -> torch.Tensor:
    return (chosen_logp - ref_chosen_logp) - (rejected_logp - ref_rejected_logp)


@PREFERENCE_LOSSES.register("sigmoid")
def dpo_sigmoid_loss(
    chosen_logp: torch.Tensor,
    rejected_logp: torch.Tensor,
    ref_chosen_logp: torch.Tensor,
    ref_rejected_logp: torch.Tensor,
    *,
    beta: float = 0.1,
    label_smoothing: float = 0.0,
) -> tuple[torch.Tensor, Metrics]:
    """DPO loss: -log sigmoid(beta * h), h = (log pi/ref)(chosen) - (log pi/ref)(rejected).

    Paper: Rafailov et al. 2023, arXiv 2305.18290, Eq. (7); ``label_smoothing`` = eps of conservative
    DPO (cDPO): -(1-eps) log sig(beta h) - eps log sig(-beta h). Inputs are sequence log-prob SUMS.
    Shapes: four ``[N]`` -> ``(loss [N], {"reward_margin", "reward_accuracy"})``.
    """
    h = _dpo_margin(chosen_logp, rejected_logp, ref_chosen_logp, ref_rejected_logp)
    logits = beta * h
    loss = -(1.0 - label_smoothing) * torch.nn.functional.logsigmoid(logits)
    loss = loss - label_smoothing * torch.nn.functional.logsigmoid(-logits)
    with torch.no_grad():
        metrics = {"reward_margin": logits.mean(), "reward_accuracy": (logits > 0).to(logits.dtype).mean()}
    return loss, metrics


@PREFERENCE_LOSSES.register("ipo")
def dpo_ipo_loss(
    chosen_logp: torch.Tensor,
    rejected_logp: torch.Tensor,
    ref_chosen_logp: torch.Tensor,
    ref_rejected_logp: torch.Tensor,
    *,
    beta: float = 0.1,
) -> tuple[torch.Tensor, Metrics]:
    """IPO loss: (h - 1/(2 beta))^2 with h the DPO log-ratio margin.

    Paper: Azar et al. 2023, "A General Theoretical Paradigm to Understand Learning from Human
    Preferences", arXiv 2310.12036, Eq. (17) (tau = beta). The paper uses per-token AVERAGED log-probs
    for h; pass those in if you follow it. Shapes: four ``[N]`` -> ``(loss [N], metrics)``.
    """
    h = _dpo_margin(chosen_logp, rejected_logp, ref_chosen_logp, ref_rejected_logp)
    loss = (h - 1.0 / (2.0 * beta)) ** 2
    with torch.no_grad():
        metrics = {"reward_margin": (beta * h).mean(), "reward_accuracy": (h > 0).to(h.dtype).mean()}
    return loss, metrics


dpo_ipo_loss.averaged_logps = True  # IPO's margin is on token-averaged log-probs (arXiv:2310.12036, Sec. 5.2)
