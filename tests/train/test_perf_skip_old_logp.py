"""Skipping the old-log-prob forward for the first optimizer step of a round changes nothing: those
micro-batches are scored before any update, so the loss (which then uses ``logp.detach()``) and its
gradients equal those computed with an explicit no-grad old-log-prob forward."""

from __future__ import annotations

import contextlib

import pytest
import torch

from grouprl.builtins import load_builtins
from grouprl.config import GRPOConfig
from grouprl.registry import AGGREGATIONS, KL_ESTIMATORS, POLICY_LOSSES
from grouprl.rollout.base import Rollout
from grouprl.train.algorithms.rounds import RoundBatch, RunContext, micro_batches
from grouprl.train.engine.step import LossSpec, batched_logps, micro_batch_loss, step_totals
from grouprl.train.metrics import Timers


def _model(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)


def _rollout(vocab, N=8, P=5, T=6):
    g = torch.Generator().manual_seed(0)
    prompt_mask = torch.ones(N, P, dtype=torch.long)
    prompt_mask[::3, :2] = 0
    prompt_ids = torch.randint(5, vocab, (N, P), generator=g).masked_fill(prompt_mask == 0, 0)
    lengths = torch.tensor([6, 3, 5, 1, 6, 4, 2, 6])
    completion_mask = (torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)).long()
    completion_ids = torch.randint(5, vocab, (N, T), generator=g).masked_fill(completion_mask == 0, 0)
    return Rollout(prompt_ids, prompt_mask, completion_ids, completion_mask, lengths == T, [""] * N, [""] * N)


def _cfg(mu=1):
    # 8 completions in 4 micro-batches of 2; 2 micro-batches per optimizer step -> 2 steps per round
    return GRPOConfig(num_generations=4, per_device_train_batch_size=2, gradient_accumulation_steps=2,
                      steps_per_generation=4, num_iterations=mu, max_new_tokens=6)


@pytest.mark.parametrize("mu, expected", [(1, [True, True, False, False]), (2, [False] * 4)])
def test_old_logp_forward_skipped_exactly_where_the_policy_has_not_moved(tiny_model_dir, mu, expected):
    model = _model(tiny_model_dir)
    ctx = RunContext(_cfg(mu), model, None, None, None, None, None, contextlib.nullcontext, None)
    r = _rollout(model.config.vocab_size)
    mbs = micro_batches(ctx, RoundBatch(r, torch.linspace(-1, 1, 8)), Timers())
    assert [mb.old_logp is None for mb in mbs] == expected


@pytest.mark.parametrize("loss", ["grpo", "gspo"])
def test_skipped_old_logp_gives_the_same_loss_and_gradients(tiny_model_dir, loss):
    load_builtins()
    model = _model(tiny_model_dir)
    ctx = RunContext(_cfg(), model, None, None, None, None, None, contextlib.nullcontext, None)
    r = _rollout(model.config.vocab_size)
    adv = torch.tensor([1.0, -0.5, 0.3, -1.2, 0.8, 0.0, -0.4, 1.1])
    mbs = micro_batches(ctx, RoundBatch(r, adv), Timers())[:2]  # the round's first optimizer step
    hp = {"eps_low": 3e-4, "eps_high": 4e-4} if loss == "gspo" else {"eps_low": 0.2, "eps_high": 0.28}
    spec = LossSpec(POLICY_LOSSES.get(loss), hp, AGGREGATIONS.get("token_mean"), KL_ESTIMATORS.get("k3"),
                    kl_coef=0.0, temperature=1.0)
    totals = step_totals(mbs, 6)
    plain_old = batched_logps(model, mbs, 1.0, contextlib.nullcontext)
    results = []
    for old in ([None, None], plain_old):
        model.zero_grad(set_to_none=True)
        total = torch.zeros(())
        for mb, lp in zip(mbs, old):
            mb.old_logp = lp
            value, _ = micro_batch_loss(model, mb, spec, totals)
            value.backward()
            total = total + value.detach()
        results.append((total, {k: p.grad.clone() for k, p in model.named_parameters()}))
    (loss_skip, grads_skip), (loss_plain, grads_plain) = results
    torch.testing.assert_close(loss_skip, loss_plain, rtol=1e-5, atol=1e-7)
    for k in grads_plain:
        torch.testing.assert_close(grads_skip[k], grads_plain[k], rtol=1e-4, atol=1e-6)
    assert any(g.abs().sum() > 0 for g in grads_skip.values())
