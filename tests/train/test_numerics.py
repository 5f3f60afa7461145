"""Numerics guards of the training step: non-finite steps are skipped and counted (and stop the run after
max_consecutive_skips), half-precision model objects train with fp32 master weights, temperature scaling
happens in fp32, and old / reference log-probs are computed with dropout off."""

from __future__ import annotations

import contextlib

import pytest
import torch
from train_helpers import char_reward, train_records

from grouprl.builtins import load_builtins
from grouprl.config import GRPOConfig
from grouprl.registry import AGGREGATIONS, KL_ESTIMATORS, POLICY_LOSSES
from grouprl.rollout.base import Rollout
from grouprl.train.algorithms.rounds import RoundBatch, RunContext, micro_batches
from grouprl.train.engine.step import (
    LossSpec,
    NonFiniteError,
    batched_logps,
    completion_logps,
    optimizer_step,
)
from grouprl.train.metrics import Timers


def _model(path, **kw):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, **kw)


def _rollout(vocab, N=8, P=5, T=6):
    g = torch.Generator().manual_seed(0)
    prompt_ids = torch.randint(5, vocab, (N, P), generator=g)
    lengths = torch.tensor([6, 3, 5, 1, 6, 4, 2, 4])[:N]
    mask = (torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)).long()
    ids = torch.randint(5, vocab, (N, T), generator=g).masked_fill(mask == 0, 0)
    return Rollout(prompt_ids, torch.ones(N, P, dtype=torch.long), ids, mask, lengths == T, [""] * N, [""] * N)


def _nan_logits_when(model, active):
    """Forward hook: NaN logits whenever ``active()`` (and gradients are on: the policy forward only)."""
    def hook(module, args, output):
        if active() and torch.is_grad_enabled():
            output.logits = output.logits * float("nan")
        return output
    return model.register_forward_hook(hook)


def _spec():
    return LossSpec(POLICY_LOSSES.get("grpo"), {"eps_low": 0.2, "eps_high": 0.2}, AGGREGATIONS.get("token_mean"),
                    KL_ESTIMATORS.get("k3"), 0.0, 1.0)


def test_non_finite_loss_skips_the_step_weights_unchanged(tiny_model_dir):
    load_builtins()
    model = _model(tiny_model_dir)
    cfg = GRPOConfig(num_generations=4, per_device_train_batch_size=4, gradient_accumulation_steps=2,
                     max_new_tokens=6, weight_decay=0.1)
    ctx = RunContext(cfg, model, None, None, None, None, None, contextlib.nullcontext, None)
    mbs = micro_batches(ctx, RoundBatch(_rollout(model.config.vocab_size), torch.linspace(-1, 1, 8)), Timers())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    handle = _nan_logits_when(model, lambda: True)
    out = optimizer_step(ctx, mbs, _spec(), opt, sched, Timers())
    handle.remove()
    assert out["skipped"] == 1.0 and out["skip_reason"] == "non-finite loss"
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]) and torch.isfinite(v).all(), k
    assert all(p.grad is None for p in model.parameters())  # dropped, not carried into the next step
    assert sched.last_epoch == 0  # the schedule counts applied updates only
    out = optimizer_step(ctx, mbs, _spec(), opt, sched, Timers())  # healthy again: a normal update
    assert out["skipped"] == 0.0 and sched.last_epoch == 1
    assert any(not torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_skipped_steps_are_counted_and_too_many_in_a_row_stop_the_run(tiny_model_dir, train_rows, fast_config):
    from grouprl.train.trainer import GRPOTrainer

    cfg = fast_config(max_steps=3)
    trainer = GRPOTrainer(model=str(tiny_model_dir), reward_funcs=[char_reward], args=cfg, train_dataset=train_rows)
    calls = {"n": 0}

    def first_step():  # 2 micro-batches per optimizer step: NaN during the first step only
        calls["n"] += 1
        return calls["n"] <= 2
    _nan_logits_when(trainer.model, first_step)
    trainer.train()
    records = train_records(cfg.output_dir)
    assert [r["skipped_steps"] for r in records] == [1, 1, 1]

    cfg = fast_config(max_steps=5, max_consecutive_skips=2, output_dir=cfg.output_dir + "-2")
    trainer = GRPOTrainer(model=str(tiny_model_dir), reward_funcs=[char_reward], args=cfg, train_dataset=train_rows)
    _nan_logits_when(trainer.model, lambda: True)
    with pytest.raises(NonFiniteError, match=r"optimizer step 2: non-finite loss for 2 consecutive steps.*"
                                             r"learning rate"):
        trainer.train()


def test_bf16_model_object_trains_with_fp32_master_weights(tiny_model_dir, train_rows, fast_config):
    from grouprl.models import load_tokenizer
    from grouprl.train.trainer import GRPOTrainer

    model = _model(tiny_model_dir).to(torch.bfloat16)
    start = {k: v.detach().float().clone() for k, v in model.named_parameters()}
    cfg = fast_config(max_steps=1, learning_rate=1e-6, max_grad_norm=0.0, weight_decay=0.0)
    trainer = GRPOTrainer(model=model, reward_funcs=[char_reward], args=cfg, train_dataset=train_rows,
                          processing_class=load_tokenizer(str(tiny_model_dir)))
    trainer.train()
    params = dict(trainer.model.named_parameters())
    assert all(p.dtype == torch.float32 for p in params.values())
    # an lr=1e-6 Adam step moves a weight by ~1e-6: below bf16's resolution, kept in fp32
    moved = [k for k, p in params.items() if not torch.equal(p.detach(), start[k])]
    assert moved, "the update was rounded away"
    delta = max(float((params[k].detach() - start[k]).abs().max()) for k in moved)
    assert 1e-7 < delta < 1e-5


def test_temperature_scaling_happens_in_fp32():
    class BF16Logits(torch.nn.Module):  # logits in bf16, as under autocast
        def __init__(self, logits):
            super().__init__()
            self.logits = logits

        def forward(self, input_ids, logits_to_keep=None, **kw):
            return type("Out", (), {"logits": self.logits[:, -logits_to_keep:]})()

    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(2, 6, 50, generator=g) * 4).to(torch.bfloat16)
    ids = torch.randint(0, 50, (2, 3), generator=g)
    mask = torch.ones(2, 3, dtype=torch.long)
    logp, _ = completion_logps(BF16Logits(logits), ids, mask, ids, mask, temperature=0.7)
    expected = torch.log_softmax(logits[:, 2:-1].float() / 0.7, dim=-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(logp, expected, rtol=0, atol=1e-6)


def test_old_and_reference_logps_have_dropout_off_and_train_mode_returns(tiny_model_dir):
    model = _model(tiny_model_dir, attention_dropout=0.5)
    model.train()
    cfg = GRPOConfig(num_generations=4, per_device_train_batch_size=4, gradient_accumulation_steps=2,
                     max_new_tokens=6)
    ctx = RunContext(cfg, model, None, None, None, None, None, contextlib.nullcontext, None)
    mbs = micro_batches(ctx, RoundBatch(_rollout(model.config.vocab_size), torch.zeros(8)), Timers())
    first = batched_logps(model, mbs, 1.0, contextlib.nullcontext)
    second = batched_logps(model, mbs, 1.0, contextlib.nullcontext)
    assert model.training
    for a, b in zip(first, second):
        assert torch.equal(a, b)
    with torch.no_grad():  # dropout really is active in train mode (else this test would prove nothing)
        a = completion_logps(model, mbs[0].prompt_ids, mbs[0].prompt_mask, mbs[0].completion_ids,
                             mbs[0].completion_mask)[0]
        b = completion_logps(model, mbs[0].prompt_ids, mbs[0].prompt_mask, mbs[0].completion_ids,
                             mbs[0].completion_mask)[0]
    assert not torch.equal(a, b)
