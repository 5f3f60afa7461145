"""PPO end to end on the tiny model: `grouprl train` with G = 1, checkpoints with the critic, exact resume."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from train_helpers import char_reward, is_finite, train_records

from grouprl import GRPOConfig, GRPOTrainer
from grouprl.cli import main

RECIPE = Path(__file__).parent / "recipes" / "tiny_ppo.yaml"
PPO_METRICS = ["reward", "loss/policy", "loss/value", "value/mean", "value/returns_mean", "value/clip_frac",
               "value/grad_norm", "value/lr", "kl_reward", "advantage/token_std", "policy/ratio_max", "grad_norm",
               "entropy", "time/value_forward", "time/critic_update"]


def _data(tmp_path):
    rows = [{"prompt": f"{i} + 1 =", "answer": str(i + 1)} for i in range(12)]
    for split, part in (("train", rows[:8]), ("test", rows[8:])):
        (tmp_path / "data").mkdir(exist_ok=True)
        (tmp_path / "data" / f"{split}.jsonl").write_text("\n".join(json.dumps(r) for r in part))
    return tmp_path / "data"


def test_grouprl_train_runs_three_ppo_steps_with_one_completion_per_prompt(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "o"
    assert main(["train", "-c", str(RECIPE), f"model={tiny_model_dir}", f"dataset={_data(tmp_path)}",
                 f"output_dir={out}"]) == 0
    records = train_records(out)
    assert [r["step"] for r in records] == [1, 2, 3]
    for r in records:
        for key in PPO_METRICS:
            assert is_finite(r[key]), (r["step"], key, r.get(key))
        assert "frac_reward_zero_std" not in r  # a group statistic; PPO has no groups
    assert records[0]["value/mean"] == 0.0  # a zero-initialised head: every value 0 at the first rollout
    assert records[0]["policy/ratio_max"] == pytest.approx(1.0, abs=1e-5)  # on-policy first step
    assert records[1]["policy/ratio_max"] != pytest.approx(1.0, abs=1e-6)  # second step of the round: moved
    assert records[2]["value/mean"] != 0.0  # the critic learned between rounds
    evals = [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "eval/tag" in r]
    assert [e["eval/tag"] for e in evals] == ["before", "after"]  # the same held-out evaluation as GRPO
    assert (out / "critic" / "config.json").is_file() and (out / "final" / "config.json").is_file()
    state = torch.load(out / "checkpoint-3" / "trainer_state.pt", weights_only=False)
    assert {"model", "optimizer", "scheduler"} <= set(state["critic"])
    assert "trained 3 steps" in capsys.readouterr().out


def test_kl_as_a_loss_term_logs_the_kl_and_no_kl_reward(tiny_model_dir, train_rows, tmp_path):
    cfg = GRPOConfig(**_fast(tmp_path / "kl", kl_mode="loss", max_steps=1))
    GRPOTrainer(model=str(tiny_model_dir), config=cfg, train_dataset=train_rows, reward_funcs=char_reward).train()
    (r,) = train_records(cfg.output_dir)
    assert is_finite(r["kl"]) and is_finite(r["loss/kl"]) and "kl_reward" not in r


def _fast(out, **kw):
    base = dict(algorithm="ppo", output_dir=str(out), num_generations=1, per_device_train_batch_size=4,
                gradient_accumulation_steps=1, steps_per_generation=2, max_new_tokens=8, max_prompt_length=64,
                max_steps=4, learning_rate=1e-3, critic_learning_rate=1e-2, kl_coef=0.1, progress_bar=False,
                save_strategy="steps", save_steps=1, seed=0, eval_split=None, lr_scheduler_type="cosine",
                warmup_steps=1)
    return base | kw


COMPARED = ["reward", "loss/policy", "loss/value", "value/mean", "value/grad_norm", "grad_norm", "kl_reward",
            "policy/ratio_max", "advantage/token_std"]


def _same(a, b, steps):
    by_a, by_b = {r["step"]: r for r in a}, {r["step"]: r for r in b}
    for step in steps:
        for key in COMPARED:
            assert by_b[step][key] == pytest.approx(by_a[step][key], rel=1e-5, abs=1e-6), (step, key)


def test_resume_is_exact_with_the_critic(tiny_model_dir, train_rows, tmp_path):
    full = GRPOConfig(**_fast(tmp_path / "full"))
    t_full = GRPOTrainer(model=str(tiny_model_dir), config=full, train_dataset=train_rows, reward_funcs=char_reward)
    result = t_full.train()
    reference = train_records(full.output_dir)
    from transformers import AutoModelForTokenClassification

    critic_full = AutoModelForTokenClassification.from_pretrained(result["critic"]).state_dict()
    for start, steps in (("checkpoint-2", [3, 4]), ("checkpoint-1", [2, 3, 4])):  # a round boundary; mid-round
        cfg = GRPOConfig(**_fast(tmp_path / start, resume_from_checkpoint=str(tmp_path / "full" / start)))
        t = GRPOTrainer(model=str(tiny_model_dir), config=cfg, train_dataset=train_rows, reward_funcs=char_reward)
        resumed = t.train()
        _same(reference, train_records(cfg.output_dir), steps)
        for k, v in t.model.state_dict().items():
            torch.testing.assert_close(v, t_full.model.state_dict()[k], rtol=1e-5, atol=1e-6)
        critic = AutoModelForTokenClassification.from_pretrained(resumed["critic"]).state_dict()
        for k, v in critic.items():
            torch.testing.assert_close(v, critic_full[k], rtol=1e-5, atol=1e-6)
    assert not math.isclose(reference[0]["value/mean"], reference[-1]["value/mean"])


def test_resuming_a_grpo_checkpoint_as_ppo_is_a_clear_error(tiny_model_dir, train_rows, tmp_path):
    from grouprl.errors import ConfigError

    grpo = GRPOConfig(output_dir=str(tmp_path / "g"), num_generations=2, per_device_train_batch_size=4,
                      max_new_tokens=4, max_prompt_length=64, max_steps=1, progress_bar=False, eval_split=None,
                      save_strategy="steps", save_steps=1)
    GRPOTrainer(model=str(tiny_model_dir), config=grpo, train_dataset=train_rows, reward_funcs=char_reward).train()
    cfg = GRPOConfig(**_fast(tmp_path / "p", resume_from_checkpoint=str(tmp_path / "g" / "checkpoint-1")))
    t = GRPOTrainer(model=str(tiny_model_dir), config=cfg, train_dataset=train_rows, reward_funcs=char_reward)
    with pytest.raises(ConfigError, match="algorithm: 'grpo' -> 'ppo'"):  # the resume-config check names it
        t.train()


def test_a_checkpoint_without_a_critic_is_a_clear_error(tmp_path):
    from grouprl.errors import ConfigError
    from grouprl.train.algorithms.ppo import _critic_state

    with pytest.raises(ConfigError, match="holds no critic: it was not written by algorithm: ppo"):
        _critic_state({"step": 1}, tmp_path)
