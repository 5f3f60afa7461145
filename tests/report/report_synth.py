"""Synthetic run folders for the report tests: a healthy run, and knobs that break one thing at a time."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

import yaml


def healthy_metrics(n: int = 100, eval_every: int = 10) -> list[dict[str, Any]]:
    """A run that learns: reward and held-out accuracy rise together, nothing collapses."""
    rng = random.Random(0)
    rows = []
    for s in range(1, n + 1):
        p = 0.2 + 0.6 * (1 - math.exp(-s / 30))
        acc, fmt = p + rng.uniform(-0.03, 0.03), 0.5 + 0.3 * p
        row = {
            "step": s, "reward": acc + 0.5 * fmt, "reward_std": 0.4,
            "rewards/accuracy/mean": acc, "rewards/accuracy/std": 0.45, "rewards/accuracy/frac_none": 0.0,
            "rewards/format/mean": fmt, "rewards/format/std": 0.3, "rewards/format/frac_none": 0.0,
            "kl": 0.01 + 0.0002 * s + rng.uniform(0, 0.002), "entropy": 1.2 - 0.004 * s,
            "policy/clip_frac_low": 0.01, "policy/clip_frac_high": 0.02,
            "completions/mean_length": 20 + 0.1 * s, "completions/min_length": 5, "completions/max_length": 60,
            "completions/truncated_frac": 0.02, "frac_reward_zero_std": 0.2 + rng.uniform(-0.05, 0.05),
            "lr": 1e-5, "grad_norm": 0.5 + rng.uniform(0, 0.2), "tokens_per_s": 900.0,
            "time/generate": 0.5, "time/reward": 0.05, "time/ref_forward": 0.1, "time/policy_fwd_bwd": 0.3,
            "time/step": 0.95, "skipped_steps": 0,
        }
        if s % eval_every == 0 or s == 1:
            row.update({"eval/accuracy": p + rng.uniform(-0.01, 0.01), "eval/tag": "heldout"})
        rows.append(row)
    return rows


def samples(n: int = 100, per_step: int = 4, every: int = 5, agent: bool = False) -> list[dict[str, Any]]:
    rng = random.Random(1)
    rows = []
    for s in range(every, n + 1, every):
        for i in range(per_step):
            acc = float(rng.random() < 0.5)
            row = {"step": s, "prompt": f"Q{s}-{i}: what is {s}+{i}?", "completion": f"<think>{s}+{i}</think>Answer: {s + i}",
                   "reward": acc + 0.5, "rewards": {"accuracy": acc, "format": 1.0},
                   "advantage": acc - 0.5, "truncated": False}
            if agent:
                row.update({"tokens": ["<tool>", "calc", "</tool>", "7", "Answer", ": 7"],
                            "completion_ids": [11, 12, 13, 14, 15, 16], "loss_mask": [1, 1, 1, 0, 1, 1],
                            "num_turns": 2, "end_reason": "answer",
                            "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "calc"},
                                         {"role": "tool", "content": "7"}, {"role": "assistant", "content": "7"}],
                            "tool_calls": [{"name": "calc", "arguments": {"x": "3+4"}, "result": "7", "error": None}]})
            rows.append(row)
    rows.append({"step": n, "prompt": "held out", "completion": "Answer: 1", "reward": 1.0, "eval": "heldout"})
    return rows


def write_run(path: Path, metrics: list[dict[str, Any]], sample_rows: list[dict[str, Any]] | None = None,
              config: dict[str, Any] | None = None, meta: dict[str, Any] | None = None) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in metrics))
    (path / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in (sample_rows or [])))
    cfg = {"reward_funcs": ["accuracy", "format"], "reward_weights": [1.0, 0.5], "learning_rate": 1e-5,
           "output_dir": str(path)}
    (path / "config.yaml").write_text(yaml.safe_dump({**cfg, **(config or {})}))
    if meta is not None:
        (path / "run_meta.json").write_text(json.dumps(meta))
    return path
