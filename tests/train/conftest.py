"""Fixtures for the trainer tests: a tiny arithmetic dataset and a fast config."""

from __future__ import annotations

import pytest
from train_helpers import TRAIN_ROWS


@pytest.fixture
def train_rows():
    return [dict(r) for r in TRAIN_ROWS]


@pytest.fixture
def fast_config(tmp_path):
    """A GRPOConfig factory: 2 steps, G=4, 8 completions per step, 8 new tokens."""
    from grouprl import GRPOConfig

    def make(**overrides):
        base = dict(output_dir=str(tmp_path / "out"), num_generations=4, per_device_train_batch_size=4,
                    gradient_accumulation_steps=2, max_new_tokens=8, max_prompt_length=64, max_steps=2,
                    learning_rate=1e-3, progress_bar=False, save_strategy="no", seed=0, eval_split=None,
                    log_completions_steps=1)
        base.update(overrides)
        return GRPOConfig(**base)

    return make
