"""MT-GRPO turn-level advantages (arXiv 2505.11821) against hand-computed numbers."""

from __future__ import annotations

import math

import pytest
import torch

from grouprl.algo.turns import mt_grpo_advantages, turn_token_advantages
from grouprl.registry import ADVANTAGES

D = torch.float64


def test_registered_and_without_turn_rewards_it_is_grpo():
    assert ADVANTAGES.get("mt_grpo") is mt_grpo_advantages
    r = torch.tensor([[1.0, 3.0, 2.0, 6.0]], dtype=D)
    # grpo's docstring example: mean 3, population std sqrt(14/4)
    assert mt_grpo_advantages(r)[0].tolist() == pytest.approx([-1.069045, 0.0, -0.534522, 1.603567], abs=1e-6)


def test_first_turn_mixes_turn_and_outcome_advantages_by_hand():
    outcome = torch.tensor([[1.0, 0.0, 0.0, 0.0]], dtype=D)
    turn = torch.tensor([[1.0, 1.0, 0.0, 0.0]], dtype=D)
    adv = mt_grpo_advantages(outcome, turn_rewards=turn)
    assert adv.shape == (1, 4, 2)
    # outcome: mean 1/4, std sqrt(3)/4 -> A^O = [sqrt(3), -1/sqrt(3) x3]; turn: mean 1/2, std 1/2 -> [1, 1, -1, -1]
    a_o = [math.sqrt(3), -1 / math.sqrt(3), -1 / math.sqrt(3), -1 / math.sqrt(3)]
    assert adv[0, :, 1].tolist() == pytest.approx(a_o, abs=1e-6)
    assert adv[0, :, 0].tolist() == pytest.approx([1 + a_o[0], 1 + a_o[1], -1 + a_o[2], -1 + a_o[3]], abs=1e-6)
    half = mt_grpo_advantages(outcome, turn_rewards=turn, turn_coef=0.5)  # lambda weighs the outcome part
    assert half[0, :, 0].tolist() == pytest.approx([1 + a_o[0] / 2, 1 + a_o[1] / 2, -1 + a_o[2] / 2,
                                                    -1 + a_o[3] / 2], abs=1e-6)
    assert adv[..., 0].sum().item() == pytest.approx(0.0, abs=1e-9)  # both parts are centred per group


def test_flat_parts_and_nan_turn_rewards():
    nan = float("nan")
    outcome = torch.tensor([[0.0, 0.0, 0.0], [1.0, 0.0, 1.0]], dtype=D)
    turn = torch.tensor([[1.0, 0.0, 0.0], [nan, 1.0, 1.0]], dtype=D)
    adv = mt_grpo_advantages(outcome, turn_rewards=turn)
    # group 0: outcome flat -> A^O = 0, A^T = (r - 1/3) / sqrt(2/9) = [sqrt(2), -1/sqrt(2), -1/sqrt(2)]
    assert adv[0, :, 1].tolist() == [0.0, 0.0, 0.0]
    assert adv[0, :, 0].tolist() == pytest.approx([math.sqrt(2), -1 / math.sqrt(2), -1 / math.sqrt(2)], abs=1e-6)
    # group 1: the two valid turn rewards agree -> A^T = 0; A^O = [1/sqrt(2), -sqrt(2), 1/sqrt(2)]
    a_o = [1 / math.sqrt(2), -math.sqrt(2), 1 / math.sqrt(2)]
    assert adv[1, :, 0].tolist() == pytest.approx(a_o, abs=1e-6) and adv[1, :, 1].tolist() == pytest.approx(a_o)


def test_bad_turn_reward_shape_is_one_clear_error():
    with pytest.raises(ValueError, match=r"turn_rewards must be \[B, G\]"):
        mt_grpo_advantages(torch.zeros(2, 4), turn_rewards=torch.zeros(2, 3))


def test_token_advantages_follow_the_turns_of_the_loss_mask():
    mask = torch.tensor([[1, 1, 0, 0, 1, 1, 0, 0],    # call, tool reply, answer, padding
                         [1, 1, 1, 0, 0, 0, 0, 0],    # answered at once: one turn
                         [1, 0, 1, 0, 1, 1, 0, 0],    # three model turns
                         [0, 0, 0, 0, 0, 0, 0, 0]])   # nothing trained
    turn_adv = torch.tensor([[2.0, -1.0], [0.5, 9.0], [3.0, 4.0], [7.0, 7.0]])
    assert turn_token_advantages(mask, turn_adv).tolist() == [
        [2.0, 2.0, 0.0, 0.0, -1.0, -1.0, 0.0, 0.0],
        [0.5, 0.5, 0.5, 0.0, 0.0, 0.0, 0.0, 0.0],
        [3.0, 0.0, 4.0, 0.0, 4.0, 4.0, 0.0, 0.0],
        [0.0] * 8]
    with pytest.raises(ValueError, match="turn_adv"):
        turn_token_advantages(mask, torch.zeros(4, 3))
