"""compute_gae (Schulman et al. 2015, arXiv 1506.02438, Eq. 16) on masked, ragged sequences, by hand.

delta_t = r_t + gamma * V_next - V_t,  A_t = delta_t + gamma * lam * A_next, where "next" is the next
position whose mask is 1 (masked positions inside a sequence -- tool output -- are skipped, padding at the
end counts as the terminal state: V = A = 0). Returns R_t = A_t + V_t; both 0 where mask = 0.
"""

from __future__ import annotations

import pytest
import torch

from grouprl.algo import compute_gae


def t(rows):
    return torch.tensor(rows, dtype=torch.float64)


def test_gae_ragged_batch_with_padding_gamma_and_lambda():
    # gamma = 0.9, lam = 0.8 -> gamma * lam = 0.72.
    # row 0, 4 real tokens: r = [0, 0, 0, 1], V = [0.2, 0.4, 0.5, 0.6]
    #   t3: delta = 1 + 0.9*0 - 0.6 = 0.4                     A3 = 0.4
    #   t2: delta = 0 + 0.9*0.6 - 0.5 = 0.04                  A2 = 0.04 + 0.72*0.4    = 0.328
    #   t1: delta = 0 + 0.9*0.5 - 0.4 = 0.05                  A1 = 0.05 + 0.72*0.328  = 0.28616
    #   t0: delta = 0 + 0.9*0.4 - 0.2 = 0.16                  A0 = 0.16 + 0.72*0.28616 = 0.3660352
    #   R = A + V = [0.5660352, 0.68616, 0.828, 1.0]
    # row 1, 2 real tokens then padding holding garbage (r = 7, V = -3 must be ignored): r = [0, 0.5], V = [0.1, 0.3]
    #   t1: delta = 0.5 - 0.3 = 0.2                           A1 = 0.2
    #   t0: delta = 0.9*0.3 - 0.1 = 0.17                      A0 = 0.17 + 0.72*0.2 = 0.314
    #   R = [0.414, 0.5, 0, 0]
    # row 2, one real token: r = [-1], V = [0.5]: A0 = -1.5, R0 = -1.0
    rewards = t([[0, 0, 0, 1], [0, 0.5, 7, 7], [-1, 7, 7, 7]])
    values = t([[0.2, 0.4, 0.5, 0.6], [0.1, 0.3, -3, -3], [0.5, -3, -3, -3]])
    mask = t([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]])
    adv, ret = compute_gae(rewards, values, mask, gamma=0.9, lam=0.8)
    assert adv.tolist()[0] == pytest.approx([0.3660352, 0.28616, 0.328, 0.4], abs=1e-12)
    assert adv.tolist()[1] == pytest.approx([0.314, 0.2, 0.0, 0.0], abs=1e-12)
    assert adv.tolist()[2] == pytest.approx([-1.5, 0.0, 0.0, 0.0], abs=1e-12)
    assert ret.tolist()[0] == pytest.approx([0.5660352, 0.68616, 0.828, 1.0], abs=1e-12)
    assert ret.tolist()[1] == pytest.approx([0.414, 0.5, 0.0, 0.0], abs=1e-12)
    assert ret.tolist()[2] == pytest.approx([-1.0, 0.0, 0.0, 0.0], abs=1e-12)


def test_gae_skips_masked_positions_inside_a_sequence():
    # A multi-turn completion: model tokens t0, t1, tool output t2, t3 (mask 0), model token t4 (last).
    # gamma = 1, lam = 0.5. r = [0, 0, 9, 9, 1] (rewards on masked tool tokens are ignored),
    # V = [0.2, 0.3, 8, 8, 0.6] (the tool tokens' values are ignored too).
    #   t4: delta = 1 - 0.6 = 0.4                             A4 = 0.4
    #   t1: next real token is t4: delta = 0 + 0.6 - 0.3 = 0.3   A1 = 0.3 + 0.5*0.4 = 0.5
    #   t0: delta = 0 + 0.3 - 0.2 = 0.1                       A0 = 0.1 + 0.5*0.5 = 0.35
    #   R = [0.55, 0.8, 0, 0, 1.0]
    adv, ret = compute_gae(t([[0, 0, 9, 9, 1]]), t([[0.2, 0.3, 8, 8, 0.6]]), t([[1, 1, 0, 0, 1]]),
                           gamma=1.0, lam=0.5)
    assert adv.tolist()[0] == pytest.approx([0.35, 0.5, 0.0, 0.0, 0.4], abs=1e-12)
    assert ret.tolist()[0] == pytest.approx([0.55, 0.8, 0.0, 0.0, 1.0], abs=1e-12)


def test_gae_lambda_zero_is_one_step_td_and_lambda_one_is_monte_carlo():
    # r = [0, 0.5, 1], V = [1, 2, 4], gamma = 0.5.
    # lam = 0: A_t = delta_t = r_t + 0.5 V_{t+1} - V_t = [0 + 1 - 1, 0.5 + 2 - 2, 1 + 0 - 4] = [0, 0.5, -3]
    # lam = 1: A_t = sum_k 0.5^k r_{t+k} - V_t: G = [0.25*1 + 0.5*0.5, 0.5 + 0.5*1, 1] = [0.5, 1.0, 1.0]
    #          A = [0.5 - 1, 1 - 2, 1 - 4] = [-0.5, -1, -3]; R = G = [0.5, 1, 1]
    r, v, m = t([[0, 0.5, 1]]), t([[1, 2, 4]]), t([[1, 1, 1]])
    assert compute_gae(r, v, m, gamma=0.5, lam=0.0)[0].tolist()[0] == pytest.approx([0.0, 0.5, -3.0])
    adv, ret = compute_gae(r, v, m, gamma=0.5, lam=1.0)
    assert adv.tolist()[0] == pytest.approx([-0.5, -1.0, -3.0])
    assert ret.tolist()[0] == pytest.approx([0.5, 1.0, 1.0])


def test_gae_carries_no_gradient():
    values = torch.tensor([[0.1, 0.2]], requires_grad=True)
    adv, ret = compute_gae(torch.tensor([[0.0, 1.0]]), values, torch.ones(1, 2))
    assert not adv.requires_grad and not ret.requires_grad
