"""GRPOConfig: presets never override user values, TRL aliases, YAML + overrides, loud validation."""

from __future__ import annotations

import sys

import pytest

from grouprl.config import GRPOConfig
from grouprl.errors import ConfigError


def test_presets_fill_only_unset_fields():
    gspo = GRPOConfig(algorithm="gspo")
    assert (gspo.policy_loss, gspo.epsilon, gspo.epsilon_high, gspo.kl_coef) == ("gspo", 3e-4, 4e-4, 0.0)
    dapo = GRPOConfig(algorithm="dapo")
    assert (dapo.epsilon, dapo.epsilon_high, dapo.loss_aggregation) == (0.2, 0.28, "token_mean")
    assert dapo.dynamic_sampling == "resample" and dapo.mask_truncated_completions is True
    dr = GRPOConfig(algorithm="dr_grpo")
    assert (dr.advantage, dr.loss_aggregation) == ("dr_grpo", "seq_mean_token_sum_norm")
    # a value the user set survives the preset
    user = GRPOConfig(algorithm="dapo", epsilon_high=0.3, loss_aggregation="seq_mean_token_mean", kl_coef=0.02,
                      mask_truncated_completions=False, dynamic_sampling="none")
    assert (user.epsilon_high, user.loss_aggregation, user.kl_coef) == (0.3, "seq_mean_token_mean", 0.02)
    assert user.mask_truncated_completions is False and user.dynamic_sampling == "none"
    # a user epsilon keeps the preset's clip-higher gap: 0.1 + (0.28 - 0.2)
    assert GRPOConfig(algorithm="dapo", epsilon=0.1).epsilon_high == pytest.approx(0.18)
    assert GRPOConfig(algorithm="grpo", epsilon=0.1).epsilon_high == pytest.approx(0.1)


def test_trl_aliases_and_importance_sampling_level():
    cfg = GRPOConfig(beta=0.04, max_completion_length=128)
    assert (cfg.kl_coef, cfg.max_new_tokens) == (0.04, 128)
    trl_gspo = GRPOConfig(importance_sampling_level="sequence")  # TRL's way to ask for GSPO: GSPO's defaults
    assert trl_gspo.policy_loss == "gspo"
    assert trl_gspo.loss_hparams() == {"eps_low": 3e-4, "eps_high": 4e-4}
    # naming the grpo preset changes nothing: its clip range belongs to the grpo loss (was: gspo with 0.2)
    explicit = GRPOConfig(algorithm="grpo", importance_sampling_level="sequence")
    assert explicit.resolved() == trl_gspo.resolved() and explicit.to_dict() == trl_gspo.to_dict()
    assert GRPOConfig(scale_rewards=False).scale_rewards == "none"
    with pytest.raises(ConfigError, match="beta=0.04 and kl_coef=0.1 disagree"):
        GRPOConfig(beta=0.04, kl_coef=0.1)


def test_batch_arithmetic_error_names_the_formula():
    with pytest.raises(ConfigError) as e:
        GRPOConfig(per_device_train_batch_size=3, gradient_accumulation_steps=4, num_generations=8)
    msg = str(e.value)
    assert "generation batch 12 (= per_device_train_batch_size 3 x steps_per_generation 4)" in msg
    assert "not divisible by num_generations 8" in msg and "multiple of 8" in msg
    with pytest.raises(ConfigError, match="steps_per_generation 3 is not a multiple of gradient_accumulation_steps 2"):
        GRPOConfig(per_device_train_batch_size=8, gradient_accumulation_steps=2, steps_per_generation=3)
    # 1 completion per micro-batch x 8 micro-batches = one group of 8
    seed = GRPOConfig(num_generations=8, per_device_train_batch_size=1, gradient_accumulation_steps=8)
    assert (seed.generation_batch_size, seed.prompts_per_generation, seed.needs_old_logp) == (8, 1, False)
    assert GRPOConfig(num_iterations=2).needs_old_logp
    assert GRPOConfig(per_device_train_batch_size=4, steps_per_generation=2, num_generations=8).needs_old_logp


@pytest.mark.parametrize(("kwargs", "needle"), [
    (dict(num_generations=1), "num_generations=1: GRPO compares completions within a group"),
    (dict(temperature=0.0), "temperature=0.0 must be > 0.0"),
    (dict(learning_rate=-1.0), "learning_rate=-1.0 must be > 0.0"),
    (dict(kl_coef=-0.1), "kl_coef=-0.1 must be >= 0.0"),
    (dict(epsilon=0.2, epsilon_high=0.1), "epsilon_high=0.1 is below epsilon=0.2"),
    (dict(algorithm="dr-grpo"), "algorithm='dr-grpo' is not a known preset. Did you mean 'dr_grpo'?"),
    (dict(lr_scheduler_type="cosin"), "lr_scheduler_type='cosin' must be one of"),
    (dict(report_to="tensorbord"), "Did you mean 'tensorboard'?"),
    (dict(reward_funcs=["a", "b"], reward_weights=[1.0]), "reward_weights has 1 entries but reward_funcs has 2"),
    (dict(eval_num_samples=4), "eval_num_samples=4 with eval_temperature=0"),
    (dict(per_device_train_batch_size=0), "per_device_train_batch_size=0 must be a positive integer"),
])
def test_bad_values_name_field_value_and_fix(kwargs, needle):
    with pytest.raises(ConfigError) as e:
        GRPOConfig(**kwargs)
    assert needle in str(e.value)


def test_yaml_and_dotted_overrides(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("algorithm: gspo\nlearning_rate: 5e-6\nreward_funcs: [accuracy, format]\n"
                      "reward_kwargs:\n  accuracy: {task_type: math}\nbeta: 0.01\n")
    cfg = GRPOConfig.from_yaml(recipe, ["num_generations=4", "reward_kwargs.accuracy.tolerance=0.5",
                                        "max_completion_length=64", "eval_split=null"])
    assert cfg.learning_rate == 5e-6 and isinstance(cfg.learning_rate, float)  # YAML 1.1 reads 5e-6 as text
    assert cfg.reward_kwargs == {"accuracy": {"task_type": "math", "tolerance": 0.5}}
    assert (cfg.num_generations, cfg.kl_coef, cfg.max_new_tokens, cfg.eval_split) == (4, 0.01, 64, None)
    assert cfg.policy_loss == "gspo"
    cfg.to_yaml(tmp_path / "back.yaml")
    assert GRPOConfig.from_yaml(tmp_path / "back.yaml") == cfg  # resolved config round-trips


def test_unknown_keys_get_a_did_you_mean(tmp_path):
    with pytest.raises(ConfigError, match="unknown config key 'learnig_rate'. Did you mean 'learning_rate'"):
        GRPOConfig.from_yaml(None, ["learnig_rate=1e-6"])
    with pytest.raises(ConfigError, match="unknown config key 'num_generation'. Did you mean 'num_generations'"):
        GRPOConfig(num_generation=4)  # the Python API too
    with pytest.raises(ConfigError, match="must look like key=value"):
        GRPOConfig.from_yaml(None, ["learning_rate"])
    with pytest.raises(ConfigError, match="num_generations='eight' is not a valid int"):
        GRPOConfig.from_yaml(None, ["num_generations=eight"])
    bad = tmp_path / "bad.yaml"
    bad.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="must be a mapping"):
        GRPOConfig.from_yaml(bad)


def test_registry_names_are_checked_before_any_model_loads():
    with pytest.raises(Exception, match="Closest match: 'gspo'"):
        GRPOConfig(policy_loss="gsp").check_names()
    with pytest.raises(ConfigError, match="takes no argument 'dual_clipp'"):
        GRPOConfig(loss_kwargs={"dual_clipp": 3.0}).check_names()


def test_every_field_has_a_docstring_and_config_imports_no_torch():
    import subprocess

    docs = GRPOConfig.field_docs()
    from dataclasses import fields

    assert {f.name for f in fields(GRPOConfig)} == set(docs)
    code = "import sys, grouprl.config; grouprl.config.GRPOConfig(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_report_to_wandb_needs_wandb_before_any_model_loads(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(ConfigError, match=r"includes wandb, which is not installed. Fix: pip install 'grouprl\[wandb\]'"):
        GRPOConfig(report_to=["tensorboard", "wandb"]).check_names()
    assert GRPOConfig(report_to="all").report_targets == ["tensorboard"]  # all = every installed sink
    GRPOConfig(report_to="all").check_names()
