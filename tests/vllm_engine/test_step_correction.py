"""The mismatch correction inside the trainer's ``micro_batch_loss``: identity when the engine's log-probs are
the trainer's, hand-computed truncation / masking otherwise, and GSPO with the engine's log-probs as old_logp."""

from __future__ import annotations

import math

import pytest
import torch

from grouprl.builtins import load_builtins
from grouprl.config import GRPOConfig
from grouprl.registry import AGGREGATIONS, KL_ESTIMATORS, POLICY_LOSSES
from grouprl.train.engine.step import (
    LossSpec,
    MicroBatch,
    completion_logps,
    micro_batch_loss,
    mismatch_correction,
)

ADV = torch.tensor([1.0, -0.5, 2.0, -1.0])
LENGTHS = torch.tensor([4, 2, 3, 1])


def _setup(path):
    from transformers import AutoModelForCausalLM

    load_builtins()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    g = torch.Generator().manual_seed(1)
    N, P, T = 4, 3, 4
    mask = (torch.arange(T).unsqueeze(0) < LENGTHS.unsqueeze(1)).long()
    ids = torch.randint(10, model.config.vocab_size, (N, T), generator=g).masked_fill(mask == 0, 0)
    mb = MicroBatch(torch.randint(10, model.config.vocab_size, (N, P), generator=g), torch.ones(N, P, dtype=torch.long),
                    ids, mask, mask.clone(), ADV.clone())
    with torch.no_grad():
        logp, _ = completion_logps(model, mb.prompt_ids, mb.prompt_mask, ids, mask)
    return model, mb, logp


def _spec(cfg: GRPOConfig) -> LossSpec:
    fns = cfg.resolved()
    return LossSpec(POLICY_LOSSES.get(fns["policy_loss"]), fns["loss_hparams"], AGGREGATIONS.get(fns["aggregation"]),
                    KL_ESTIMATORS.get(fns["kl_estimator"]), 0.0, 1.0, **mismatch_correction(cfg))


def _loss(model, mb, spec):
    model.zero_grad(set_to_none=True)
    totals = {"num_tokens": int(mb.loss_mask.sum()), "num_seqs": 4, "max_len": 4}
    loss, sums = micro_batch_loss(model, mb, spec, totals)
    loss.backward()
    return loss.detach(), sums, {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}


def test_identity_when_rollout_logp_equals_the_trainers(tiny_model_dir):
    model, mb, logp = _setup(tiny_model_dir)
    spec = _spec(GRPOConfig(rollout_backend="vllm", loss_aggregation="token_mean"))
    plain_loss, plain_sums, plain_grads = _loss(model, mb, spec)
    mb.rollout_logp = logp.clone()
    loss, sums, grads = _loss(model, mb, spec)
    assert torch.equal(loss, plain_loss)
    assert all(torch.equal(grads[k], plain_grads[k]) for k in plain_grads)
    assert float(sums["mismatch/is_weight_mean"]) == pytest.approx(1.0, abs=1e-6)
    assert float(sums["mismatch/logp_abs_diff"]) == pytest.approx(0.0, abs=1e-6)
    assert "mismatch/is_weight_mean" not in plain_sums  # no engine log-probs: no correction, no metrics


def test_tis_weights_the_per_token_loss_by_hand(tiny_model_dir):
    model, mb, logp = _setup(tiny_model_dir)
    # old_logp - rollout_logp per row: 0.5, 1.0 (e = 2.718 -> capped at 2), -0.5, 0.25
    d = torch.tensor([0.5, 1.0, -0.5, 0.25]).unsqueeze(1).expand(4, 4)
    mb.rollout_logp = logp - d
    loss, sums, _ = _loss(model, mb, _spec(GRPOConfig(rollout_backend="vllm", loss_aggregation="token_mean")))
    # on-policy grpo: ratio 1, per-token loss -A_i; token_mean over the 4 + 2 + 3 + 1 = 10 tokens
    w = [math.exp(0.5), 2.0, math.exp(-0.5), math.exp(0.25)]
    expected = -sum(a * wi * n for a, wi, n in zip(ADV.tolist(), w, LENGTHS.tolist())) / 10
    assert float(loss) == pytest.approx(expected, abs=1e-5)
    assert float(sums["mismatch/is_weight_mean"]) == pytest.approx(sum(wi * n for wi, n in zip(w, LENGTHS.tolist())) / 10,
                                                                   abs=1e-5)
    assert float(sums["mismatch/is_weight_max"]) == pytest.approx(2.0)
    assert float(sums["mismatch/logp_abs_diff"]) == pytest.approx((0.5 * 4 + 1.0 * 2 + 0.5 * 3 + 0.25) / 10, abs=1e-5)


def test_mask_zeroes_the_sequences_outside_the_band_by_hand(tiny_model_dir):
    model, mb, logp = _setup(tiny_model_dir)
    d = torch.tensor([0.5, 0.01, -0.3, 0.0]).unsqueeze(1).expand(4, 4)  # ratios 1.65, 1.01, 0.74, 1
    mb.rollout_logp = logp - d
    cfg = GRPOConfig(rollout_backend="vllm", loss_aggregation="token_mean", rollout_correction="mask",
                     rollout_mask_band=[0.8, 1.2])
    loss, sums, _ = _loss(model, mb, _spec(cfg))
    expected = -(-0.5 * 2 + -1.0 * 1) / 10  # rows 1 and 3 kept; the normaliser stays the 10 tokens
    assert float(loss) == pytest.approx(expected, abs=1e-5)
    assert float(sums["mismatch/masked_frac"]) == pytest.approx(7 / 10, abs=1e-6)  # rows 0 and 2: 4 + 3 tokens


def test_correction_none_ignores_the_engine_logp(tiny_model_dir):
    model, mb, logp = _setup(tiny_model_dir)
    spec = _spec(GRPOConfig(rollout_backend="vllm", rollout_correction="none"))
    plain_loss, _, _ = _loss(model, mb, spec)
    mb.rollout_logp = logp - 1.0
    loss, sums, _ = _loss(model, mb, spec)
    assert torch.equal(loss, plain_loss) and not any(k.startswith("mismatch/") for k in sums)


def test_gspo_can_use_the_engine_logp_as_old_logp(tiny_model_dir):
    model, mb, logp = _setup(tiny_model_dir)
    mb.rollout_logp = logp - 0.5  # the engine under-rates every token by 0.5 nat
    cfg = GRPOConfig(rollout_backend="vllm", algorithm="gspo", gspo_use_engine_logp=True)
    _, sums, _ = _loss(model, mb, _spec(cfg))
    # sequence ratio exp(mean(logp - rollout_logp)) = e^0.5 for every sequence, no separate weight
    assert float(sums["policy/ratio_mean"]) == pytest.approx(math.exp(0.5), abs=1e-5)
    assert not any(k.startswith("mismatch/") for k in sums)
    _, sums, _ = _loss(model, mb, _spec(GRPOConfig(rollout_backend="vllm", algorithm="gspo")))
    assert float(sums["policy/ratio_mean"]) == pytest.approx(1.0, abs=1e-5)  # default: ratio vs the trainer
    assert float(sums["mismatch/is_weight_mean"]) == pytest.approx(math.exp(0.5), abs=1e-5)  # TIS, below cap


def test_mismatch_correction_resolves_auto():
    assert mismatch_correction(GRPOConfig(rollout_backend="vllm"))["correction"].func.__name__ == "tis"
    assert mismatch_correction(GRPOConfig(rollout_backend="vllm", rollout_correction="none"))["correction"] is None
    cfg = GRPOConfig(rollout_backend="vllm", algorithm="gspo", gspo_use_engine_logp=True)
    assert mismatch_correction(cfg) == {"correction": None, "use_engine_logp": True}
