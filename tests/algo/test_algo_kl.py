"""KL estimators and exact categorical KL: hand-derived numbers."""

from __future__ import annotations

import math

import pytest
import torch

from grouprl.algo import add_kl_term, kl_categorical, kl_penalized_rewards
from grouprl.registry import KL_ESTIMATORS

LOG = math.log


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
