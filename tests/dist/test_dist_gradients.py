"""Two gloo ranks train exactly like one process with the same global batch (issue 13).

Each test launches 2 CPU processes (``dist_harness.run_ranks``) once and runs every case inside them.
"""

from __future__ import annotations

import torch
from dist_harness import run_ranks, values
from dist_workers import batch_advantage, equality_cases, train_two_steps

from grouprl.builtins import load_builtins
from grouprl.registry import ADVANTAGES, AGGREGATIONS


def test_two_ranks_match_one_process_for_every_aggregation(tiny_model_dir, tmp_path):
    load_builtins()
    cases = [(agg, ga, "sgd") for agg in sorted(AGGREGATIONS.names()) for ga in (1, 2)]
    assert len(cases) >= 6  # token_mean, seq_mean_token_mean, seq_mean_token_sum_norm, x (no GA, GA=2)
    cases += [("token_mean", 2, "adamw"), ("seq_mean_token_sum_norm", 1, "adamw")]
    ranks = values(run_ranks(equality_cases, 2, str(tiny_model_dir), cases, workdir=tmp_path, timeout=240))
    start = {k: v.detach() for k, v in
             __import__("transformers").AutoModelForCausalLM.from_pretrained(tiny_model_dir).named_parameters()}
    for case in cases:
        one = train_two_steps(str(tiny_model_dir), *case, world=1, rank=0)
        moved = max(float((one[k] - start[k]).abs().max()) for k in one)
        assert moved > 1e-4, f"{case}: the reference did not train"
        for r, got in enumerate(ranks):
            worst = max(float((got[case][k] - one[k]).abs().max()) for k in one)
            # AdamW: lr 1e-3 x (noise / (|g| + eps)) where a gradient is ~0 (see train_two_steps)
            assert worst <= (1e-6 if case[2] == "sgd" else 1e-5), f"{case}: rank {r} differs from one process by {worst:.3g}"


def test_batch_scaled_advantages_see_every_rank(tmp_path):
    """``scale_rewards=batch`` divides by the std of the GLOBAL batch; ``group`` stays per group."""
    load_builtins()
    rewards = torch.tensor([[1.0, 0.0], [1.0, 1.0], [0.0, 0.0], [3.0, 1.0]])  # 4 groups of G=2; 2 per rank
    ranks = values(run_ranks(batch_advantage, 2, rewards, ["batch", "group"], workdir=tmp_path, timeout=120))
    for scale in ("batch", "group"):
        expected = ADVANTAGES.get("grpo")(rewards, scale=scale)
        torch.testing.assert_close(torch.cat([r[scale] for r in ranks]), expected, rtol=0, atol=1e-7)
    # batch std of all 8 rewards = sqrt(1.1875): local halves alone would give other numbers
    local = ADVANTAGES.get("grpo")(rewards[:2], scale="batch")
    assert not torch.allclose(local, ADVANTAGES.get("grpo")(rewards, scale="batch")[:2])
