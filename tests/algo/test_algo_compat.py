"""The seeds' compute_grpo_loss / compute_gspo_loss: formula by default, listing as an option."""

from __future__ import annotations

import inspect
import math

import pytest
import torch

import grouprl
from grouprl.algo import compute_grpo_loss, compute_gspo_loss

LOG = math.log
D = torch.float64

# Two sequences of different length (1 and 3 real tokens), every token ratio 1.5:
#   seq 0: A = 1 -> per-token objective min(1.5, 1.2) = 1.2 -> loss -1.2 (1 token)
#   seq 1: A = -1 -> min(-1.5, -1.2) = -1.5 -> loss 1.5 on each of 3 tokens
# formula (per-sequence mean first): (-1.2 + 1.5) / 2 = .15
# seed listing (all tokens of the batch): (-1.2 + 3 * 1.5) / 4 = 3.3 / 4 = .825
LOGP = torch.full((2, 3), LOG(1.5), dtype=D)
OLD = torch.zeros(2, 3, dtype=D)
ADV = torch.tensor([1.0, -1.0], dtype=D)
MASK = torch.tensor([[1, 0, 0], [1, 1, 1]])


def test_seed_signatures_and_defaults():
    for fn, eps in ((compute_grpo_loss, 0.2), (compute_gspo_loss, 3e-4)):
        params = list(inspect.signature(fn).parameters.values())
        names = [p.name for p in params[:5]]
        assert names == ["per_token_logps", "old_per_token_logps", "advantages", "completion_mask", "clip_eps"]
        assert params[4].default == eps
    assert grouprl.compute_grpo_loss is compute_grpo_loss


def test_compute_grpo_loss_formula_default_and_listing_option():
    assert compute_grpo_loss(LOGP, OLD, ADV, MASK).item() == pytest.approx(0.15)
    assert compute_grpo_loss(LOGP, OLD, ADV, MASK, aggregation="token_mean").item() == pytest.approx(0.825)


def test_compute_gspo_loss_formula_default_and_listing_option():
    # sequence ratios are also 1.5 (mean log-ratio ln 1.5); with clip_eps .2 the numbers equal GRPO's.
    # default clip_eps 3e-4: seq 0 -> -1.0003 ; seq 1 -> -min(-1.5, -1.0003) = 1.5
    # formula: (-1.0003 + 1.5) / 2 = .24985; listing: (-1.0003 + 4.5) / 4 = .874925
    assert compute_gspo_loss(LOGP, OLD, ADV, MASK, clip_eps=0.2).item() == pytest.approx(0.15)
    assert compute_gspo_loss(LOGP, OLD, ADV, MASK).item() == pytest.approx(0.24985)
    assert compute_gspo_loss(LOGP, OLD, ADV, MASK, aggregation="token_mean").item() == pytest.approx(0.874925)


def test_compute_grpo_loss_with_kl_term():
    # beta .1, ref = log 1 = 0 everywhere, logp = ln 1.5: k3 = 1/1.5 - 1 + ln 1.5 = .072132 per token.
    # formula: .15 + .1 * .072132 = .157213
    ref = torch.zeros(2, 3, dtype=D)
    out = compute_grpo_loss(LOGP, OLD, ADV, MASK, beta=0.1, ref_per_token_logps=ref)
    assert out.item() == pytest.approx(0.15 + 0.1 * (1 / 1.5 - 1 + LOG(1.5)), abs=1e-9)
    with pytest.raises(ValueError, match="ref_per_token_logps"):
        compute_grpo_loss(LOGP, OLD, ADV, MASK, beta=0.1)
