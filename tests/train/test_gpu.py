"""GPU path (skipped without CUDA): bf16 autocast without the fp32 warning, tensors on the device, finite values."""

from __future__ import annotations

import warnings

import pytest
import torch
from train_helpers import REQUIRED_METRICS, char_reward, is_finite, train_records

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.mark.parametrize("kl_coef", [0.0, 0.05])
def test_bf16_run_on_cuda(tiny_model_dir, train_rows, fast_config, kl_coef):
    from grouprl import GRPOTrainer
    from grouprl.train.engine.step import completion_logps

    cfg = fast_config(device="cuda", bf16=True, kl_coef=kl_coef)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = GRPOTrainer(model=str(tiny_model_dir), config=cfg, train_dataset=train_rows,
                              reward_funcs=char_reward)
        trainer.train()
    assert not [w for w in caught if "bf16" in str(w.message)]  # supported: no fallback warning
    assert next(trainer.model.parameters()).device.type == "cuda"
    for rec in train_records(cfg.output_dir):
        assert all(is_finite(rec[k]) for k in REQUIRED_METRICS if k != "kl" or kl_coef > 0)
    ids = torch.randint(5, 100, (2, 6), device="cuda")
    mask = torch.ones_like(ids)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logp, _ = completion_logps(trainer.model, ids, mask, ids, mask)
    assert logp.dtype == torch.float32  # log-softmax upcast from bf16 logits
