"""The trainer's gradient: independent of the micro-batch split, and the memory-lean log-prob path
(logits of completion positions only + chunked selective log-softmax) equals the plain one."""

from __future__ import annotations

import contextlib

import pytest
import torch

from grouprl.builtins import load_builtins
from grouprl.config import GRPOConfig
from grouprl.registry import AGGREGATIONS, KL_ESTIMATORS, POLICY_LOSSES
from grouprl.rollout.base import Rollout
from grouprl.train.algorithms.rounds import RoundBatch, RunContext, micro_batches
from grouprl.train.engine.step import LossSpec, completion_logps, micro_batch_loss, step_totals
from grouprl.train.metrics import Timers


def _model(path):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)


def _rollout(vocab, N=8, P=5, T=7, seed=0):
    """Random prompts (left-padded) and completions of varied length (right-padded, some truncated)."""
    g = torch.Generator().manual_seed(seed)
    prompt_ids = torch.randint(5, vocab, (N, P), generator=g)
    prompt_mask = torch.ones(N, P, dtype=torch.long)
    prompt_mask[::3, :2] = 0
    prompt_ids[prompt_mask == 0] = 0
    lengths = torch.tensor([7, 3, 5, 1, 7, 6, 2, 4])[:N]
    completion_mask = (torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)).long()
    completion_ids = torch.randint(5, vocab, (N, T), generator=g).masked_fill(completion_mask == 0, 0)
    truncated = lengths == T
    return Rollout(prompt_ids, prompt_mask, completion_ids, completion_mask, truncated, [""] * N, [""] * N)


def _grads(model, cfg, rollout, adv, spec):
    ctx = RunContext(cfg, model, None, None, None, None, None, contextlib.nullcontext, None)
    mbs = micro_batches(ctx, RoundBatch(rollout, adv), Timers())
    totals = step_totals(mbs, cfg.max_new_tokens)
    model.zero_grad(set_to_none=True)
    total = 0.0
    for mb in mbs:
        mb.ref_logp = None if spec.kl_coef == 0 else torch.zeros_like(mb.completion_ids, dtype=torch.float) - 3.0
        loss, _ = micro_batch_loss(model, mb, spec, totals)
        loss.backward()
        total += float(loss.detach())
    return total, {k: p.grad.clone() for k, p in model.named_parameters()}


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
@pytest.mark.parametrize("kl_coef", [0.0, 0.1])
def test_gradient_does_not_depend_on_the_micro_batch_split(tiny_model_dir, aggregation, kl_coef):
    load_builtins()
    model = _model(tiny_model_dir)
    rollout = _rollout(model.config.vocab_size)
    adv = torch.tensor([1.0, -0.5, 0.3, -1.2, 0.8, 0.0, -0.4, 1.1])
    spec = LossSpec(POLICY_LOSSES.get("grpo"), {"eps_low": 0.2, "eps_high": 0.28}, AGGREGATIONS.get(aggregation),
                    KL_ESTIMATORS.get("k3"), kl_coef, 0.9)
    results = []
    for per_device, ga in [(8, 1), (2, 4), (1, 8)]:
        cfg = GRPOConfig(num_generations=4, per_device_train_batch_size=per_device, gradient_accumulation_steps=ga,
                         max_new_tokens=7, mask_truncated_completions=True)
        results.append(_grads(model, cfg, rollout, adv, spec))
    loss_one, grads_one = results[0]
    for loss, grads in results[1:]:
        assert loss == pytest.approx(loss_one, rel=1e-5, abs=1e-7)
        for k in grads_one:
            torch.testing.assert_close(grads[k], grads_one[k], rtol=1e-4, atol=1e-7)
    assert any(g.abs().sum() > 0 for g in grads_one.values())


def test_lean_logprob_path_matches_the_plain_path(tiny_llama_dir):
    load_builtins()
    model = _model(tiny_llama_dir)
    r = _rollout(model.config.vocab_size)
    adv = torch.tensor([1.0, -0.5, 0.3, -1.2, 0.8, 0.0, -0.4, 1.1])
    agg = AGGREGATIONS.get("token_mean")
    out = {}
    for plain in (True, False):
        model.zero_grad(set_to_none=True)
        logp, _ = completion_logps(model, r.prompt_ids, r.prompt_mask, r.completion_ids, r.completion_mask, 0.7,
                                   plain=plain)
        old = logp.detach() - 0.05  # off-policy ratio so clipping is exercised
        per_token, _ = POLICY_LOSSES.get("grpo")(logp, old, adv, r.completion_mask)
        loss = agg(per_token, r.completion_mask)
        loss.backward()
        out[plain] = (logp.detach(), loss.detach(), {k: p.grad.clone() for k, p in model.named_parameters()})
    logp_plain, loss_plain, grads_plain = out[True]
    logp_lean, loss_lean, grads_lean = out[False]
    mask = r.completion_mask.bool()
    torch.testing.assert_close(logp_lean[mask], logp_plain[mask], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(loss_lean, loss_plain, rtol=1e-5, atol=1e-6)
    for k in grads_plain:
        torch.testing.assert_close(grads_lean[k], grads_plain[k], rtol=1e-4, atol=1e-6)


def test_logprobs_match_the_sampling_distribution_with_left_padding(tiny_model_dir):
    """Position ids follow the attention mask: a left-padded row scores like the same row unpadded."""
    model = _model(tiny_model_dir)
    r = _rollout(model.config.vocab_size)
    with torch.no_grad():
        padded, _ = completion_logps(model, r.prompt_ids, r.prompt_mask, r.completion_ids, r.completion_mask)
        alone, _ = completion_logps(model, r.prompt_ids[:1, 2:], r.prompt_mask[:1, 2:], r.completion_ids[:1],
                                    r.completion_mask[:1])
    mask = r.completion_mask[0].bool()
    torch.testing.assert_close(padded[0][mask], alone[0][mask], rtol=1e-4, atol=1e-5)


# On-policy the ratio is 1, so each token's loss is -A_i. Lengths 7,3,5,1,7,6,2,4 (35 tokens), max_len 7:
# sum_i A_i = 1.1 and sum_i A_i |y_i| = 7 - 1.5 + 1.5 - 1.2 + 5.6 + 0 - 0.8 + 4.4 = 15.
@pytest.mark.parametrize(("aggregation", "expected"), [("seq_mean_token_mean", -1.1 / 8), ("token_mean", -15 / 35),
                                                       ("seq_mean_token_sum_norm", -15 / (8 * 7))])
def test_logged_policy_loss_is_the_surrogate_value(tiny_model_dir, aggregation, expected):
    from grouprl.train.engine.step import combine

    load_builtins()
    model = _model(tiny_model_dir)
    adv = torch.tensor([1.0, -0.5, 0.3, -1.2, 0.8, 0.0, -0.4, 1.1])  # not centred: the value is not ~0
    spec = LossSpec(POLICY_LOSSES.get("grpo"), {"eps_low": 0.2, "eps_high": 0.2}, AGGREGATIONS.get(aggregation),
                    KL_ESTIMATORS.get("k3"), 0.0, 1.0)
    cfg = GRPOConfig(num_generations=4, per_device_train_batch_size=4, gradient_accumulation_steps=2, max_new_tokens=7)
    ctx = RunContext(cfg, model, None, None, None, None, None, contextlib.nullcontext, None)
    mbs = micro_batches(ctx, RoundBatch(_rollout(model.config.vocab_size), adv), Timers())
    totals, acc = step_totals(mbs, cfg.max_new_tokens), {}
    for mb in mbs:  # two micro-batches of 4, normalised by the whole step's totals
        combine(acc, micro_batch_loss(model, mb, spec, totals)[1])
    assert len(mbs) == 2 and float(acc["loss/policy"]) == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("max_grad_norm", [1e-3, 0.0])
def test_gradients_are_clipped_to_max_grad_norm_and_the_norm_before_is_logged(tiny_model_dir, max_grad_norm):
    from grouprl.train.engine.step import optimizer_step

    load_builtins()
    model = _model(tiny_model_dir)
    cfg = GRPOConfig(num_generations=4, per_device_train_batch_size=4, gradient_accumulation_steps=2,
                     max_new_tokens=7, max_grad_norm=max_grad_norm)
    spec = LossSpec(POLICY_LOSSES.get("grpo"), {"eps_low": 0.2, "eps_high": 0.2}, AGGREGATIONS.get("token_mean"),
                    KL_ESTIMATORS.get("k3"), 0.0, 1.0)
    ctx = RunContext(cfg, model, None, None, None, None, None, contextlib.nullcontext, None)
    adv = torch.tensor([1.0, -0.5, 0.3, -1.2, 0.8, 0.0, -0.4, 1.1])
    mbs = micro_batches(ctx, RoundBatch(_rollout(model.config.vocab_size), adv), Timers())
    seen = []

    class Spy(torch.optim.SGD):  # records the gradient norm the optimizer actually applies
        def step(self, closure=None):
            seen.append(float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters()]))))
            return super().step(closure)

    opt = Spy(model.parameters(), lr=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    out = optimizer_step(ctx, mbs, spec, opt, sched, Timers())
    assert out["grad_norm"] > 1e-2  # logged before clipping
    if max_grad_norm:
        assert seen[0] == pytest.approx(max_grad_norm, rel=1e-3)
    else:  # 0 = no clipping
        assert seen[0] == pytest.approx(out["grad_norm"], rel=1e-5)
