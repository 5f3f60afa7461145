"""`algorithm: ppo` in the config: the preset, G = 1, PPO's own fields and the options it refuses."""

from __future__ import annotations

import pytest

from grouprl import GRPOConfig
from grouprl.errors import ConfigError


def test_ppo_preset_and_one_completion_per_prompt():
    cfg = GRPOConfig(algorithm="ppo", num_generations=1, per_device_train_batch_size=4)
    assert (cfg.policy_loss, cfg.loss_aggregation, cfg.kl_coef, cfg.dynamic_sampling) == ("grpo", "token_mean", 0.0,
                                                                                         "none")
    assert (cfg.epsilon, cfg.epsilon_high, cfg.gamma, cfg.lam, cfg.kl_mode) == (0.2, 0.2, 1.0, 0.95, "reward")
    assert cfg.prompts_per_generation == 4
    assert cfg.resolved()["loss_hparams"]["eps_low"] == 0.2


def test_group_algorithms_still_need_two_completions_and_the_message_names_ppo():
    with pytest.raises(ConfigError, match="algorithm: ppo needs no groups"):
        GRPOConfig(num_generations=1)
    with pytest.raises(ConfigError, match="as every group algorithm does \\(algorithm=.gspo.\\)"):
        GRPOConfig(algorithm="gspo", num_generations=1)


@pytest.mark.parametrize("kw,match", [
    (dict(vf_coef=0.5), "only algorithm: ppo has a critic"),
    (dict(critic_model="x", gamma=0.9), "critic_model, gamma set with algorithm='grpo'"),
])
def test_ppo_fields_with_another_algorithm_are_errors(kw, match):
    with pytest.raises(ConfigError, match=match):
        GRPOConfig(**kw)


@pytest.mark.parametrize("kw,match", [
    (dict(advantage="rloo"), "PPO's advantages come from GAE"),
    (dict(scale_rewards="batch"), "PPO's advantages come from GAE"),
    (dict(dynamic_sampling="drop"), "only a group baseline needs"),
    (dict(use_peft=True), "LoRA critic is not implemented"),
    (dict(gamma=1.5), "gamma=1.5 must be >= 0.0 and <= 1.0"),
    (dict(lam=-0.1), "lam=-0.1 must be"),
    (dict(vf_coef=0.0), "vf_coef=0.0 must be > 0.0"),
    (dict(cliprange_value=0.0), "cliprange_value=0.0 must be > 0.0"),
    (dict(kl_mode="both"), "kl_mode='both' must be one of 'reward', 'loss'"),
    (dict(critic_learning_rate=-1.0), "critic_learning_rate=-1.0 must be > 0.0"),
])
def test_ppo_options_are_checked(kw, match):
    with pytest.raises(ConfigError, match=match):
        GRPOConfig(algorithm="ppo", num_generations=1, per_device_train_batch_size=4, **kw)


def test_ppo_fields_have_docs():
    docs = GRPOConfig.field_docs()
    for name in ("critic_model", "critic_learning_rate", "vf_coef", "cliprange_value", "gamma", "lam",
                 "whiten_advantages", "kl_mode"):
        assert "arXiv" in docs[name] or "PPO" in docs[name] or "critic" in docs[name], name
    assert GRPOConfig(algorithm="ppo", num_generations=1, per_device_train_batch_size=4,
                      cliprange_value=None).cliprange_value is None


def test_a_saved_ppo_config_round_trips_and_a_saved_grpo_config_is_not_mistaken_for_ppo(tmp_path):
    # a saved config sets every field explicitly, the PPO fields at their defaults included
    for cfg in (GRPOConfig(algorithm="ppo", num_generations=1, per_device_train_batch_size=4, gamma=0.99),
                GRPOConfig()):
        cfg.to_yaml(tmp_path / "c.yaml")
        back = GRPOConfig.from_yaml(tmp_path / "c.yaml")
        assert back == cfg and back.resolved() == cfg.resolved()
