"""bf16 storage of the reference model (``ref_dtype``) and the two perf fields of the config."""

from __future__ import annotations

import contextlib

import pytest
import torch

from grouprl.config import GRPOConfig
from grouprl.errors import ConfigError
from grouprl.train.engine.model import Reference, reference_dtype
from grouprl.train.engine.step import MicroBatch, batched_logps


def _model():
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model("qwen2", vocab_size=512, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)


def _mb():
    g = torch.Generator().manual_seed(0)
    prompt_mask = torch.ones(4, 5, dtype=torch.long)
    prompt_mask[1, :3] = 0
    completion_mask = torch.ones(4, 6, dtype=torch.long)
    completion_mask[2, 2:] = 0
    return MicroBatch(torch.randint(3, 512, (4, 5), generator=g) * prompt_mask, prompt_mask,
                      torch.randint(3, 512, (4, 6), generator=g) * completion_mask, completion_mask,
                      completion_mask, torch.zeros(4))


def test_reference_dtype_names(monkeypatch):
    from grouprl.train.engine import precision

    monkeypatch.setattr(precision, "cpu_has_fast_bf16", lambda: False)  # bf16 CPUs: tests/train/test_bf16_cpu.py
    cpu = torch.device("cpu")
    assert reference_dtype("auto", cpu) == torch.float32
    assert reference_dtype("auto", cpu, bf16=True) == torch.float32  # no bf16 autocast on this CPU: fp32 compute
    assert reference_dtype("float32", cpu) == torch.float32
    assert reference_dtype("bfloat16", cpu) == torch.bfloat16


def test_auto_follows_bf16_autocast_on_a_bf16_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    cuda = torch.device("cuda")
    assert reference_dtype("auto", cuda, bf16=True) == torch.bfloat16
    assert reference_dtype("auto", cuda, bf16=False) == torch.float32  # an fp32 run keeps an fp32 reference
    assert reference_dtype("float32", cuda, bf16=True) == torch.float32  # a name always wins


def test_bf16_reference_is_stored_in_bf16_and_returns_fp32_logps_close_to_fp32():
    policy = _model()
    ref16, ref32 = Reference(policy, "bfloat16"), Reference(policy, "float32")
    assert all(p.dtype == torch.bfloat16 and not p.requires_grad for p in ref16.model.parameters())
    assert all(p.dtype == torch.float32 and p.requires_grad for p in policy.parameters())  # policy untouched
    assert all(p.dtype == torch.float32 for p in ref32.model.parameters())
    mb = _mb()
    with ref16.context():
        (lp16,) = batched_logps(ref16.model, [mb], 1.0, contextlib.nullcontext)
    (lp32,) = batched_logps(ref32.model, [mb], 1.0, contextlib.nullcontext)
    mask = mb.completion_mask.bool()
    assert lp16.dtype == torch.float32
    err = (lp16 - lp32)[mask].abs()
    # bf16 keeps 8 mantissa bits: log-probs near -6.2 (= log 1/512) move by a few hundredths, not more
    assert 0 < float(err.max()) < 0.1
    assert float(lp32[mask].mean()) == pytest.approx(-6.24, abs=0.1)


def test_lora_reference_shares_the_policy_whatever_ref_dtype():
    from peft import LoraConfig, get_peft_model

    policy = get_peft_model(_model(), LoraConfig(r=4, target_modules="all-linear"))
    ref = Reference(policy, "bfloat16")
    assert ref.shared and ref.model is policy
    assert all(p.dtype == torch.float32 for p in policy.parameters())


def test_prepare_model_passes_ref_dtype():
    from grouprl.train.algorithms.grpo import prepare_model

    cfg = GRPOConfig(kl_coef=0.04, ref_dtype="bfloat16")
    _, reference = prepare_model(cfg, _model())
    assert next(reference.model.parameters()).dtype == torch.bfloat16


def test_config_fields_validated():
    assert GRPOConfig().ref_dtype == "auto" and GRPOConfig().logits_chunk_size == 1024
    with pytest.raises(ConfigError, match="ref_dtype='bf16' must be one of"):
        GRPOConfig(ref_dtype="bf16")
    with pytest.raises(ConfigError, match="logits_chunk_size=-1 must be >= 0"):
        GRPOConfig(logits_chunk_size=-1)


def test_resume_accepts_a_new_logits_chunk_size_and_refuses_a_new_ref_dtype():
    from grouprl.run.resume_config import compare, config_record

    base = dict(num_generations=4, per_device_train_batch_size=8, model="m", dataset="d", max_steps=4)
    saved = config_record(GRPOConfig(**base))
    ok, bad = compare(saved, GRPOConfig(**base, logits_chunk_size=256, ref_dtype="bfloat16"))
    assert "logits_chunk_size" in ok and "ref_dtype" in bad  # another chunking vs another reference (the KL)
