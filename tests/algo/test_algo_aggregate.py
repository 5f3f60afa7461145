"""Aggregations: hand numbers, and micro-batch invariance of the accumulated gradient."""

from __future__ import annotations

import inspect

import pytest
import torch

from grouprl.algo import selective_log_softmax
from grouprl.registry import AGGREGATIONS, POLICY_LOSSES

D = torch.float64
PER_TOKEN = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dtype=D)
MASK = torch.tensor([[1, 1, 0], [1, 0, 0]])


def test_token_mean_hand_numbers():
    # real tokens 1, 2, 4: (1 + 2 + 4) / 3 = 2.333333; with the step's num_tokens = 7: 7 / 7 = 1
    agg = AGGREGATIONS.get("token_mean")
    assert agg(PER_TOKEN, MASK).item() == pytest.approx(7 / 3)
    assert agg(PER_TOKEN, MASK, num_tokens=7, num_seqs=99, max_len=99).item() == pytest.approx(1.0)


def test_seq_mean_token_mean_hand_numbers():
    # per-sequence means (1+2)/2 = 1.5 and 4/1 = 4 -> (1.5 + 4) / 2 = 2.75; num_seqs = 4 -> 5.5 / 4 = 1.375
    agg = AGGREGATIONS.get("seq_mean_token_mean")
    assert agg(PER_TOKEN, MASK).item() == pytest.approx(2.75)
    assert agg(PER_TOKEN, MASK, num_seqs=4, num_tokens=99, max_len=99).item() == pytest.approx(1.375)


def test_seq_mean_token_sum_norm_hand_numbers():
    # token sum 7 over N * T = 2 * 3 -> 1.166667; max_len 10 -> 7 / 20 = .35; plus num_seqs 4 -> 7 / 40
    agg = AGGREGATIONS.get("seq_mean_token_sum_norm")
    assert agg(PER_TOKEN, MASK).item() == pytest.approx(7 / 6)
    assert agg(PER_TOKEN, MASK, max_len=10).item() == pytest.approx(0.35)
    assert agg(PER_TOKEN, MASK, max_len=10, num_seqs=4, num_tokens=99).item() == pytest.approx(0.175)


def test_empty_sequences_add_nothing_and_are_not_counted():
    # Row 1 fully masked (e.g. a truncated completion under mask_truncated_completions):
    # token_mean: (1 + 2) / 2 = 1.5.
    # seq_mean_token_mean: only row 0 counts: its mean 1.5 / 1 sequence = 1.5 (was 1.5 / 2 = .75, diluted).
    # seq_mean_token_sum_norm: token sum 3 / (1 non-empty sequence * T = 3) = 1.0 (was 3 / 6 = .5).
    mask = torch.tensor([[1, 1, 0], [0, 0, 0]])
    assert AGGREGATIONS.get("token_mean")(PER_TOKEN, mask).item() == pytest.approx(1.5)
    assert AGGREGATIONS.get("seq_mean_token_mean")(PER_TOKEN, mask).item() == pytest.approx(1.5)
    assert AGGREGATIONS.get("seq_mean_token_sum_norm")(PER_TOKEN, mask).item() == pytest.approx(1.0)
    # an explicit num_seqs (the step's count of non-empty sequences) is used as given: 1.5 / 3 = .5
    assert AGGREGATIONS.get("seq_mean_token_mean")(PER_TOKEN, mask, num_seqs=3).item() == pytest.approx(0.5)


@pytest.mark.parametrize("name", AGGREGATIONS.names())
def test_all_sequences_empty_gives_zero_with_zero_gradient(name):
    per_token = PER_TOKEN.clone().requires_grad_(True)
    out = AGGREGATIONS.get(name)(per_token, torch.zeros(2, 3))
    (grad,) = torch.autograd.grad(out, per_token)
    assert out.item() == 0.0 and (grad == 0).all()


# ---- micro-batch invariance ------------------------------------------------------------------------

N, T, DIM, V = 8, 6, 5, 11
LENGTHS = [5, 3, 6, 1, 4, 6, 2, 5]


def _setup():
    torch.manual_seed(0)
    x = torch.randn(N, T, DIM, dtype=D)
    tokens = torch.randint(0, V, (N, T))
    mask = (torch.arange(T) < torch.tensor(LENGTHS).unsqueeze(-1)).long()
    adv = torch.randn(N, dtype=D)
    w0 = torch.randn(DIM, V, dtype=D)
    old_logp = selective_log_softmax(x @ w0, tokens) + 0.1 * torch.randn(N, T, dtype=D)
    return x, tokens, mask, adv, w0, old_logp


def _step_gradient(loss_name, agg_name, micro_batch):
    """Accumulated gradient over micro-batches of ``micro_batch`` sequences, each trimmed to its own
    longest sequence (as a collator would pad it), with the step's totals as normalisers."""
    x, tokens, mask, adv, w0, old_logp = _setup()
    w = w0.clone().requires_grad_(True)
    hp = {k: v for k, v in {"eps_low": 0.05, "eps_high": 0.08}.items()
          if k in inspect.signature(POLICY_LOSSES.get(loss_name)).parameters}  # a loss may take neither
    totals = {"num_tokens": int(mask.sum()), "num_seqs": N, "max_len": T}
    for start in range(0, N, micro_batch):
        rows = slice(start, start + micro_batch)
        width = int(mask[rows].sum(-1).max())
        logp = selective_log_softmax(x[rows, :width] @ w, tokens[rows, :width])
        per_token, _ = POLICY_LOSSES.get(loss_name)(logp, old_logp[rows, :width], adv[rows], mask[rows, :width], **hp)
        AGGREGATIONS.get(agg_name)(per_token, mask[rows, :width], **totals).backward()
    return w.grad


@pytest.mark.parametrize("loss_name", POLICY_LOSSES.names())
@pytest.mark.parametrize("agg_name", AGGREGATIONS.names())
def test_microbatch_accumulation_equals_full_batch(agg_name, loss_name):
    # 1 x 8 (full batch), 4 x 2 and 8 x 1 micro-batches must give the same step gradient.
    full = _step_gradient(loss_name, agg_name, micro_batch=8)
    assert full.abs().sum() > 0
    for micro_batch in (2, 1):
        assert torch.allclose(_step_gradient(loss_name, agg_name, micro_batch), full, atol=1e-12), micro_batch


def test_microbatch_without_step_totals_would_differ():
    # Why the normaliser is explicit: averaging each micro-batch by its own token count and then
    # averaging the micro-batches is NOT the full-batch token mean when lengths differ.
    x, tokens, mask, adv, w0, old_logp = _setup()
    w = w0.clone().requires_grad_(True)
    for start in range(0, N, 2):
        rows = slice(start, start + 2)
        logp = selective_log_softmax(x[rows] @ w, tokens[rows])
        per_token, _ = POLICY_LOSSES.get("grpo")(logp, old_logp[rows], adv[rows], mask[rows])
        (AGGREGATIONS.get("token_mean")(per_token, mask[rows]) / 4).backward()
    assert not torch.allclose(w.grad, _step_gradient("grpo", "token_mean", 8), atol=1e-6)
