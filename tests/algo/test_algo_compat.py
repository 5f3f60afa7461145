"""compute_grpo_loss / compute_gspo_loss: the papers' per-sequence mean by default, the all-token mean as an option."""

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
# all-token listing (all tokens of the batch): (-1.2 + 3 * 1.5) / 4 = 3.3 / 4 = .825
LOGP = torch.full((2, 3), LOG(1.5), dtype=D)
OLD = torch.zeros(2, 3, dtype=D)
ADV = torch.tensor([1.0, -1.0], dtype=D)
MASK = torch.tensor([[1, 0, 0], [1, 1, 1]])


def test_signatures_and_defaults():
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


def _all_token_listing_gspo(per_token_logps, old_per_token_logps, advantages, completion_mask, clip_eps=3e-4):
    """A common compute_gspo_loss listing, transcribed line by line (all-token mean at the end)."""
    per_token_log_ratio = per_token_logps - old_per_token_logps
    seq_log_ratio = (per_token_log_ratio * completion_mask).sum(dim=-1) / completion_mask.sum(dim=-1).clamp(min=1.0)
    rho_seq = torch.exp(seq_log_ratio)
    rho_clipped = torch.clamp(rho_seq, 1.0 - clip_eps, 1.0 + clip_eps)
    surr1 = rho_seq.unsqueeze(-1) * advantages.unsqueeze(-1)
    surr2 = rho_clipped.unsqueeze(-1) * advantages.unsqueeze(-1)
    token_loss = (-torch.min(surr1, surr2)).expand_as(per_token_logps)
    return (token_loss * completion_mask).sum() / completion_mask.sum()


def _all_token_listing_grpo(per_token_logps, old_per_token_logps, advantages, completion_mask, clip_eps=0.2):
    """A common compute_grpo_loss listing, transcribed line by line (all-token mean)."""
    per_token_ratio = torch.exp(per_token_logps - old_per_token_logps)
    per_token_clipped = torch.clamp(per_token_ratio, 1.0 - clip_eps, 1.0 + clip_eps)
    surr1 = per_token_ratio * advantages.unsqueeze(-1)
    surr2 = per_token_clipped * advantages.unsqueeze(-1)
    return (-torch.min(surr1, surr2) * completion_mask).sum() / completion_mask.sum()


@pytest.mark.parametrize("ours, listing, eps", [(compute_grpo_loss, _all_token_listing_grpo, 0.2),
                                                (compute_gspo_loss, _all_token_listing_gspo, 0.02)])
def test_token_mean_option_reproduces_the_all_token_listing_value_and_gradient(ours, listing, eps):
    torch.manual_seed(0)
    logp = (-torch.rand(6, 7, dtype=D) * 2).requires_grad_(True)
    old = (logp + 0.1 * torch.randn(6, 7, dtype=D)).detach()
    adv = torch.randn(6, dtype=D)
    mask = (torch.arange(7) < torch.tensor([7, 3, 1, 5, 2, 6]).unsqueeze(-1)).to(D)
    a = ours(logp, old, adv, mask, eps, aggregation="token_mean")
    b = listing(logp, old, adv, mask, eps)
    assert a.item() == pytest.approx(b.item(), abs=1e-12)
    (ga,) = torch.autograd.grad(a, logp)
    (gb,) = torch.autograd.grad(b, logp)
    assert torch.allclose(ga, gb, atol=1e-12)
    # ... while the default (the formula) differs whenever lengths differ
    assert ours(logp, old, adv, mask, eps).item() != pytest.approx(b.item(), abs=1e-6)
