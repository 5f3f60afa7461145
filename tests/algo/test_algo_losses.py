"""Policy losses, PPO value loss and DPO losses: hand-derived values, gradients and metrics."""

from __future__ import annotations

import math

import pytest
import torch

from grouprl.algo import LOG_RATIO_BOUND, SEQ_LOG_RATIO_BOUND, dpo_ipo_loss, dpo_sigmoid_loss, ppo_value_loss
from grouprl.registry import AGGREGATIONS, POLICY_LOSSES

LOG = math.log
D = torch.float64


def col(values):
    """[N] values -> [N, 1] float64 tensor (one token per sequence)."""
    return torch.tensor(values, dtype=D).unsqueeze(-1)


def loss_and_grad(name, logp, old_logp, adv, mask, **hp):
    logp = logp.clone().requires_grad_(True)
    per_token, metrics = POLICY_LOSSES.get(name)(logp, old_logp, adv, mask, **hp)
    (grad,) = torch.autograd.grad(per_token.sum(), logp)
    return per_token.detach(), grad, metrics


# ---- grpo ------------------------------------------------------------------------------------------


def test_grpo_ratio_1_5_is_clipped_to_1_2_with_zero_gradient():
    # rho = 1.5, A = 1, eps = 0.2: objective min(1.5 * 1, clip(1.5, .8, 1.2) * 1) = 1.2 -> loss -1.2;
    # the min picks the clipped (constant) branch, so d loss / d logp = 0.
    loss, grad, _ = loss_and_grad("grpo", col([LOG(1.5)]), col([0.0]), torch.tensor([1.0], dtype=D),
                                  torch.ones(1, 1))
    assert loss.item() == pytest.approx(-1.2)
    assert grad.item() == 0.0


def test_grpo_four_cases_values_gradients_metrics():
    # token ratios [1.5, .5, .5, 1.5] with A [1, 1, -1, -1], eps .2 (bounds .8 / 1.2):
    #  1.5, A=+1: min(1.5, 1.2)   =  1.2 -> loss -1.2, grad 0            (clipped high)
    #   .5, A=+1: min(.5, .8)     =   .5 -> loss -.5,  grad -rho A = -.5
    #   .5, A=-1: min(-.5, -.8)   =  -.8 -> loss  .8,  grad 0            (clipped low)
    #  1.5, A=-1: min(-1.5, -1.2) = -1.5 -> loss 1.5,  grad -rho A = 1.5
    # ratio mean 1, min .5, max 1.5; clip_frac_low = 1/4, clip_frac_high = 1/4, clip_frac = 1/2
    # approx_kl = mean(r - 1 - ln r) = (2 (.5 - ln 1.5) + 2 (-.5 + ln 2)) / 4 = .143841
    logp = col([LOG(1.5), LOG(0.5), LOG(0.5), LOG(1.5)])
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0], dtype=D)
    loss, grad, m = loss_and_grad("grpo", logp, torch.zeros_like(logp), adv, torch.ones(4, 1))
    assert loss.flatten().tolist() == pytest.approx([-1.2, -0.5, 0.8, 1.5])
    assert grad.flatten().tolist() == pytest.approx([0.0, -0.5, 0.0, 1.5])
    assert m["ratio_mean"].item() == pytest.approx(1.0)
    assert (m["ratio_min"].item(), m["ratio_max"].item()) == pytest.approx((0.5, 1.5))
    assert m["clip_frac_low"].item() == pytest.approx(0.25)
    assert m["clip_frac_high"].item() == pytest.approx(0.25)
    assert m["clip_frac"].item() == pytest.approx(0.5)
    assert m["approx_kl"].item() == pytest.approx(0.143841, abs=1e-6)
    assert all(v.dim() == 0 and not v.requires_grad for v in m.values())


def test_grpo_clip_higher():
    # rho = 1.25, A = 1: eps_high .28 -> bound 1.28 > 1.25, unclipped: loss -1.25, grad -1.25;
    # symmetric .2 -> bound 1.2 clips it: loss -1.2, grad 0
    args = (col([LOG(1.25)]), col([0.0]), torch.tensor([1.0], dtype=D), torch.ones(1, 1))
    loss, grad, _ = loss_and_grad("grpo", *args, eps_low=0.2, eps_high=0.28)
    assert (loss.item(), grad.item()) == pytest.approx((-1.25, -1.25))
    loss, grad, _ = loss_and_grad("grpo", *args)
    assert (loss.item(), grad.item()) == pytest.approx((-1.2, 0.0))


def test_grpo_dual_clip_and_delta_cap_negative_advantages():
    # rho = 4, A = -1: plain loss -min(-4, -1.2) = 4 with grad 4 (= -rho A).
    # dual_clip c = 3: min(4, -c A = 3) = 3, grad 0.  delta = 2: ratio capped at 2 -> -min(-2, -1.2) = 2, grad 0.
    # For A = +1 neither changes anything: -min(4, 1.2) = -1.2.
    logp, old, mask = col([LOG(4.0)]), col([0.0]), torch.ones(1, 1)
    neg, pos = torch.tensor([-1.0], dtype=D), torch.tensor([1.0], dtype=D)
    assert loss_and_grad("grpo", logp, old, neg, mask)[0].item() == pytest.approx(4.0)
    assert loss_and_grad("grpo", logp, old, neg, mask)[1].item() == pytest.approx(4.0)
    loss, grad, _ = loss_and_grad("grpo", logp, old, neg, mask, dual_clip=3.0)
    assert (loss.item(), grad.item()) == pytest.approx((3.0, 0.0))
    loss, grad, _ = loss_and_grad("grpo", logp, old, neg, mask, delta=2.0)
    assert (loss.item(), grad.item()) == pytest.approx((2.0, 0.0))
    for hp in ({"dual_clip": 3.0}, {"delta": 2.0}):
        assert loss_and_grad("grpo", logp, old, pos, mask, **hp)[0].item() == pytest.approx(-1.2)


def test_grpo_regression_dual_clip_fp32_log_ratio_100_has_finite_gradient():
    # fp32, log-ratio 100, A = -1, dual_clip 3: unclamped, exp(100) = inf, the loss took the dual-clip
    # branch (3) and the gradient of the unselected branch was 0 * inf = NaN. Clamped at 20:
    # rho = e^20 = 4.85e8, loss min(-min(-rho, -1.2), 3) = min(rho, 3) = 3, gradient 0.
    logp = torch.tensor([[100.0]], requires_grad=True)
    per_token, m = POLICY_LOSSES.get("grpo")(logp, torch.zeros(1, 1), torch.tensor([-1.0]), torch.ones(1, 1),
                                              dual_clip=3.0)
    (grad,) = torch.autograd.grad(per_token.sum(), logp)
    assert per_token.item() == pytest.approx(3.0)
    assert grad.item() == 0.0
    assert m["ratio_max"].item() == pytest.approx(math.exp(20), rel=1e-6)  # honest, not a placeholder
    assert math.isfinite(m["approx_kl"].item())


def test_log_ratio_bounds_hand_numbers():
    # grpo, log-ratio 25 -> clamped 20, A = -1, no dual clip: loss -min(-e^20, -1.2) = e^20 = 4.8517e8, grad 0
    #       (the clamp passes no gradient); log-ratio 19 inside: loss e^19, grad -rho A = e^19.
    # cispo, log-ratio 25: weight clip(e^20, 0, 1.28) = 1.28, A = 1, logp = -1: loss 1.28, grad -1.28.
    assert LOG_RATIO_BOUND == 20.0 and SEQ_LOG_RATIO_BOUND == 10.0
    old = col([-26.0, -20.0])
    logp = col([-1.0, -1.0])
    loss, grad, _ = loss_and_grad("grpo", logp, old, torch.tensor([-1.0, -1.0], dtype=D), torch.ones(2, 1))
    assert loss.flatten().tolist() == pytest.approx([math.exp(20), math.exp(19)])
    assert grad.flatten().tolist() == pytest.approx([0.0, math.exp(19)])
    loss, grad, _ = loss_and_grad("cispo", logp[:1], old[:1], torch.tensor([1.0], dtype=D), torch.ones(1, 1))
    assert (loss.item(), grad.item()) == pytest.approx((1.28, -1.28))
    # gspo: token log-ratios [30, 10] -> sequence mean 20 -> clamped 10: s = e^10 = 22026.4658
    #       A = -1: loss -min(-s, -1.0004) = s on both tokens, grad 0; A = +1: -min(s, 1.0004) = -1.0004
    logp2 = torch.tensor([[30.0, 10.0]], dtype=D)
    for name in ("gspo", "gspo_token"):
        loss, grad, m = loss_and_grad(name, logp2, torch.zeros_like(logp2), torch.tensor([-1.0], dtype=D),
                                      torch.ones(1, 2))
        assert loss[0].tolist() == pytest.approx([math.exp(10)] * 2), name
        assert m["ratio_max"].item() == pytest.approx(math.exp(10)), name
        assert grad.abs().sum().item() == 0.0, name
        loss, _, _ = loss_and_grad(name, logp2, torch.zeros_like(logp2), torch.tensor([1.0], dtype=D),
                                   torch.ones(1, 2))
        assert loss[0].tolist() == pytest.approx([-1.0004] * 2), name


def test_grpo_rejects_bad_hyperparameters_and_shapes():
    args = (col([0.0]), col([0.0]), torch.tensor([1.0], dtype=D), torch.ones(1, 1))
    with pytest.raises(ValueError, match="dual_clip"):
        POLICY_LOSSES.get("grpo")(*args, dual_clip=0.5)
    with pytest.raises(ValueError, match="delta"):
        POLICY_LOSSES.get("grpo")(*args, delta=1.1)
    with pytest.raises(ValueError, match=r"adv must be \[N\]"):
        POLICY_LOSSES.get("grpo")(col([0.0]), col([0.0]), torch.ones(2), torch.ones(1, 1))


# ---- gspo ------------------------------------------------------------------------------------------


def test_gspo_hand_numbers():
    # seq 0: token log-ratios [1e-4, 3e-4] -> mean 2e-4, s = e^2e-4 = 1.00020002, inside [.9997, 1.0004];
    #        A = 2: loss per token -A s = -2.00040004. d(-A s)/d logp_t = -A s / |y|, and the summed per-token
    #        loss holds that term |y| = 2 times, so d sum / d logp_t = -A s = -2.00040004 (s not detached).
    # seq 1: log-ratios [-1e-3, 0] (third token is padding) -> mean -5e-4, s = .99950012 < .9997, A = -1:
    #        -min(-s, -.9997) = .9997, clipped low -> grad 0; padding gets loss 0.
    logp = torch.tensor([[1e-4, 3e-4, 0.0], [-1e-3, 0.0, 5.0]], dtype=D)
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]])
    adv = torch.tensor([2.0, -1.0], dtype=D)
    loss, grad, m = loss_and_grad("gspo", logp, torch.zeros_like(logp), adv, mask)
    s0 = math.exp(2e-4)
    assert loss[0].tolist() == pytest.approx([-2 * s0, -2 * s0, 0.0], abs=1e-12)
    assert loss[1].tolist() == pytest.approx([0.9997, 0.9997, 0.0], abs=1e-12)
    assert grad[0].tolist() == pytest.approx([-2 * s0, -2 * s0, 0.0], abs=1e-12)
    assert grad[1].tolist() == [0.0, 0.0, 0.0]
    # metrics over the 4 real tokens (s broadcast): 2 of them clipped low
    assert m["clip_frac_low"].item() == pytest.approx(0.5)
    assert m["clip_frac_high"].item() == 0.0
    assert m["ratio_max"].item() == pytest.approx(s0)


def test_gspo_large_ratio_clipped_with_paper_defaults():
    # log-ratios [.1, .3] -> s = e^.2 = 1.2214 > 1.0004: A = 1 -> loss -1.0004 on each token, grad 0
    logp = torch.tensor([[0.1, 0.3]], dtype=D)
    loss, grad, m = loss_and_grad("gspo", logp, torch.zeros_like(logp), torch.tensor([1.0], dtype=D),
                                  torch.ones(1, 2))
    assert loss.tolist()[0] == pytest.approx([-1.0004, -1.0004])
    assert grad.abs().sum().item() == 0.0
    assert m["clip_frac_high"].item() == 1.0


def _sequence_objective(logp, old_logp, adv, mask, eps_low, eps_high):
    """Direct transcription of GSPO Eq. (5)-(7): J = (1/G) sum_i min(s_i A_i, clip(s_i) A_i)."""
    terms = []
    for i in range(logp.shape[0]):
        real = mask[i].bool()
        s_i = torch.exp((logp[i][real] - old_logp[i][real]).sum() / real.sum())
        terms.append(torch.minimum(s_i * adv[i], torch.clamp(s_i, 1 - eps_low, 1 + eps_high) * adv[i]))
    return torch.stack(terms).mean()


@pytest.mark.parametrize("name", ["gspo", "gspo_token"])
def test_gspo_value_and_gradient_equal_sequence_objective(name):
    # A linear "policy" so the gradient flows through parameters; old policy = perturbed current one,
    # with eps wide enough that some sequences are clipped and others not.
    torch.manual_seed(0)
    n, t, d, v = 6, 5, 4, 7
    x = torch.randn(n, t, d, dtype=D)
    w = torch.randn(d, v, dtype=D, requires_grad=True)
    tokens = torch.randint(0, v, (n, t))
    mask = (torch.arange(t) < torch.tensor([5, 3, 1, 4, 2, 5]).unsqueeze(-1)).long()
    adv = torch.randn(n, dtype=D)
    logp = torch.log_softmax(x @ w, -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    old_logp = (logp + 0.05 * torch.randn(n, t, dtype=D)).detach()
    eps = dict(eps_low=0.02, eps_high=0.03)
    per_token, m = POLICY_LOSSES.get(name)(logp, old_logp, adv, mask, **eps)
    ours = AGGREGATIONS.get("seq_mean_token_mean")(per_token, mask)
    direct = -_sequence_objective(logp, old_logp, adv, mask, **eps)
    (g_ours,) = torch.autograd.grad(ours, w, retain_graph=True)
    (g_direct,) = torch.autograd.grad(direct, w)
    assert ours.item() == pytest.approx(direct.item(), abs=1e-12)
    assert torch.allclose(g_ours, g_direct, atol=1e-12)
    assert 0 < m["clip_frac"].item() < 1  # both regimes exercised
    assert g_direct.abs().sum() > 0


def test_gspo_token_gradient_is_sequence_ratio_times_token_score():
    # s_{i,t} = sg[s_i] pi / sg[pi]: value s_i, and token t's loss depends only on logp_t:
    # d(-A s_{i,t})/d logp_t = -A s_i. log-ratios [1e-4, 3e-4], A = 1: s = e^2e-4; loss -s, grad -s per token
    # (the same summed gradient as gspo, where each of the |y| copies contributes -A s / |y|)
    logp = torch.tensor([[1e-4, 3e-4]], dtype=D)
    loss, grad, _ = loss_and_grad("gspo_token", logp, torch.zeros_like(logp), torch.tensor([1.0], dtype=D),
                                  torch.ones(1, 2))
    s = math.exp(2e-4)
    assert loss.tolist()[0] == pytest.approx([-s, -s], abs=1e-12)
    assert grad.tolist()[0] == pytest.approx([-s, -s], abs=1e-12)


# ---- cispo -----------------------------------------------------------------------------------------


def test_cispo_hand_numbers():
    # token 0: pi = .5, old = .25 -> rho 2, weight clip(2, 0, 1.28) = 1.28, A = 1:
    #          loss = -1.28 * ln .5 = .887228; grad = -1.28 (weight is stop-gradient)
    # token 1: pi = .25, old = .5 -> rho .5, weight .5 (no lower bound), A = 1:
    #          loss = -.5 * ln .25 = .693147; grad = -.5  (PPO-clip would drop neither; here both count)
    logp = col([LOG(0.5), LOG(0.25)])
    old = col([LOG(0.25), LOG(0.5)])
    loss, grad, m = loss_and_grad("cispo", logp, old, torch.tensor([1.0, 1.0], dtype=D), torch.ones(2, 1))
    assert loss.flatten().tolist() == pytest.approx([0.887228, 0.693147], abs=1e-6)
    assert grad.flatten().tolist() == pytest.approx([-1.28, -0.5])
    assert m["clip_frac_high"].item() == pytest.approx(0.5)
    assert m["clip_frac_low"].item() == 0.0


# ---- ppo value loss and dpo ------------------------------------------------------------------------


def test_ppo_value_loss_hand_numbers():
    # V=1, V_old=.5, R=2: err (1-2)^2 = 1; V_clip = .5+.2 = .7 -> (.7-2)^2 = 1.69; .5 max = .845, grad 0
    # V=1, V_old=.9, R=0: V_clip = V -> .5 * 1 = .5, grad V - R = 1
    # V=0, V_old=.5, R=2: err 4; V_clip = .3 -> 2.89; .5 * 4 = 2, grad V - R = -2.  vf_clip_frac = 1/3
    values = torch.tensor([[1.0, 1.0, 0.0, 7.0]], dtype=D, requires_grad=True)
    old = torch.tensor([[0.5, 0.9, 0.5, 0.0]], dtype=D)
    ret = torch.tensor([[2.0, 0.0, 2.0, 0.0]], dtype=D)
    mask = torch.tensor([[1, 1, 1, 0]])
    loss, m = ppo_value_loss(values, old, ret, mask, clip_eps=0.2)
    (grad,) = torch.autograd.grad(loss.sum(), values)
    assert loss.tolist()[0] == pytest.approx([0.845, 0.5, 2.0, 0.0])
    assert grad.tolist()[0] == pytest.approx([0.0, 1.0, -2.0, 0.0])
    assert m["vf_clip_frac"].item() == pytest.approx(1 / 3)
    unclipped, _ = ppo_value_loss(values, old, ret, mask, clip_eps=None)
    assert unclipped.tolist()[0] == pytest.approx([0.5, 0.5, 2.0, 0.0])


def test_dpo_sigmoid_and_ipo_hand_numbers():
    # h = (-1 - -2) - (-3 - -2) = 1 + 1 = 2; beta = .5 -> beta h = 1
    # sigmoid: -ln sig(1) = ln(1 + e^-1) = .313262
    # cDPO eps .1: .9 * .313262 + .1 * ln(1 + e) = .281936 + .131326 = .413262
    # IPO: (h - 1/(2 beta))^2 = (2 - 1)^2 = 1 at beta .5; (2 - 2)^2 = 0 at beta .25
    args = [torch.tensor([v], dtype=D) for v in (-1.0, -3.0, -2.0, -2.0)]
    loss, m = dpo_sigmoid_loss(*args, beta=0.5)
    assert loss.item() == pytest.approx(0.313262, abs=1e-6)
    assert m["reward_margin"].item() == pytest.approx(1.0)
    assert m["reward_accuracy"].item() == 1.0
    assert dpo_sigmoid_loss(*args, beta=0.5, label_smoothing=0.1)[0].item() == pytest.approx(0.413262, abs=1e-6)
    assert dpo_ipo_loss(*args, beta=0.5)[0].item() == pytest.approx(1.0)
    assert dpo_ipo_loss(*args, beta=0.25)[0].item() == pytest.approx(0.0)
