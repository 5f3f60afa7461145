"""One generation round without a model: dynamic sampling (drop / resample) and truncation masking."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
import torch
from train_helpers import train_records

from grouprl.builtins import load_builtins
from grouprl.config import GRPOConfig
from grouprl.data.stream import PromptStream
from grouprl.rollout.base import Rollout
from grouprl.train.algorithms.grpo import advantage_function
from grouprl.train.algorithms.rounds import RunContext, generate_round
from grouprl.train.engine.step import step_totals
from grouprl.train.metrics import Timers
from grouprl.train.score import RewardScorer


class FakeBackend:
    """Completion k of a prompt is 'k', k+1 tokens long; completion G-1 never ends (truncated)."""

    def __init__(self):
        self.calls = 0

    def generate(self, prompts, n, params):
        self.calls += 1
        N, T = len(prompts) * n, n
        lengths = torch.tensor([k + 1 for _ in prompts for k in range(n)])
        mask = (torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)).long()
        return Rollout(torch.ones(N, 2, dtype=torch.long), torch.ones(N, 2, dtype=torch.long),
                       torch.full((N, T), 7).masked_fill(mask == 0, 0), mask, lengths == T,
                       [str(k) for _ in prompts for k in range(n)], [p for p in prompts for _ in range(n)])


def reward(completions, prompts, **kw):
    """Groups of 'same' prompts all score 1 (zero std); 'vary' prompts score k."""
    return [1.0 if p.startswith("same") else float(c) for c, p in zip(completions, prompts)]


def _ctx(rows, **cfg_kw):
    load_builtins()
    cfg = GRPOConfig(num_generations=4, per_device_train_batch_size=4, gradient_accumulation_steps=2, seed=0,
                     **cfg_kw)
    return RunContext(cfg, None, SimpleNamespace(pad_token_id=0), FakeBackend(), RewardScorer([reward]),
                      advantage_function(cfg), None, contextlib.nullcontext, rows, 0, 10)


ROWS = [{"prompt": "same a"}, {"prompt": "same b"}, {"prompt": "same c"}, {"prompt": "vary d"},
        {"prompt": "same e"}, {"prompt": "vary f"}, {"prompt": "same g"}, {"prompt": "same h"}]


def _prompts_of(rnd):
    return {s["prompt"] for s in rnd.samples}


def test_no_dynamic_sampling_keeps_every_group():
    ctx = _ctx(ROWS, dynamic_sampling="none", num_completions_to_log=8)
    stream = PromptStream(len(ROWS), 2, seed=3)
    rnd = generate_round(ctx, stream, Timers())
    assert rnd.metrics["dynamic/kept_groups"] == 2 and ctx.backend.calls == 1
    assert sum(mb.prompt_ids.shape[0] for mb in rnd.micro_batches) == 8


def test_resample_fills_the_batch_with_informative_groups():
    ctx = _ctx(ROWS, dynamic_sampling="resample", max_resample_rounds=10, num_completions_to_log=8)
    stream = PromptStream(len(ROWS), 2, seed=0)
    rnd = generate_round(ctx, stream, Timers())
    assert rnd.metrics["dynamic/kept_groups"] == 2
    assert rnd.metrics["dynamic/frac_zero_std_kept"] == 0.0
    assert _prompts_of(rnd) == {"vary d", "vary f"}  # only the two informative prompts exist
    assert ctx.backend.calls == 1 + rnd.metrics["dynamic/extra_rounds"] and ctx.backend.calls >= 2
    adv = torch.cat([mb.adv for mb in rnd.micro_batches])
    # group rewards 0,1,2,3: population std sqrt(1.25); adv of the best = 1.5 / 1.1180
    assert torch.allclose(adv[:4], torch.tensor([-1.5, -0.5, 0.5, 1.5]) / 1.25 ** 0.5, atol=1e-5)


def test_resample_gives_up_after_max_rounds_and_fills_with_uninformative_groups():
    rows = [{"prompt": "same x"}, {"prompt": "same y"}]
    ctx = _ctx(rows, dynamic_sampling="resample", max_resample_rounds=2)
    rnd = generate_round(ctx, PromptStream(2, 2, seed=0), Timers())
    assert ctx.backend.calls == 3 and rnd.metrics["dynamic/extra_rounds"] == 2
    assert rnd.metrics["dynamic/kept_groups"] == 2 and rnd.metrics["dynamic/frac_zero_std_kept"] == 1.0


def test_drop_removes_zero_std_groups():
    ctx = _ctx(ROWS, dynamic_sampling="drop", num_completions_to_log=8)
    stream = PromptStream(len(ROWS), 2, seed=0)
    kept = []
    for _ in range(4):  # one epoch: 4 rounds of 2 prompts
        rnd = generate_round(ctx, stream, Timers())
        kept.append((rnd.metrics["dynamic/kept_groups"], rnd.metrics["frac_reward_zero_std"]))
        n = sum(mb.prompt_ids.shape[0] for mb in rnd.micro_batches)
        if 0 < rnd.metrics["frac_reward_zero_std"] < 1:
            assert n == 4 and _prompts_of(rnd) <= {"vary d", "vary f"}
    # every round keeps 2 - (zero-std groups), except an all-zero round, which keeps its batch (adv all 0)
    assert all(k == (2 if f in (0.0, 1.0) else 1) for k, f in kept)
    assert sorted(f for _, f in kept) != [1.0] * 4


def test_truncated_completions_are_masked_out_of_the_loss():
    ctx = _ctx([{"prompt": "vary a"}, {"prompt": "vary b"}], mask_truncated_completions=True)
    rnd = generate_round(ctx, PromptStream(2, 2, seed=0), Timers())
    for mb in rnd.micro_batches:
        truncated = mb.completion_mask.sum(dim=1) == 4
        assert (mb.loss_mask[truncated] == 0).all() and (mb.loss_mask[~truncated] == mb.completion_mask[~truncated]).all()
    # step totals count only loss tokens: lengths 1+2+3 per group (the 4-token ones are masked) x 2 groups
    assert step_totals(rnd.micro_batches, 4)["num_tokens"] == 12
    assert rnd.metrics["completions/truncated_frac"] == 0.25


def test_step_plan_from_epochs_and_batch_arithmetic():
    from grouprl.errors import DataError
    from grouprl.train.algorithms.grpo import plan_steps, should_save

    # G=4, 4 completions x 2 micro-batches = 8 per round = 2 prompts; 10 rows -> 5 rounds per epoch
    cfg = GRPOConfig(num_generations=4, per_device_train_batch_size=4, gradient_accumulation_steps=2,
                     num_train_epochs=1.5)
    assert plan_steps(cfg, 10) == (8, 1, 5)  # ceil(1.5 x 5) = 8 rounds x 1 step
    # mu = 2 passes, 4 micro-batches per round, 2 per step -> 2 x 4 / 2 = 4 steps per round
    cfg = GRPOConfig(num_generations=4, per_device_train_batch_size=4, gradient_accumulation_steps=2,
                     steps_per_generation=4, num_iterations=2, num_train_epochs=1)
    assert plan_steps(cfg, 10) == (4 * 2, 4, 2)  # 16 completions = 4 prompts per round, 2 rounds
    assert plan_steps(GRPOConfig(max_steps=3, num_generations=2, per_device_train_batch_size=2), 5)[0] == 3
    with pytest.raises(DataError, match="has 3 rows but one generation round needs 4 prompts"):
        plan_steps(cfg, 3)
    epoch = GRPOConfig(save_strategy="epoch", num_generations=2, per_device_train_batch_size=2)
    assert [s for s in range(1, 11) if should_save(epoch, s, 3, 10)] == [3, 6, 9, 10]  # and the last step
    steps = GRPOConfig(save_steps=4, num_generations=2, per_device_train_batch_size=2)
    assert [s for s in range(1, 13) if should_save(steps, s, 3, 12)] == [4, 8, 12]
    assert not any(should_save(GRPOConfig(save_strategy="no", num_generations=2, per_device_train_batch_size=2),
                                s, 3, 12) for s in range(1, 13))


def test_prompt_stream_reshuffles_each_epoch_and_restores_its_position():
    stream = PromptStream(6, 2, seed=1)
    epoch0 = [stream.next() for _ in range(3)]
    assert sorted(i for b in epoch0 for i in b) == list(range(6))
    state = stream.state()
    epoch1 = [stream.next() for _ in range(3)]
    assert sorted(i for b in epoch1 for i in b) == list(range(6)) and epoch1 != epoch0
    again = PromptStream(6, 2, seed=1)
    again.load_state(state)
    assert [again.next() for _ in range(3)] == epoch1


def test_dropped_groups_can_leave_empty_micro_batches(tiny_model_dir, fast_config):
    from grouprl import GRPOTrainer

    def one_varying_group(completions, prompts, **kw):
        return [float(len(c)) if "0 +" in p else 1.0 for c, p in zip(completions, prompts)]

    rows = [{"prompt": f"What is {i} + 1?"} for i in range(2)]
    # 2 prompts x G=4 per round in 4 micro-batches of 2; dropping one group leaves 2 micro-batches empty
    cfg = fast_config(dynamic_sampling="drop", per_device_train_batch_size=2, gradient_accumulation_steps=4,
                      kl_coef=0.1, num_iterations=2, max_steps=2, max_new_tokens=6)
    GRPOTrainer(model=str(tiny_model_dir), config=cfg, train_dataset=rows, reward_funcs=one_varying_group).train()
    records = train_records(cfg.output_dir)
    assert [r["dynamic/kept_groups"] for r in records] == [1.0, 1.0]  # mu = 2: one round, two passes
    assert all(0 < r["num_tokens"] <= 4 * 6 and r["grad_norm"] > 0 for r in records)


@pytest.mark.parametrize(("kind", "expected"), [
    ("linear", [0.0, 1.0, 2 / 3, 1 / 3]),  # warm-up 1 step (0.25 x 4), then linear decay to 0 at step 4
    ("cosine", [0.0, 1.0, 0.75, 0.25]),  # 0.5 (1 + cos(pi k / 3)), k = 0, 1, 2
    ("constant", [0.0, 1.0, 1.0, 1.0]),
])
def test_warmup_then_schedule(kind, expected):
    from grouprl.train.engine.model import build_optimizer

    cfg = GRPOConfig(learning_rate=1.0, warmup_ratio=0.25, lr_scheduler_type=kind, num_generations=2,
                     per_device_train_batch_size=2, weight_decay=0.1, adam_beta2=0.95)
    model = torch.nn.Linear(2, 2)
    optimizer, scheduler = build_optimizer(model, cfg, total_steps=4)
    assert isinstance(optimizer, torch.optim.AdamW) and optimizer.defaults["betas"] == (0.9, 0.95)
    lrs = []
    for _ in range(4):
        lrs.append(scheduler.get_last_lr()[0])
        optimizer.step()
        scheduler.step()
    assert lrs == pytest.approx(expected)


@pytest.mark.parametrize(("scale", "first_group"), [
    ("group", [0.75 / 0.1875 ** 0.5, -0.25 / 0.1875 ** 0.5]),  # group std of (1,0,0,0) = sqrt(3/16)
    ("batch", [1.5, -0.5]),  # std of all 8 rewards (1,0,0,0,1,1,1,0) = 0.5
    ("none", [0.75, -0.25]),  # r - group mean only
])
def test_scale_rewards_reaches_the_advantage_estimator(scale, first_group):

    load_builtins()
    rewards = torch.tensor([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0]])
    cfg = GRPOConfig(scale_rewards=scale, num_generations=4, per_device_train_batch_size=4)
    adv = advantage_function(cfg)(rewards)
    torch.testing.assert_close(adv[0, :2], torch.tensor(first_group), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(adv[1], -adv[0].flip(0), rtol=1e-5, atol=1e-6)  # the mirrored group
