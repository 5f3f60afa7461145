"""KL estimators and exact categorical KL: hand-derived numbers."""

from __future__ import annotations

import math

import pytest
import torch

from grouprl.algo import KL_LOG_RATIO_BOUND, add_kl_term, kl_categorical, kl_k3, kl_penalized_rewards
from grouprl.registry import AGGREGATIONS, KL_ESTIMATORS, POLICY_LOSSES

LOG = math.log
D = torch.float64


def test_kl_categorical_forward_and_reverse():
    # KL([.5,.5] || [.25,.75]) = .5 ln(.5/.25) + .5 ln(.5/.75) = .346574 - .202733 = .143841
    # KL([.25,.75] || [.5,.5]) = .25 ln(.5) + .75 ln(1.5) = -.173287 + .304099 = .130812
    assert kl_categorical([0.5, 0.5], [0.25, 0.75]).item() == pytest.approx(0.143841, abs=1e-6)
    assert kl_categorical([0.25, 0.75], [0.5, 0.5]).item() == pytest.approx(0.130812, abs=1e-6)


def test_kl_categorical_zero_mass_and_batch():
    # p_k = 0 terms vanish: KL([1,0] || [.5,.5]) = ln 2; identical rows -> 0; batched over dim -1
    p = torch.tensor([[1.0, 0.0], [0.3, 0.7]], dtype=torch.float64)
    q = torch.tensor([[0.5, 0.5], [0.3, 0.7]], dtype=torch.float64)
    assert kl_categorical(p, q).tolist() == pytest.approx([LOG(2), 0.0], abs=1e-12)
    assert kl_categorical([0.5, 0.5], [1.0, 0.0]).item() == math.inf


def test_estimators_hand_numbers():
    # pi_theta = 0.5, pi_ref = 0.25, log r = log(pi_ref / pi_theta) = -ln 2
    # k1 = -log r = ln 2 = .693147; k2 = .5 (ln 2)^2 = .240227; k3 = r - 1 - log r = -.5 + ln 2 = .193147
    logp = torch.tensor([[LOG(0.5)]], dtype=torch.float64)
    ref = torch.tensor([[LOG(0.25)]], dtype=torch.float64)
    assert KL_ESTIMATORS.get("k1")(logp, ref).item() == pytest.approx(0.693147, abs=1e-6)
    assert KL_ESTIMATORS.get("k2")(logp, ref).item() == pytest.approx(0.240227, abs=1e-6)
    assert KL_ESTIMATORS.get("k3")(logp, ref).item() == pytest.approx(0.193147, abs=1e-6)


@pytest.mark.parametrize(
    "pi, ref, expected",
    [
        # pi = .5, ref = .25: log r = ln(ref/pi) = -ln 2, r = .5; l = logp - ref_logp = ln 2
        #   k1 = l = .693147, d/dlogp = 1
        #   k2 = .5 l^2 = .240227, d/dlogp = l = .693147
        #   k3 = r - 1 - log r = -.5 + ln 2 = .193147, d/dlogp = d/dlogp (e^(ref-logp) - (ref-logp)) = 1 - r = .5
        #   k3_st: value k3 = .193147, gradient k2's = .693147
        (0.5, 0.25, {"k1": (0.693147, 1.0), "k2": (0.240227, 0.693147), "k3": (0.193147, 0.5),
                     "k3_st": (0.193147, 0.693147)}),
        # pi = .25, ref = .5: log r = ln 2, r = 2; l = -ln 2
        #   k1 = -.693147, grad 1; k2 = .240227, grad -.693147; k3 = 2 - 1 - ln 2 = .306853, grad 1 - 2 = -1
        #   k3_st: value .306853, gradient -.693147
        (0.25, 0.5, {"k1": (-0.693147, 1.0), "k2": (0.240227, -0.693147), "k3": (0.306853, -1.0),
                     "k3_st": (0.306853, -0.693147)}),
    ],
)
def test_estimator_values_and_gradients_hand_numbers(pi, ref, expected):
    for name, (value, grad) in expected.items():
        logp = torch.tensor([[LOG(pi)]], dtype=D, requires_grad=True)
        kl = KL_ESTIMATORS.get(name)(logp, torch.tensor([[LOG(ref)]], dtype=D))
        (g,) = torch.autograd.grad(kl.sum(), logp)
        assert kl.item() == pytest.approx(value, abs=1e-6), name
        assert g.item() == pytest.approx(grad, abs=1e-6), name


def _expected_gradient(name, z, ref):
    """E_{y ~ pi}[grad_z kl(y)] computed exactly: sum_y sg[pi(y)] * grad_z kl(log pi(y), log ref(y))."""
    logp = torch.log_softmax(z, -1)
    per_token = KL_ESTIMATORS.get(name)(logp[None], ref.log()[None])[0]
    (g,) = torch.autograd.grad((logp.exp().detach() * per_token).sum(), z)
    return g


@pytest.mark.parametrize("name, target", [("k1", "zero"), ("k2", "kl(pi||ref)"), ("k3", "kl(ref||pi)"),
                                          ("k3_st", "kl(pi||ref)")])
def test_expected_gradient_as_a_loss(name, target):
    # Tokens from pi_theta = softmax(z). E_pi[grad logp] = 0, so:
    #   k1: E[grad logp] = 0;  k2, k3_st: E[(logp - ref) grad logp] = grad KL(pi || ref);
    #   k3: E[(1 - ref/pi) grad logp] = -E_ref[grad logp] = grad KL(ref || pi).
    z = torch.tensor([0.3, -1.2, 0.8, 0.0], dtype=D, requires_grad=True)
    ref = torch.tensor([0.1, 0.4, 0.2, 0.3], dtype=D)
    pi = torch.softmax(z, -1)
    exact = {"zero": torch.zeros((), dtype=D, requires_grad=True) * z.sum(),
             "kl(pi||ref)": kl_categorical(pi, ref), "kl(ref||pi)": kl_categorical(ref, pi)}[target]
    (want,) = torch.autograd.grad(exact, z, retain_graph=True)
    got = _expected_gradient(name, z, ref)
    assert torch.allclose(got, want, atol=1e-12), (got, want)
    if target != "zero":
        assert want.abs().sum() > 0.1  # the two KL directions really differ here:
        other = kl_categorical(ref, pi) if target == "kl(pi||ref)" else kl_categorical(pi, ref)
        assert not torch.allclose(got, torch.autograd.grad(other, z)[0], atol=1e-3)


def _sgd_towards_reference(name, steps=150, lr=4.0, n=4, t=3, v=6, seed=0):
    """Zero advantages + kl_coef 1: SGD on logits [n, t, v] with tokens sampled from pi each step.
    Returns (exact KL(pi || ref) summed over positions before, after)."""
    g = torch.Generator().manual_seed(seed)
    logits = (2 * torch.randn(n, t, v, generator=g, dtype=D)).requires_grad_(True)
    ref = torch.softmax(torch.randn(n, t, v, generator=g, dtype=D), -1)
    mask = torch.ones(n, t)
    opt = torch.optim.SGD([logits], lr=lr)

    def exact():
        with torch.no_grad():
            return kl_categorical(torch.softmax(logits, -1), ref).sum().item()

    before = exact()
    for _ in range(steps):
        with torch.no_grad():
            y = torch.multinomial(torch.softmax(logits, -1).reshape(-1, v), 1, generator=g).reshape(n, t, 1)
        logp = torch.log_softmax(logits, -1).gather(-1, y)[..., 0]
        per_token, _ = POLICY_LOSSES.get("grpo")(logp, logp.detach(), torch.zeros(n, dtype=D), mask)
        kl = KL_ESTIMATORS.get(name)(logp, ref.log().gather(-1, y)[..., 0])
        loss = AGGREGATIONS.get("seq_mean_token_mean")(per_token + 1.0 * kl, mask)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return before, exact()


@pytest.mark.parametrize("name", ["k3_st", "k2"])
def test_kl_loss_term_moves_pi_towards_reference(name):
    # Same seed, same samples: k2 and k3_st have the same gradient, so the same trajectory.
    # Measured (seed 0): KL 15.38 -> 1.71 in 150 steps.
    before, after = _sgd_towards_reference(name)
    assert after < 0.15 * before, (before, after)


def test_k1_loss_term_does_not_move_pi_towards_reference():
    # k1's expected gradient is 0 (test_expected_gradient_as_a_loss): SGD is a random walk.
    # Measured (seed 0): KL 15.38 -> 21.99, i.e. it moved AWAY from the reference.
    before, after = _sgd_towards_reference("k1")
    assert after > 0.9 * before, (before, after)


def test_k3_regression_fp32_log_ratio_119_is_finite():
    # logp = -119, ref_logp = 0: log r = 119, exp(119) = inf in fp32 (the unclamped k3 returned inf).
    # Clamped at 10: k3 = e^10 - 1 - 10 = 22015.465795; beyond the bound the gradient is 0.
    logp = torch.tensor([[-119.0]], requires_grad=True)
    kl = kl_k3(logp, torch.zeros(1, 1))
    (g,) = torch.autograd.grad(kl.sum(), logp)
    assert KL_LOG_RATIO_BOUND == 10.0
    assert kl.item() == pytest.approx(math.exp(10) - 11, rel=1e-6)
    assert g.item() == 0.0


def test_estimators_at_the_bound_hand_numbers():
    # log r = ref - logp = -15 -> clamped to -10: k1 = 10, k2 = 50, k3 = e^-10 - 1 + 10 = 9.0000454
    # log r = 9.5 (inside): k3 = e^9.5 - 10.5 = 13349.2264, grad 1 - e^9.5 = -13358.7264 (finite, bounded)
    logp = torch.tensor([[15.0, -9.5]], dtype=D, requires_grad=True)
    ref = torch.zeros(1, 2, dtype=D)
    assert KL_ESTIMATORS.get("k1")(logp, ref)[0, 0].item() == pytest.approx(10.0)
    assert KL_ESTIMATORS.get("k2")(logp, ref)[0, 0].item() == pytest.approx(50.0)
    k3 = KL_ESTIMATORS.get("k3")(logp, ref)
    assert k3[0].tolist() == pytest.approx([math.exp(-10) + 9, math.exp(9.5) - 10.5])
    (g,) = torch.autograd.grad(k3.sum(), logp)
    assert g[0].tolist() == pytest.approx([0.0, 1 - math.exp(9.5)])


@pytest.mark.parametrize("name", ["k1", "k3"])
def test_unbiased_estimators_average_to_exact_kl(name):
    # Tokens drawn from pi_theta = [.5, .5]; pi_ref = [.25, .75]. E_pi[k1] = KL(pi||ref) by definition,
    # E_pi[k3] = sum_k pi_k (ref_k/pi_k - 1 - log(ref_k/pi_k)) = (1 - 1) + KL = KL = 0.143841.
    logp = torch.tensor([[LOG(0.5), LOG(0.5)]], dtype=torch.float64)
    ref = torch.tensor([[LOG(0.25), LOG(0.75)]], dtype=torch.float64)
    per_token = KL_ESTIMATORS.get(name)(logp, ref)
    expectation = (torch.tensor([0.5, 0.5], dtype=torch.float64) * per_token[0]).sum()
    assert expectation.item() == pytest.approx(kl_categorical([0.5, 0.5], [0.25, 0.75]).item(), abs=1e-12)


def test_kl_penalized_rewards_reward_form():
    # r - beta * sum_t kl over real tokens: row 0: 1 - .5 * (.1 + .2) = .85 (the 9 is padding);
    # row 1: 0 - .5 * .3 = -.15. The penalty carries no gradient.
    rewards = torch.tensor([1.0, 0.0], dtype=torch.float64)
    kl = torch.tensor([[0.1, 0.2, 9.0], [0.3, 0.0, 0.0]], dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    out = kl_penalized_rewards(rewards, kl, mask, beta=0.5)
    assert out.tolist() == pytest.approx([0.85, -0.15])
    assert not out.requires_grad


def test_add_kl_term_loss_form():
    # per-token loss + beta * kl: [1, 2] + .1 * [.5, 1] = [1.05, 2.1]
    out = add_kl_term(torch.tensor([[1.0, 2.0]]), torch.tensor([[0.5, 1.0]]), beta=0.1)
    assert out.tolist()[0] == pytest.approx([1.05, 2.1])
