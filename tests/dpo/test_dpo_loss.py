"""The DPO / IPO losses and metrics through the loop's own micro-batch path, on hand-computed numbers.

The reference log-probs are set relative to the policy's actual log-probs, so the margin h is known exactly:
pair 0: ref_chosen = logp_c - 2, ref_rejected = logp_r + 3  -> h = 2 - (-3) = 5
pair 1: ref_chosen = logp_c + 1, ref_rejected = logp_r - 1  -> h = -1 - 1 = -2
"""

from __future__ import annotations

import contextlib
import math

import pytest
import torch
from dpo_helpers import PAIRS, dpo_config, load_tiny

from grouprl.train.algorithms.dpo import pair_batch_loss, reference_logps, sequence_logps, tokenize_pairs


def _plain_logps(model, pair, average):
    """log pi(completion | prompt) by a full forward and log_softmax, one sequence at a time."""
    out = []
    for ids in (pair.chosen_ids, pair.rejected_ids):
        seq = torch.tensor([pair.prompt_ids + ids])
        logits = model(input_ids=seq).logits[0, len(pair.prompt_ids) - 1:-1].float()
        lp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids)[:, None]).squeeze(-1)
        out.append(float(lp.mean() if average else lp.sum()))
    return out


def _setup(tiny_model_dir, tmp_path, **kw):
    model, tok = load_tiny(tiny_model_dir)
    model.eval()  # no dropout: the same numbers on every forward
    cfg = dpo_config(tmp_path, **kw)
    pairs = tokenize_pairs(PAIRS[:2], tok, cfg)
    average = cfg.dpo_loss == "ipo"
    with torch.no_grad():
        (c0, r0), (c1, r1) = (_plain_logps(model, p, average) for p in pairs)
    pairs[0].ref_chosen, pairs[0].ref_rejected = c0 - 2.0, r0 + 3.0
    pairs[1].ref_chosen, pairs[1].ref_rejected = c1 + 1.0, r1 - 1.0
    return model, tok, cfg, pairs, (c0, r0, c1, r1)


def test_sigmoid_loss_and_metrics_on_a_hand_case(tiny_model_dir, tmp_path):
    model, tok, cfg, pairs, (c0, r0, c1, r1) = _setup(tiny_model_dir, tmp_path, dpo_beta=0.1)
    loss, sums = pair_batch_loss(model, pairs, 2, cfg, tok.pad_token_id)
    # -log sigmoid(0.1 * 5) = log(1 + e^-0.5) = 0.474077; -log sigmoid(0.1 * -2) = log(1 + e^0.2) = 0.798139
    assert float(loss.detach()) == pytest.approx((0.474077 + 0.798139) / 2, abs=1e-5)
    expected = {"rewards/chosen": (0.2 - 0.1) / 2,  # beta * (logp - ref): 0.1 * 2, 0.1 * -1
                "rewards/rejected": (-0.3 + 0.1) / 2,  # 0.1 * -3, 0.1 * 1
                "rewards/margins": (0.5 - 0.2) / 2,  # beta * h
                "rewards/accuracies": 0.5,  # pair 0 prefers chosen, pair 1 does not
                "logps/chosen": (c0 + c1) / 2, "logps/rejected": (r0 + r1) / 2}
    assert set(sums) == {"loss", *expected}
    for key, value in expected.items():
        assert float(sums[key]) == pytest.approx(value, abs=1e-4), key


def test_label_smoothing_is_cdpo(tiny_model_dir, tmp_path):
    model, tok, cfg, pairs, _ = _setup(tiny_model_dir, tmp_path, dpo_beta=0.1, dpo_label_smoothing=0.2)
    loss, _ = pair_batch_loss(model, pairs[:1], 1, cfg, tok.pad_token_id)
    # 0.8 * log(1 + e^-0.5) + 0.2 * log(1 + e^0.5) = 0.8 * 0.474077 + 0.2 * 0.974077
    assert float(loss.detach()) == pytest.approx(0.8 * 0.474077 + 0.2 * 0.974077, abs=1e-5)


def test_ipo_uses_token_mean_logps(tiny_model_dir, tmp_path):
    model, tok, cfg, pairs, _ = _setup(tiny_model_dir, tmp_path, dpo_loss="ipo", dpo_beta=0.25)
    loss, sums = pair_batch_loss(model, pairs, 2, cfg, tok.pad_token_id)
    # (h - 1 / (2 * 0.25))^2: (5 - 2)^2 = 9 and (-2 - 2)^2 = 16
    assert float(loss.detach()) == pytest.approx((9 + 16) / 2, abs=1e-3)
    assert float(sums["rewards/margins"]) == pytest.approx(0.25 * (5 - 2) / 2, abs=1e-4)


def test_step_normalisation_makes_micro_batches_add_up(tiny_model_dir, tmp_path):
    """Two micro-batches of one pair each give the loss and gradient of one micro-batch of two."""
    model, tok, cfg, pairs, _ = _setup(tiny_model_dir, tmp_path)
    grads = []
    for split in ([pairs], [pairs[:1], pairs[1:]]):
        model.zero_grad()
        total = sum(pair_batch_loss(model, part, 2, cfg, tok.pad_token_id)[0] for part in split)
        total.backward()
        grads.append((float(total.detach()), torch.cat([p.grad.flatten() for p in model.parameters()])))
    assert grads[0][0] == pytest.approx(grads[1][0], abs=1e-6)
    torch.testing.assert_close(grads[0][1], grads[1][1], rtol=1e-4, atol=1e-7)


def test_batched_logps_match_the_plain_forward(tiny_model_dir, tmp_path):
    """Padding (prompts left, completions right) does not change a pair's log-probs."""
    model, tok, cfg, pairs, (c0, r0, c1, r1) = _setup(tiny_model_dir, tmp_path)
    reference_logps(model, pairs, 2, False, contextlib.nullcontext, tok.pad_token_id)
    assert [pairs[0].ref_chosen, pairs[0].ref_rejected, pairs[1].ref_chosen, pairs[1].ref_rejected] == pytest.approx(
        [c0, r0, c1, r1], abs=1e-4)
    from grouprl.train.algorithms.dpo import collate

    with torch.no_grad():
        means = sequence_logps(model, collate(pairs, tok.pad_token_id, "cpu"), average=True)
    assert float(means[0]) == pytest.approx(c0 / len(pairs[0].chosen_ids), abs=1e-5)
    assert math.isfinite(float(means[3]))
