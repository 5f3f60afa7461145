"""The loss mask through Rollout.select / concat_rollouts and into the micro-batches, times the other masks."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from grouprl.rollout.base import Rollout, concat_rollouts
from grouprl.train.algorithms.rounds import RoundBatch, micro_batches
from grouprl.train.metrics import Timers, round_metrics


def rollout(loss_mask, completion_mask, truncated, trajectories=None):
    n, t = len(loss_mask), len(loss_mask[0])
    return Rollout(torch.ones((n, 2), dtype=torch.long), torch.ones((n, 2), dtype=torch.long),
                   torch.full((n, t), 5), torch.tensor(completion_mask), torch.tensor(truncated),
                   ["c"] * n, ["p"] * n, loss_mask=torch.tensor(loss_mask), trajectories=trajectories)


def test_select_and_concat_carry_the_loss_mask_right_padded_with_zeros():
    a = rollout([[1, 0, 1], [1, 1, 0]], [[1, 1, 1], [1, 1, 0]], [False, True], ["ta", "tb"])
    b = rollout([[1, 0]], [[1, 1]], [False], ["tc"])
    picked = a.select([1])
    assert picked.loss_mask.tolist() == [[1, 1, 0]] and picked.trajectories == ["tb"]
    both = concat_rollouts([a, b], pad_id=0)
    assert both.loss_mask.tolist() == [[1, 0, 1], [1, 1, 0], [1, 0, 0]] and both.trajectories == ["ta", "tb", "tc"]
    single = Rollout(*[getattr(a, k) for k in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask",
                                               "truncated", "completions", "prompts")])
    assert concat_rollouts([single, a], pad_id=0).loss_mask is None  # single-turn parts: no loss mask


def test_micro_batches_multiply_the_loss_mask_with_truncation_and_unknown_rewards():
    r = rollout([[1, 0, 1, 1], [1, 0, 0, 1], [1, 1, 0, 0], [1, 1, 1, 0]],
                [[1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 1, 0]], [False, True, False, False])
    cfg = SimpleNamespace(mask_truncated_completions=True, effective_steps_per_generation=1, needs_old_logp=False,
                          temperature=1.0)
    ctx = SimpleNamespace(cfg=cfg, reference=None)
    rewards = torch.tensor([[1.0, 0.0], [float("nan"), 0.5]])
    (mb,) = micro_batches(ctx, RoundBatch(r, torch.zeros(4), rewards), Timers())
    # row 1 truncated, row 2 reward unknown: no loss; rows 0 and 3 keep their model tokens only
    assert mb.loss_mask.tolist() == [[1, 0, 1, 1], [0, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 0]]
    m = round_metrics([], rewards, [[]] * 4, r, torch.zeros(4), torch.zeros(2, dtype=torch.bool))
    assert m["completions/mean_length"] == (3 + 2 + 2 + 3) / 4  # model tokens, not the 4 + 4 + 3 + 3 real ones
