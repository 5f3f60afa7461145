"""Two gloo ranks train exactly like one process with the same global batch (issue 13).

Each test launches 2 CPU processes (``dist_harness.run_ranks``) once and runs every case inside them.
"""

from __future__ import annotations

import pytest
import torch
from dist_harness import run_ranks, values
from dist_workers import equality_cases, train_two_steps

from grouprl.builtins import load_builtins
from grouprl.registry import ADVANTAGES, AGGREGATIONS

REWARDS = torch.tensor([[1.0, 0.0], [1.0, 1.0], [0.0, 0.0], [3.0, 1.0]])  # 4 groups of G=2; 2 per rank


@pytest.fixture(scope="module")
def two_ranks(tiny_model_dir, tmp_path_factory):
    """One 2-process launch running every case; (cases, per-rank results)."""
    load_builtins()
    cases = [(agg, ga, "sgd") for agg in sorted(AGGREGATIONS.names()) for ga in (1, 2)]
    assert len(cases) >= 6  # token_mean, seq_mean_token_mean, seq_mean_token_sum_norm, x (no GA, GA=2)
    cases += [("token_mean", 2, "sgd_clip"), ("token_mean", 2, "adamw"), ("seq_mean_token_sum_norm", 1, "adamw")]
    results = run_ranks(equality_cases, 2, str(tiny_model_dir), cases, REWARDS,
                        workdir=tmp_path_factory.mktemp("ranks"), timeout=240)
    return cases, values(results)


def test_two_ranks_match_one_process_for_every_aggregation(tiny_model_dir, two_ranks):
    from transformers import AutoModelForCausalLM

    cases, ranks = two_ranks
    start = {k: v.detach() for k, v in AutoModelForCausalLM.from_pretrained(tiny_model_dir).named_parameters()}
    for case in cases:
        one = train_two_steps(str(tiny_model_dir), *case, world=1, rank=0)
        moved = max(float((one[k] - start[k]).abs().max()) for k in one)
        assert moved > 1e-4, f"{case}: the reference did not train"
        for r, got in enumerate(ranks):
            worst = max(float((got[case][k] - one[k]).abs().max()) for k in one)
            # AdamW: lr 1e-3 x (noise / (|g| + eps)) where a gradient is ~0 (see train_two_steps)
            assert worst <= (1e-5 if case[2] == "adamw" else 1e-6), f"{case}: rank {r} differs by {worst:.3g}"


def test_batch_scaled_advantages_see_every_rank(two_ranks):
    """``scale_rewards=batch`` divides by the std of the GLOBAL batch; ``group`` stays per group."""
    _, ranks = two_ranks
    grpo = ADVANTAGES.get("grpo")
    for scale in ("batch", "group"):
        got = torch.cat([r["advantages"][scale] for r in ranks])
        torch.testing.assert_close(got, grpo(REWARDS, scale=scale), rtol=0, atol=1e-7)
    # the batch std of all 8 rewards differs from that of one rank's 4: local statistics would fail above
    assert not torch.allclose(grpo(REWARDS[:2], scale="batch"), grpo(REWARDS, scale="batch")[:2])


def test_every_rank_starts_from_rank_0s_weights(tiny_model_dir, two_ranks):
    from transformers import AutoModelForCausalLM

    _, ranks = two_ranks
    start = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    for r in ranks:  # rank 1 had added 1.0 to every parameter before the broadcast
        assert all(torch.equal(r["broadcast"][k], start[k]) for k in start)
