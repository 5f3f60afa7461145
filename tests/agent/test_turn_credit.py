"""advantage: mt_grpo in the trainer's round: turn rewards from the trajectories, per-token advantages in the
micro-batches, and the refusal of a single-turn run."""

from __future__ import annotations

import math
from functools import partial
from types import SimpleNamespace

import pytest
import torch

from grouprl.algo.turns import mt_grpo_advantages
from grouprl.errors import ConfigError
from grouprl.rollout.base import Rollout
from grouprl.rollout.trajectory import Trajectory
from grouprl.train import turn_credit
from grouprl.train.algorithms.rounds import Scored, assemble


def _scored(masks: list[list[int]], calls: list[list[dict]], answers: list[str], rewards: list[float]) -> Scored:
    n, T = len(masks), len(masks[0])
    ids = torch.arange(1, n * T + 1).view(n, T)
    rollout = Rollout(torch.ones(n, 2, dtype=torch.long), torch.ones(n, 2, dtype=torch.long), ids,
                      torch.ones(n, T, dtype=torch.long), torch.zeros(n, dtype=torch.bool), ["x"] * n, ["p"] * n,
                      loss_mask=torch.tensor(masks), trajectories=[Trajectory([1], tool_calls=c) for c in calls])
    return Scored(rollout, torch.tensor(rewards).view(1, n), [[r] for r in rewards], ["p"] * n,
                  {"answer": answers}, rollout.trajectories)


RIGHT = {"name": "calculator", "arguments": {}, "result": "42", "error": None}
WRONG = {"name": "calculator", "arguments": {}, "result": "41", "error": None}


def test_assemble_gives_each_turn_its_advantage():
    # 4 trajectories of one prompt: right call + right answer, right call + miscopied answer,
    # wrong call (answer wrong), answered at once (wrong)
    masks = [[1, 1, 0, 1, 1], [1, 1, 0, 1, 1], [1, 1, 0, 1, 0], [1, 1, 1, 0, 0]]
    scored = _scored(masks, [[RIGHT], [RIGHT], [WRONG], []], ["42"] * 4, [1.0, 0.0, 0.0, 0.0])
    fn = partial(mt_grpo_advantages, turn_coef=1.0, turn_reward="tool_result_match")
    ctx = SimpleNamespace(cfg=SimpleNamespace(num_generations=4), advantage_fn=fn,
                          tokenizer=SimpleNamespace(pad_token_id=0))
    batch = assemble(ctx, [scored], [(0, 0)])
    s3, r3 = math.sqrt(3), 1 / math.sqrt(3)  # A^O = [sqrt3, -1/sqrt3 x3]; turn rewards [1,1,0,0] -> A^T = [1,1,-1,-1]
    expected = [[1 + s3, 1 + s3, 0, s3, s3], [1 - r3, 1 - r3, 0, -r3, -r3], [-1 - r3, -1 - r3, 0, -r3, 0],
                [-1 - r3, -1 - r3, -1 - r3, 0, 0]]
    assert batch.adv.shape == (4, 5)
    for got, want in zip(batch.adv.tolist(), expected):
        assert got == pytest.approx(want, abs=1e-5)
    # logged per row: the first turn's advantage
    assert turn_credit.row_advantages(batch.adv, batch.rollout.loss_mask).tolist() == pytest.approx(
        [1 + s3, 1 - r3, -1 - r3, -1 - r3], abs=1e-5)


def test_turn_rewards_and_the_grpo_path_unchanged():
    scored = _scored([[1, 0, 1]] * 3, [[RIGHT], [WRONG, RIGHT], [{**RIGHT, "error": "timeout"}]], ["42", "42", None],
                     [1.0, 0.0, 1.0])
    fn = partial(mt_grpo_advantages, turn_reward="tool_result_match")
    tr = turn_credit.turn_rewards(fn, scored)[0].tolist()
    assert tr[:2] == [1.0, 1.0] and math.isnan(tr[2])  # no reference answer: no opinion
    assert turn_credit.turn_rewards(partial(mt_grpo_advantages, turn_reward="tool_success"), scored)[0].tolist() == [
        1.0, 1.0, 0.0]
    from grouprl.algo.advantages import grpo_advantages

    ctx = SimpleNamespace(cfg=SimpleNamespace(num_generations=3), advantage_fn=grpo_advantages,
                          tokenizer=SimpleNamespace(pad_token_id=0))
    batch = assemble(ctx, [scored], [(0, 0)])
    assert batch.adv.shape == (3,)  # a trajectory-level estimator keeps one advantage per row


def test_config_refuses_mt_grpo_without_turns_and_unknown_turn_rewards():
    fn = partial(mt_grpo_advantages, turn_reward="tool_result_match")
    with pytest.raises(ConfigError, match="no tools or environment"):
        turn_credit.check_config(SimpleNamespace(environment=None, tools=[], advantage="mt_grpo"), fn)
    with pytest.raises(ConfigError, match="turn_reward='nope'"):
        turn_credit.check_config(SimpleNamespace(environment="calculator", tools=[], advantage="mt_grpo"),
                                 partial(mt_grpo_advantages, turn_reward="nope"))
    turn_credit.check_config(SimpleNamespace(environment="calculator", tools=[], advantage="mt_grpo"), fn)


def test_trainer_runs_mt_grpo_end_to_end(tmp_path, tiny_model_dir, monkeypatch):
    from agent_helpers import ROWS, E, use_script

    import grouprl.train.algorithms.rounds as round_mod
    from grouprl import GRPOConfig, GRPOTrainer

    seen = []
    real = round_mod.micro_batches
    monkeypatch.setattr(round_mod, "micro_batches", lambda ctx, batch, timers: seen.append(batch) or real(ctx, batch, timers))
    use_script(monkeypatch, ["<tool_call>calculator(expression='{a} + {b}')</tool_call>" + E, "{sum}" + E])
    cfg = GRPOConfig(output_dir=str(tmp_path / "out"), num_generations=2, per_device_train_batch_size=4,
                     max_new_tokens=64, max_prompt_length=128, max_steps=1, progress_bar=False, save_strategy="no",
                     seed=0, eval_split=None, environment="calculator", reward_funcs=["accuracy"],
                     advantage="mt_grpo", advantage_kwargs={"turn_coef": 0.5})
    result = GRPOTrainer(model=str(tiny_model_dir), config=cfg, train_dataset=ROWS).train()
    assert result["global_step"] == 1
    (batch,) = seen
    assert batch.adv.shape == batch.rollout.loss_mask.shape  # one advantage per token reached the loss
    assert torch.all(batch.adv[batch.rollout.loss_mask == 0] == 0)
