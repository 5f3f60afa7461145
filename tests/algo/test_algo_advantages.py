"""Advantage estimators: hand-derived numbers, NaN handling, hypothesis properties."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from grouprl.algo import ZERO_STD_TOL, compute_gae, compute_grpo_advantages, zero_std_groups
from grouprl.registry import ADVANTAGES

grpo = ADVANTAGES.get("grpo")
dr_grpo = ADVANTAGES.get("dr_grpo")
rloo = ADVANTAGES.get("rloo")


def t(rows):
    return torch.tensor(rows, dtype=torch.float64)


def test_grpo_population_std_example():
    # [1,3,2,6]: mean 3, deviations [-2,0,-1,3], sum of squares 14, population var 14/4 = 3.5,
    # std 1.870829 -> adv = [-2, 0, -1, 3] / 1.870829 = [-1.069045, 0, -0.534522, 1.603567]
    adv = grpo(t([[1, 3, 2, 6]]))
    assert adv.tolist()[0] == pytest.approx([-1.069045, 0.0, -0.534522, 1.603567], abs=1e-6)


def test_grpo_unbiased_std():
    # unbiased var 14/3 = 4.666667, std 2.160247 -> [-0.925820, 0, -0.462910, 1.388730]
    adv = grpo(t([[1, 3, 2, 6]]), std="unbiased")
    assert adv.tolist()[0] == pytest.approx([-0.925820, 0.0, -0.462910, 1.388730], abs=1e-6)


def test_grpo_binary_five_of_eight_example():
    # 5 correct of 8: mean 5/8, population std sqrt(5/8 * 3/8) = sqrt(15)/8 = 0.484123.
    # correct: (3/8)/(sqrt15/8) = 3/sqrt15 = 0.774597; wrong: -5/sqrt15 = -1.290994.
    # (+0.667 / -1.333, sometimes quoted for this case, is wrong.)
    adv = grpo(t([[1, 0, 1, 1, 0, 1, 0, 1]]))[0]
    assert adv[0].item() == pytest.approx(3 / math.sqrt(15), abs=1e-6)
    assert adv[1].item() == pytest.approx(-5 / math.sqrt(15), abs=1e-6)


def test_grpo_flat_group_is_exactly_zero_per_group():
    # row 0 flat -> exactly 0 (not 0/eps noise); row 1 std 1e-10 < eps -> exactly 0; row 2 normal: [-1, 1]
    adv = grpo(t([[2, 2], [1, 1 + 2e-10], [0, 2]]))
    assert adv[0].tolist() == [0.0, 0.0]
    assert adv[1].tolist() == [0.0, 0.0]
    assert adv[2].tolist() == pytest.approx([-1.0, 1.0], abs=1e-7)


def test_grpo_nan_rewards_are_left_out_and_get_zero():
    # row 0: valid [1, 3] -> mean 2, population std 1 -> [-1, 0, 1]
    # row 1: only one valid reward -> std 0 -> all 0; row 2: all NaN -> all 0
    nan = float("nan")
    adv = grpo(t([[1, nan, 3], [nan, 5, nan], [nan, nan, nan]]))
    assert adv[0].tolist() == pytest.approx([-1.0, 0.0, 1.0], abs=1e-7)
    assert adv[1].tolist() == [0.0, 0.0, 0.0]
    assert adv[2].tolist() == [0.0, 0.0, 0.0]


def test_grpo_batch_scale():
    # group means 0.5 and 1.5 -> centred [-0.5, 0.5], [-1.5, 1.5]; std of the whole batch [0,1,0,3]:
    # mean 1, population var (1+0+1+4)/4 = 1.5, std 1.224745 -> [-0.408248, 0.408248, -1.224745, 1.224745]
    adv = grpo(t([[0, 1], [0, 3]]), scale="batch")
    assert adv.flatten().tolist() == pytest.approx([-0.408248, 0.408248, -1.224745, 1.224745], abs=1e-6)
    # scale="none" is mean-centring only
    assert grpo(t([[0, 1], [0, 3]]), scale="none").flatten().tolist() == [-0.5, 0.5, -1.5, 1.5]


def test_grpo_rejects_unknown_options():
    with pytest.raises(ValueError, match="std="):
        grpo(t([[1, 2]]), std="sample")
    with pytest.raises(ValueError, match="scale="):
        grpo(t([[1, 2]]), scale="global")
    with pytest.raises(ValueError, match=r"\[B, G\]"):
        grpo(t([1, 2]))


def test_dr_grpo_mean_centred():
    # [1,3,2,6] - 3 = [-2, 0, -1, 3]; NaN -> 0 and left out: [1, nan, 5] - 3 = [-2, 0, 2]
    assert dr_grpo(t([[1, 3, 2, 6]])).tolist()[0] == [-2.0, 0.0, -1.0, 3.0]
    assert dr_grpo(t([[1, float("nan"), 5]])).tolist()[0] == [-2.0, 0.0, 2.0]


def test_rloo_leave_one_out():
    # baselines: 1 -> (3+2+6)/3 = 11/3, 3 -> 9/3, 2 -> 10/3, 6 -> 6/3
    # adv = [1-11/3, 0, 2-10/3, 6-2] = [-2.666667, 0, -1.333333, 4]
    assert rloo(t([[1, 3, 2, 6]])).tolist()[0] == pytest.approx([-8 / 3, 0.0, -4 / 3, 4.0], abs=1e-9)
    # with a NaN: valid [1, 3, 5]: 1 - 4 = -3, 3 - 3 = 0, 5 - 2 = 3; NaN -> 0; single valid -> 0
    nan = float("nan")
    adv = rloo(t([[1, nan, 3, 5], [nan, 7, nan, nan]]))
    assert adv[0].tolist() == pytest.approx([-3.0, 0.0, 0.0, 3.0], abs=1e-9)
    assert adv[1].tolist() == [0.0, 0.0, 0.0, 0.0]


def test_gae_hand_numbers():
    # T=3, r=[0,0,1], V=[0.5,0.6,0.7], gamma=1, lam=0.5:
    # t2: delta = 1 - 0.7 = 0.3 -> A2 = 0.3
    # t1: delta = 0.7 - 0.6 = 0.1 -> A1 = 0.1 + 0.5*0.3 = 0.25
    # t0: delta = 0.6 - 0.5 = 0.1 -> A0 = 0.1 + 0.5*0.25 = 0.225; returns = A + V = [0.725, 0.85, 1.0]
    # row 1 is padded after 2 tokens (garbage 5 / 9 at the pad must be ignored):
    # t1: delta = 1 - 0.6 = 0.4 -> A1 = 0.4; t0: delta = 0.6 - 0.5 = 0.1 -> A0 = 0.1 + 0.5*0.4 = 0.3
    rewards = t([[0, 0, 1], [0, 1, 5]])
    values = t([[0.5, 0.6, 0.7], [0.5, 0.6, 9.0]])
    mask = t([[1, 1, 1], [1, 1, 0]])
    adv, ret = compute_gae(rewards, values, mask, gamma=1.0, lam=0.5)
    assert adv.tolist()[0] == pytest.approx([0.225, 0.25, 0.3])
    assert adv.tolist()[1] == pytest.approx([0.3, 0.4, 0.0])
    assert ret.tolist()[0] == pytest.approx([0.725, 0.85, 1.0])
    assert ret.tolist()[1] == pytest.approx([0.8, 1.0, 0.0])


def test_gae_lambda_one_is_discounted_return_minus_value():
    # lam=1, gamma=0.9: A_t = sum_k 0.9^k r_{t+k} - V_t: [0.81-0.5, 0.9-0.6, 1-0.7] = [0.31, 0.3, 0.3]
    adv, _ = compute_gae(t([[0, 0, 1]]), t([[0.5, 0.6, 0.7]]), t([[1, 1, 1]]), gamma=0.9, lam=1.0)
    assert adv.tolist()[0] == pytest.approx([0.31, 0.3, 0.3])


def test_compute_grpo_advantages_one_group():
    assert compute_grpo_advantages([1, 3, 2, 6]) == pytest.approx([-1.069045, 0.0, -0.534522, 1.603567], abs=1e-6)
    assert compute_grpo_advantages([0.5, 0.5, 0.5]) == [0.0, 0.0, 0.0]
    assert compute_grpo_advantages([1, None, 3]) == pytest.approx([-1.0, 0.0, 1.0], abs=1e-7)
    assert compute_grpo_advantages([]) == []


def test_compute_grpo_advantages_from_a_fresh_interpreter():
    # The "Done when" command, run exactly as a user would.
    cmd = "from grouprl.algo import compute_grpo_advantages as f; print(f([1,3,2,6]))"
    out = subprocess.run([sys.executable, "-c", cmd], capture_output=True, text=True, check=True).stdout
    values = [float(v) for v in out.strip().strip("[]").split(",")]
    assert values == pytest.approx([-1.069045, 0.0, -0.534522, 1.603567], abs=1e-6)


# ---- properties (hypothesis) ----------------------------------------------------------------------

groups = st.lists(st.floats(-100, 100, allow_nan=False), min_size=2, max_size=16)


@settings(max_examples=60, deadline=None)
@given(groups)
def test_property_group_advantages_sum_to_zero(rewards):
    r = t([rewards])
    for name in ADVANTAGES.names():
        assert ADVANTAGES.get(name)(r).sum().item() == pytest.approx(0.0, abs=1e-6), name


@settings(max_examples=60, deadline=None)
@given(groups)
def test_property_unit_variance_when_std_above_eps(rewards):
    r = t([rewards])
    sigma = r.std(unbiased=False).item()
    assume(sigma > 1e-3)
    adv = grpo(r)
    # exactly (sigma / (sigma + eps))^2 = 1 - O(eps / sigma)
    assert adv.var(unbiased=False).item() == pytest.approx(1.0, rel=1e-4)
    assert grpo(r, std="unbiased").var(unbiased=True).item() == pytest.approx(1.0, rel=1e-4)


@settings(max_examples=60, deadline=None)
@given(groups, st.floats(-1000, 1000), st.floats(0.1, 100))
def test_property_invariant_to_shift_and_positive_scale(rewards, shift, scale):
    r = t([rewards])
    assume(r.std(unbiased=False).item() > 0.1)
    base = grpo(r)
    assert torch.allclose(grpo(r + shift), base, atol=1e-5)
    assert torch.allclose(grpo(r * scale), base, atol=1e-5)


def _numpy_listing_advantages(rewards, eps=1e-8):
    """The usual numpy compute_grpo_advantages listing (population std, zero below eps), transcribed."""
    import numpy as np

    rewards = np.array(rewards, dtype=np.float64)
    mu, sigma = rewards.mean(), rewards.std()
    if sigma < eps:
        return [0.0] * len(rewards)
    return ((rewards - mu) / (sigma + eps)).tolist()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-100, 100, allow_nan=False), min_size=1, max_size=16))
def test_property_list_api_equals_the_numpy_listing(rewards):
    assert compute_grpo_advantages(rewards) == pytest.approx(_numpy_listing_advantages(rewards), abs=1e-9)


# ---- zero-std groups (dynamic sampling) ------------------------------------------------------------


def test_zero_std_groups_hand_cases():
    # [1,1,1] flat; [0,1,1] std sqrt(2/9) = .471; [nan,1,nan] one valid -> no baseline; [nan,nan,nan] none;
    # [nan,0,1] valid [0,1] std .5; [2, 2 + 1e-9, 2] population std 4.7e-10 < 1e-8 -> zero-std
    nan = float("nan")
    rewards = t([[1, 1, 1], [0, 1, 1], [nan, 1, nan], [nan, nan, nan], [nan, 0, 1], [2, 2 + 1e-9, 2]])
    assert zero_std_groups(rewards).tolist() == [True, False, True, True, False, True]
    assert ZERO_STD_TOL == 1e-8


@pytest.mark.parametrize("std", ["population", "unbiased"])
def test_zero_std_groups_agree_with_grpo_at_the_tolerance(std):
    # Spreads straddling the tolerance: population std of [0, d] is d/2, unbiased d/sqrt2. A group is
    # reported zero-std exactly when grpo gives it all-zero advantages.
    ds = [0.0, 1e-9, 1.9e-8, 2e-8, 2.1e-8, 1.5e-8, 1e-7, 1.0]
    rewards = t([[0.0, d] for d in ds])
    flat = zero_std_groups(rewards, std=std)
    adv = grpo(rewards, std=std)
    assert flat.tolist() == (adv == 0).all(-1).tolist()
    assert 0 < int(flat.sum()) < len(ds)  # both outcomes exercised
    assert zero_std_groups(rewards, eps=1e-6, std=std).tolist() == (grpo(rewards, eps=1e-6, std=std) == 0).all(-1).tolist()


def test_zero_std_groups_rejects_bad_input():
    with pytest.raises(ValueError, match="std="):
        zero_std_groups(t([[0, 1]]), std="sample")
    with pytest.raises(ValueError, match=r"\[B, G\]"):
        zero_std_groups(t([0, 1]))


def test_nan_rewards_hand_numbers_every_estimator():
    # group [0, nan, 1, 1]: valid [0, 1, 1], mean 2/3, population std sqrt(2/9) = .471405
    #   grpo:    [-2/3, 0, 1/3, 1/3] / .471405 = [-1.414214, 0, .707107, .707107]
    #   dr_grpo: [-.666667, 0, .333333, .333333]
    #   rloo:    n = 3 -> 3/2 * (r - mean) = [-1, 0, .5, .5]
    # group [nan, nan, nan, nan]: all 0 for every estimator
    nan = float("nan")
    rewards = t([[0, nan, 1, 1], [nan, nan, nan, nan]])
    assert grpo(rewards)[0].tolist() == pytest.approx([-1.414214, 0, 0.707107, 0.707107], abs=1e-6)
    assert dr_grpo(rewards)[0].tolist() == pytest.approx([-2 / 3, 0, 1 / 3, 1 / 3], abs=1e-12)
    assert rloo(rewards)[0].tolist() == pytest.approx([-1.0, 0.0, 0.5, 0.5], abs=1e-12)
    for fn in (grpo, dr_grpo, rloo):
        assert fn(rewards)[1].tolist() == [0.0] * 4
    assert grpo(rewards, scale="batch")[1].tolist() == [0.0] * 4
