"""TRL's documented environment examples and reward helpers run unchanged under grouprl's GRPOTrainer.

The classes are TRL's, verbatim (``trl_examples.py``, ``trl_example_dataset.py``); the policy is scripted
(the tiny model's sampling replaced by fixed text) so the rewards are known: a rollout that calls
``increment`` with the right step earns ``get_reward() == 1.0``, one that answers without calling earns 0.0.
The reward helpers are the real ``trl.rewards`` functions (trl is in the ``test`` extra).
"""

from __future__ import annotations

import json
import re

import pytest
from fn_engine import FN, FnEngine

from grouprl import GRPOConfig, GRPOTrainer
from grouprl.errors import ConfigError

E = "<|im_end|>"


def scripted_increment(tokenizer, right: bool = True):
    """Every first turn calls ``increment`` with the number in the prompt (+1 when not ``right``); the second
    turn answers."""

    def generate(prompts, budgets, params):
        out = []
        for ids in prompts:
            text = tokenizer.decode(ids)
            if text.count("<|im_start|>assistant") > 1:
                reply = "Done." + E
            else:
                n = int(re.findall(r"(?:by|to) (\d+)\.", text)[-1]) + (0 if right else 1)
                call = json.dumps({"name": "increment", "arguments": {"step": n}})
                reply = f"<tool_call>{call}</tool_call>{E}"
            out.append(tokenizer.encode(reply, add_special_tokens=False))
        return out

    return generate


def config(tmp_path, **kw):
    base = dict(output_dir=str(tmp_path / "out"), rollout_backend=FN, num_generations=2, per_device_train_batch_size=4,
                gradient_accumulation_steps=1, max_new_tokens=64, max_prompt_length=256, max_steps=2,
                learning_rate=1e-3, progress_bar=False, save_strategy="no", seed=0, eval_split=None,
                log_completions_steps=1, num_completions_to_log=4)
    base.update(kw)
    return GRPOConfig(**base)


def metrics(tmp_path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]


def test_example_1_no_dataset_env_owns_prompt_and_reward(tmp_path, tiny_model_dir, monkeypatch):
    from trl_examples import IncrementEnv

    monkeypatch.setattr(FnEngine, "policy", staticmethod(lambda model, tok, stop_ids=None, **kw: scripted_increment(tok)))
    trainer = GRPOTrainer(model=str(tiny_model_dir),
                          args=config(tmp_path, chat_template_kwargs={"enable_thinking": False}),
                          environment_factory=IncrementEnv)
    assert trainer.reward_funcs == []  # no implicit accuracy: the environment owns the reward
    trainer.train()
    rows = metrics(tmp_path)
    assert [r["rewards/IncrementEnv/mean"] for r in rows] == [1.0, 1.0]  # TRL's name: the class name
    assert all(r["reward"] == 1.0 and "rewards/accuracy/mean" not in r for r in rows)
    sample = json.loads((tmp_path / "out" / "samples.jsonl").read_text().splitlines()[0])
    first_user = sample["messages"][0]
    assert first_user["role"] == "user" and re.fullmatch(r"Increment the counter by [1-6]\.", first_user["content"])


def test_example_1_needs_max_steps(tmp_path, tiny_model_dir):
    from trl_examples import IncrementEnv

    with pytest.raises(ConfigError, match="max_steps"):
        GRPOTrainer(model=str(tiny_model_dir), args=config(tmp_path, max_steps=-1, num_train_epochs=1),
                    environment_factory=IncrementEnv)


def test_example_2_dataset_target_column_env_reward(tmp_path, tiny_model_dir, monkeypatch):
    from trl_example_dataset import IncrementEnv, dataset

    monkeypatch.setattr(FnEngine, "policy", staticmethod(lambda model, tok, stop_ids=None, **kw: scripted_increment(tok, False)))
    seen = {}

    def reads_envs(completions, environments, **kwargs):  # TRL passes one environment per completion
        seen["envs"] = environments
        return [0.0] * len(completions)

    trainer = GRPOTrainer(model=str(tiny_model_dir), train_dataset=dataset, environment_factory=IncrementEnv,
                          args=config(tmp_path, max_steps=1))
    assert trainer.reward_funcs == []
    trainer.train()
    row = metrics(tmp_path)[0]
    assert row["rewards/IncrementEnv/mean"] == 0.0 and row["reward"] == 0.0  # off by one: counter != target
    assert row["reward/frac_unknown"] == 0.0  # scored (0), not "no opinion"
    # with a reward function next to it: both sources summed, the function sees the environments
    trainer = GRPOTrainer(model=str(tiny_model_dir), train_dataset=dataset, environment_factory=IncrementEnv,
                          reward_funcs=reads_envs, args=config(tmp_path / "b", max_steps=1))
    trainer.train()
    envs = seen["envs"]
    assert len(envs) == 4 and all(type(e).__name__ == "IncrementEnv" for e in envs)
    assert all(e.counter == e.target + 1 for e in envs)  # the state each rollout left


def test_environment_without_reward_and_no_reward_funcs_is_an_error(tmp_path, tiny_model_dir):
    class NoReward:
        def reset(self, **kwargs) -> str:
            return "Say hi."

        def wave(self, times: int) -> str:
            """Wave.

            Args:
                times: how many times.
            """
            return "waved"

    with pytest.raises(ConfigError, match="no reward source"):
        GRPOTrainer(model=str(tiny_model_dir), args=config(tmp_path), environment_factory=NoReward)


def test_close_hook_runs_once_per_rollout_and_is_not_a_tool(tmp_path, tiny_model_dir, monkeypatch):
    from grouprl.envs import make_env_factory

    closed = []

    class Session:
        def reset(self, **kwargs) -> str:
            self.started = True
            return "Increment the counter by 2."

        def increment(self, step: int) -> int:
            """Increment.

            Args:
                step: by how much.
            """
            return step

        def get_reward(self) -> float:
            return 1.0

        def close(self) -> None:
            closed.append(self)

    assert [t["function"]["name"] for t in make_env_factory(environment_factory=Session)().tools] == ["increment"]
    monkeypatch.setattr(FnEngine, "policy", staticmethod(lambda model, tok, stop_ids=None, **kw: scripted_increment(tok)))
    GRPOTrainer(model=str(tiny_model_dir), args=config(tmp_path, max_steps=1), environment_factory=Session).train()
    rollouts = [s for s in closed if getattr(s, "started", False)]  # the others are the start-up schema probes
    assert len(rollouts) == 4 and len({id(s) for s in rollouts}) == 4  # 2 prompts x 2 generations, closed once each


def test_trl_reward_helpers_run_unchanged():
    from trl.rewards import get_repetition_penalty_reward, get_soft_overlong_punishment

    from grouprl.rewards import make_reward_func
    from grouprl.rewards.adapters import reward_form
    from grouprl.train.score import RewardScorer

    overlong = get_soft_overlong_punishment(max_completion_len=100, soft_punish_cache=20)
    repetition = get_repetition_penalty_reward(ngram_size=2, max_penalty=-1.0)
    assert reward_form(overlong) == reward_form(repetition) == "batch"  # by signature: completion_ids, **kwargs
    ids = [[1] * 90, [1, 2, 3, 4], [5] * 5]
    scorer = RewardScorer([make_reward_func(overlong), make_reward_func(repetition)])
    totals, components = scorer.score(["p"] * 3, ["a", "b", "c"], {}, completion_ids=ids)
    # overlong: 90 tokens in (80, 100] -> (80 - 90) / 20 = -0.5; 4 and 5 tokens -> 0
    # repetition (bigrams): [1]*90 -> 89 bigrams, 1 unique -> (1 - 1/89) * -1; [1,2,3,4] -> 0; [5]*5 -> -0.75
    assert components[0][0] == pytest.approx(-0.5) and components[0][1] == pytest.approx(-(1 - 1 / 89))
    assert components[1] == [0.0, 0.0] and components[2] == [0.0, pytest.approx(-0.75)]
    assert totals[2] == pytest.approx(-0.75)
    assert scorer.names == ["soft_overlong_punishment_reward", "repetition_penalty_reward"]
