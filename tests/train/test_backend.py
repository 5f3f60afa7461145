"""The transformers backend's sampler choice (lean sampler on CPU only by default) and when the trainer
synchronises an engine's weights (once per generation round, before generating)."""

from __future__ import annotations

import pytest
from train_helpers import CountingBackend, char_reward

from grouprl import GRPOTrainer
from grouprl.rollout.hf import use_lean_sampler


@pytest.mark.parametrize(("choice", "device", "expected"), [
    (None, "cpu", True), (None, "cuda", False), (None, "mps", False),
    (True, "cuda", True), (False, "cpu", False), (True, "cpu", True),
])
def test_lean_sampler_is_the_cpu_default_and_can_be_forced(choice, device, expected):
    assert use_lean_sampler(choice, device) is expected


def test_lean_sampler_setting_reaches_the_transformers_backend(tiny_model_dir):
    from grouprl.models import load_model, load_tokenizer
    from grouprl.rollout import make_backend

    model, tok = load_model(str(tiny_model_dir), "cpu"), load_tokenizer(str(tiny_model_dir))
    assert make_backend("transformers", model, tok).lean is None
    assert make_backend("transformers", model, tok, lean_sampler=False).lean is False
    assert make_backend("transformers", model, tok, lean_sampler=True).lean is True


def test_generate_is_used_when_the_lean_sampler_is_off(tiny_model_dir, monkeypatch):
    """lean_sampler=False (the CUDA default) samples with model.generate, never the lean path."""
    import grouprl.rollout.lean as lean
    from grouprl.models import load_model, load_tokenizer
    from grouprl.rollout import SamplingParams, make_backend

    model, tok = load_model(str(tiny_model_dir), "cpu"), load_tokenizer(str(tiny_model_dir))
    monkeypatch.setattr(lean, "lean_sample", lambda *a, **k: pytest.fail("lean sampler used"))
    calls = []
    real = model.generate
    monkeypatch.setattr(model, "generate", lambda *a, **k: calls.append(1) or real(*a, **k))
    out = make_backend("transformers", model, tok, lean_sampler=False).generate(["hi"], 2, SamplingParams(4))
    assert calls == [1] and len(out) == 2


def test_weights_are_synced_once_per_generation_round_before_generating(tiny_model_dir, train_rows, fast_config):
    CountingBackend.events.clear()
    # 2 optimizer steps per generation round (steps_per_generation = 2 x GA), 4 steps -> 2 rounds
    cfg = fast_config(max_steps=4, gradient_accumulation_steps=1, steps_per_generation=2,
                      rollout_backend="train_helpers:CountingBackend")
    GRPOTrainer(model=str(tiny_model_dir), config=cfg, train_dataset=train_rows, reward_funcs=char_reward).train()
    assert CountingBackend.events == ["sync", "generate", "sync", "generate"]
