"""grouprl.algo.correction: truncated importance sampling and sequence masking, with hand-computed numbers."""

from __future__ import annotations

import math

import pytest
import torch

from grouprl.algo.correction import CORRECTIONS, sequence_mask, tis

OLD = torch.zeros(2, 3)
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])


@pytest.mark.parametrize("name", sorted(CORRECTIONS))
def test_identity_when_the_engine_agrees_with_the_trainer(name):
    old = torch.randn(3, 5)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [0, 0, 0, 0, 0]])
    weight, m = CORRECTIONS[name](old, old.clone(), mask)
    assert torch.equal(weight, torch.ones(3, 5))
    assert float(m["logp_abs_diff"]) == 0.0 and float(m["is_weight_mean"]) == 1.0
    assert float(m["is_weight_max"]) == 1.0 and float(m["masked_frac"]) == 0.0


def test_tis_truncates_at_the_cap_by_hand():
    # old - rollout = [[0.1, 1.0, -0.5], [0.5, 0.0, pad]]
    rollout = torch.tensor([[-0.1, -1.0, 0.5], [-0.5, 0.0, 123.0]])
    weight, m = tis(OLD, rollout, MASK, cap=2.0)
    expected = [[math.exp(0.1), 2.0, math.exp(-0.5)], [math.exp(0.5), 1.0, 1.0]]  # e^1 = 2.718 -> 2
    assert torch.allclose(weight, torch.tensor(expected), atol=1e-6)
    assert float(m["logp_abs_diff"]) == pytest.approx((0.1 + 1.0 + 0.5 + 0.5 + 0.0) / 5, abs=1e-6)
    mean = (math.exp(0.1) + 2.0 + math.exp(-0.5) + math.exp(0.5) + 1.0) / 5  # 1.272084
    assert float(m["is_weight_mean"]) == pytest.approx(mean, abs=1e-6)
    assert float(m["is_weight_max"]) == 2.0 and float(m["masked_frac"]) == 0.0


def test_tis_cap_is_a_setting():
    weight, _ = tis(torch.zeros(1, 2), torch.tensor([[-1.0, -3.0]]), torch.ones(1, 2), cap=5.0)
    assert torch.allclose(weight, torch.tensor([[math.e, 5.0]]), atol=1e-6)  # e^3 = 20.1 -> 5


def test_sequence_mask_drops_sequences_outside_the_band_by_hand():
    old = torch.zeros(3, 3)
    rollout = torch.tensor([[-0.1, -1.0, 0.5],   # mean(old - rollout) = 0.2 -> e^0.2 = 1.221 > 1.1: masked
                            [-0.1, 0.0, 9.0],    # (0.1 + 0) / 2 = 0.05 -> 1.051: kept (pad ignored)
                            [0.3, 0.1, 0.0]])    # -0.4 / 3 -> e^-0.1333 = 0.875 < 0.9: masked
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 1]])
    weight, m = sequence_mask(old, rollout, mask, band=(0.9, 1.1))
    assert weight.tolist() == [[0.0, 0.0, 0.0], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]
    assert float(m["masked_frac"]) == pytest.approx(6 / 8)  # 6 of the 8 real tokens
    assert float(m["is_weight_mean"]) == pytest.approx(2 / 8) and float(m["is_weight_max"]) == 1.0
    assert float(m["logp_abs_diff"]) == pytest.approx((0.1 + 1.0 + 0.5 + 0.1 + 0.0 + 0.3 + 0.1 + 0.0) / 8)


def test_band_edges_are_kept():
    # ratios exactly e^0.1 and e^-0.1 with band = (e^-0.1, e^0.1): inside (closed interval)
    old, rollout = torch.zeros(2, 1), torch.tensor([[-0.1], [0.1]])
    weight, _ = sequence_mask(old, rollout, torch.ones(2, 1), band=(math.exp(-0.1) - 1e-7, math.exp(0.1) + 1e-7))
    assert weight.tolist() == [[1.0], [1.0]]


def test_padding_garbage_and_nan_give_finite_weights():
    old = torch.tensor([[0.0, float("-inf")], [0.0, 0.0]])
    rollout = torch.tensor([[float("-inf"), float("nan")], [float("nan"), 0.0]])
    mask = torch.tensor([[1, 0], [1, 1]])
    for fn in CORRECTIONS.values():
        weight, m = fn(old, rollout, mask)
        assert torch.isfinite(weight).all() and all(torch.isfinite(v) for v in m.values())
    weight, _ = tis(old, rollout, mask, cap=2.0)
    assert weight.tolist() == [[2.0, 1.0], [1.0, 1.0]]  # -inf rollout: clamped ratio e^20 -> cap; NaN: 1


def test_weights_are_detached():
    old = torch.zeros(1, 2, requires_grad=True)
    for fn in CORRECTIONS.values():
        weight, _ = fn(old * 1.0, torch.tensor([[-0.2, 0.3]]), torch.ones(1, 2))
        assert not weight.requires_grad


def test_empty_batch_and_empty_rows():
    for fn in CORRECTIONS.values():
        weight, m = fn(torch.zeros(0, 3), torch.zeros(0, 3), torch.zeros(0, 3))
        assert weight.shape == (0, 3) and float(m["is_weight_max"]) == 1.0
    weight, _ = sequence_mask(torch.zeros(1, 2), torch.tensor([[5.0, 5.0]]), torch.zeros(1, 2))
    assert weight.tolist() == [[1.0, 1.0]]  # no real token: nothing to mask


def test_bad_arguments_name_the_problem():
    with pytest.raises(ValueError, match="cap must be > 0"):
        tis(OLD, OLD, MASK, cap=0.0)
    with pytest.raises(ValueError, match="0 < low <= 1 <= high"):
        sequence_mask(OLD, OLD, MASK, band=(1.2, 2.0))
    with pytest.raises(ValueError, match=r"must all be \[N, T\]"):
        tis(OLD, torch.zeros(2, 2), MASK)
