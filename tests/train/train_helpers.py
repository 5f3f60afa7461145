"""Shared data and helpers of the trainer tests (imported by name; fixtures live in conftest.py)."""

from __future__ import annotations

import json
import math

TRAIN_ROWS = [{"prompt": f"What is {i} + {i + 1}?", "answer": str(2 * i + 1)} for i in range(8)]

# every metric the issue asks for (section 6), as logged in metrics.jsonl
REQUIRED_METRICS = [
    "reward", "reward_std", "frac_reward_zero_std",
    "advantage/mean", "advantage/std", "advantage/min", "advantage/max",
    "kl", "entropy",
    "policy/clip_frac_low", "policy/clip_frac_high", "policy/clip_frac",
    "policy/ratio_min", "policy/ratio_mean", "policy/ratio_max",
    "completions/mean_length", "completions/min_length", "completions/max_length", "completions/truncated_frac",
    "grad_norm", "lr", "loss/policy", "tokens_per_s",
    "time/generate", "time/score", "time/update", "time/step",
    "time/reward", "time/ref_forward", "time/old_logp_forward", "time/policy_fwd_bwd", "time/optimizer", "time/other",
]


def char_reward(completions, prompts=None, **kwargs):
    """Deterministic, varied reward: the fraction of ASCII letters in the completion."""
    out = []
    for c in completions:
        text = c if isinstance(c, str) else c[0]["content"]
        out.append(sum(ch.isalpha() for ch in text) / max(1, len(text)))
    return out


def alpha_fraction(completion, *, answer=None, **kwargs):
    """Per-sample form of char_reward, for recipes (``reward_funcs: [train_helpers:alpha_fraction]``)."""
    return char_reward([completion])[0]


def length_reward(completions, prompts=None, **kwargs):
    return [len(c if isinstance(c, str) else c[0]["content"]) % 5 / 4 for c in completions]


def read_metrics(output_dir):
    with open(f"{output_dir}/metrics.jsonl") as f:
        return [json.loads(line) for line in f]


def train_records(output_dir):
    return [r for r in read_metrics(output_dir) if "reward" in r]


def is_finite(x):
    return isinstance(x, (int, float)) and math.isfinite(x)


class CountingBackend:
    """The transformers backend, counting ``sync_weights`` calls and the generations between them
    (``rollout_backend: "train_helpers:CountingBackend"``)."""

    events: list[str] = []

    def __init__(self, model, tokenizer, **kwargs):
        from grouprl.rollout.hf import TransformersBackend

        self.inner = TransformersBackend(model, tokenizer, **kwargs)

    def sync_weights(self, model):
        CountingBackend.events.append("sync")
        self.inner.sync_weights(model)

    def generate(self, prompts, n, params):
        CountingBackend.events.append("generate")
        return self.inner.generate(prompts, n, params)
