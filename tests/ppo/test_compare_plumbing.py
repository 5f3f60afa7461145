"""benchmarks/compare_algorithms.py: the sample budget, the summary multiples and the table, on made-up runs."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from grouprl import GRPOConfig

PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "compare_algorithms.py"
spec = importlib.util.spec_from_file_location("compare_algorithms", PATH)
cmp = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cmp)


def test_sample_budget_of_on_and_off_policy_runs():
    grpo = GRPOConfig(num_generations=8, per_device_train_batch_size=128)
    assert cmp.budget(grpo, 20) == {"kind": "completions", "per_update": 128.0, "total": 2560, "prompts": 320,
                                    "num_generations": 8, "updates_per_round": 1}
    # gspo off-policy: a round of 64 x 4 = 256 completions feeds 2 updates of 2 micro-batches -> 10 rounds
    gspo = GRPOConfig(algorithm="gspo", per_device_train_batch_size=64, gradient_accumulation_steps=2,
                      steps_per_generation=4)
    assert cmp.budget(gspo, 20)["total"] == 2560 and cmp.budget(gspo, 20)["updates_per_round"] == 2
    ppo = GRPOConfig(algorithm="ppo", num_generations=1, per_device_train_batch_size=128)
    assert cmp.budget(ppo, 3) == {"kind": "completions", "per_update": 128.0, "total": 384, "prompts": 384,
                                  "num_generations": 1, "updates_per_round": 1}


def _run(alg, seed, after, models):
    return {"algorithm": alg, "seed": seed, "steps": 2, "before": 0.1, "after": after, "eval_prompts": 200,
            "seconds_per_update": 2.0 + seed, "clip_frac_mean": 0.0, "budget": {"kind": "completions", "total": 256, "prompts": 32,
                                                         "num_generations": 8}, "models": models,
            "peak_rss": 800, "rss_base": 600}


def test_summary_means_over_seeds_and_multiples_of_the_policy_parameters():
    # policy 100 B params + 100 grads + 200 Adam states = 400 (4x); reference 100 (1x); critic 90+90+180 (3.6x)
    models = {"policy": {"params": 100, "grads": 100, "optimizer": 200},
              "reference": {"params": 100, "grads": 0, "optimizer": 0},
              "critic": {"params": 90, "grads": 90, "optimizer": 180}}
    runs = [_run("ppo", 0, 0.5, models), _run("ppo", 1, 0.7, models), {"algorithm": "dpo", "seed": 0, "error": "x"}]
    s = cmp.summarize(runs)
    assert s["ppo"]["after"] == pytest.approx(0.6) and s["ppo"]["seconds_per_update"] == pytest.approx(2.5)
    assert s["ppo"]["models"]["policy"]["x_policy_params"] == 4.0
    assert s["ppo"]["models"]["critic"]["x_policy_params"] == 3.6
    assert s["ppo"]["weights_x"] == 2.9 and s["ppo"]["train_state_x"] == 8.6  # (400 + 100 + 360) / 100
    assert s["ppo"]["peak_rss_x"] == 8.0 and s["ppo"]["rss_rise_x"] == 2.0
    assert s["dpo"] == {"error": "x"}
    table = cmp.markdown(s, ["dpo skipped: a note"])
    assert "| ppo | 10.0% → **60.0%** (seeds: 50.0, 70.0) | 2 |" in table
    assert "| dpo | failed: x |" in table and "- dpo skipped: a note" in table
