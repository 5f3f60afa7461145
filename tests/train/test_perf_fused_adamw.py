"""The fused AdamW kernel the trainer picks takes the same step as the reference implementation."""

from __future__ import annotations

import copy

import torch

from grouprl.config import GRPOConfig
from grouprl.train.engine.model import build_optimizer


def test_fused_adamw_steps_like_the_reference(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    reference = copy.deepcopy(model)
    cfg = GRPOConfig(learning_rate=1e-2, weight_decay=0.1, lr_scheduler_type="constant")
    optimizer, _ = build_optimizer(model, cfg, total_steps=3)
    assert optimizer.defaults.get("fused") is True
    plain = torch.optim.AdamW(reference.parameters(), lr=1e-2, betas=(cfg.adam_beta1, cfg.adam_beta2),
                              eps=cfg.adam_epsilon, weight_decay=0.1, foreach=False)
    g = torch.Generator().manual_seed(0)
    for _ in range(3):
        for p, q in zip(model.parameters(), reference.parameters()):
            grad = torch.randn(p.shape, generator=g)
            p.grad, q.grad = grad.clone(), grad.clone()
        optimizer.step()
        plain.step()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=name)
    start = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert any(not torch.equal(p, q) for p, q in zip(model.parameters(), start.parameters()))  # it did move
