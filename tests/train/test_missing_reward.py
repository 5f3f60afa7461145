"""missing_reward: a None from any reward function makes a completion's reward unknown ('exclude': NaN, left
out of its group's statistics, advantage 0, no loss and not counted by the normalisers) or 0 ('zero')."""

from __future__ import annotations

import contextlib
import math
from types import SimpleNamespace

import pytest
import torch

from grouprl.builtins import load_builtins
from grouprl.config import GRPOConfig
from grouprl.data.stream import PromptStream
from grouprl.rollout.base import Rollout
from grouprl.train.algorithms.grpo import advantage_function
from grouprl.train.algorithms.rounds import RunContext, generate_round
from grouprl.train.engine.step import step_totals
from grouprl.train.metrics import Timers
from grouprl.train.score import RewardScorer


class Backend:
    """Completion k of every prompt is the text 'k', k+1 tokens long (none truncated)."""

    def generate(self, prompts, n, params):
        N = len(prompts) * n
        lengths = torch.tensor([k + 1 for _ in prompts for k in range(n)])
        mask = (torch.arange(n + 1).unsqueeze(0) < lengths.unsqueeze(1)).long()
        return Rollout(torch.ones(N, 2, dtype=torch.long), torch.ones(N, 2, dtype=torch.long),
                       torch.full((N, n + 1), 7).masked_fill(mask == 0, 0), mask, torch.zeros(N, dtype=torch.bool),
                       [str(k) for _ in prompts for k in range(n)], [p for p in prompts for _ in range(n)])


def value(completions, **kw):
    return [float(c) for c in completions]


def sandbox(completions, **kw):  # "fails" (None) on completion 1 of each group
    return [None if c == "1" else 1.0 for c in completions]


def _round(missing):
    load_builtins()
    cfg = GRPOConfig(num_generations=4, per_device_train_batch_size=4, gradient_accumulation_steps=2, seed=0,
                     missing_reward=missing, loss_aggregation="seq_mean_token_mean")
    rows = [{"prompt": f"p{i}"} for i in range(2)]
    ctx = RunContext(cfg, None, SimpleNamespace(pad_token_id=0), Backend(),
                     RewardScorer([value, sandbox], missing=missing), advantage_function(cfg), None,
                     contextlib.nullcontext, rows, 0, 10)
    return generate_round(ctx, PromptStream(2, 2, seed=0), Timers())


def test_exclude_none_gives_no_advantage_no_loss_and_is_not_counted():
    rnd = _round("exclude")
    # totals per group: [0+1, unknown, 2+1, 3+1] = [1, NaN, 3, 4]; mean 8/3, population std sqrt(14/9)
    std = math.sqrt(14 / 9)
    expected = torch.tensor([(1 - 8 / 3) / std, 0.0, (3 - 8 / 3) / std, (4 - 8 / 3) / std])
    adv = torch.cat([mb.adv for mb in rnd.micro_batches])
    torch.testing.assert_close(adv, expected.repeat(2), atol=1e-6, rtol=0)
    masks = torch.cat([mb.loss_mask for mb in rnd.micro_batches])
    assert masks[1].sum() == 0 and masks[5].sum() == 0  # the unknown rows have no loss tokens
    totals = step_totals(rnd.micro_batches, 8)
    # 8 rows, 2 excluded; tokens 1+3+4 per group (row lengths k+1, row 1 excluded)
    assert totals["num_seqs"] == 6 and totals["num_tokens"] == 2 * (1 + 3 + 4)
    assert rnd.metrics["reward"] == pytest.approx(8 / 3) and rnd.metrics["reward/frac_unknown"] == 0.25


def test_zero_counts_none_as_zero():
    rnd = _round("zero")
    # totals [0+1, 1+0, 2+1, 3+1] = [1, 1, 3, 4]: mean 9/4, population std sqrt(27/16)
    expected = torch.tensor([-1.25, -1.25, 0.75, 1.75]) / math.sqrt(27 / 16)
    adv = torch.cat([mb.adv for mb in rnd.micro_batches])
    torch.testing.assert_close(adv, expected.repeat(2), atol=1e-6, rtol=0)
    totals = step_totals(rnd.micro_batches, 8)
    assert totals["num_seqs"] == 8 and totals["num_tokens"] == 2 * (1 + 2 + 3 + 4)
    assert rnd.metrics["reward/frac_unknown"] == 0.0


def test_step_totals_count_only_sequences_with_loss_tokens():
    from grouprl.train.engine.step import MicroBatch

    mask = torch.tensor([[1, 1, 0], [0, 0, 0], [1, 0, 0]])  # row 1 emptied (truncated or unknown reward)
    ones = torch.ones(3, 2, dtype=torch.long)
    mb = MicroBatch(ones, ones, torch.zeros(3, 3, dtype=torch.long), torch.ones(3, 3, dtype=torch.long), mask,
                    torch.zeros(3))
    assert step_totals([mb, mb], 3) == {"num_tokens": 6, "num_seqs": 4, "max_len": 3}


def test_zero_std_groups_uses_the_advantage_tolerance():
    from grouprl.algo.advantages import grpo_advantages
    from grouprl.train.algorithms.rounds import zero_std_groups

    # float32 rewards that differ by ~1e-10: std far below grpo's eps = 1e-8, so its advantages are all 0
    rewards = torch.tensor([[0.001] * 4, [0.0, 1.0, 0.0, 1.0], [2.0, 2.0, float("nan"), 2.0],
                            [1.0, float("nan"), float("nan"), float("nan")]])
    rewards[0, 3] = torch.nextafter(rewards[0, 3], torch.tensor(1.0))  # the next float32 after 0.001
    assert rewards[0, 3] != rewards[0, 0]
    assert torch.equal(grpo_advantages(rewards)[0], torch.zeros(4))
    assert zero_std_groups(rewards).tolist() == [True, False, True, True]
