"""Reproduced config bugs, one test each: no silent override of what the user set, no option a function
cannot honour, field types and clip bounds checked."""

from __future__ import annotations

import warnings

import pytest

from grouprl.config import GRPOConfig
from grouprl.errors import ConfigError


def test_cispo_runs_with_its_own_clip_range_not_the_grpo_presets():
    # cispo_loss(eps_low=1.0, eps_high=0.28): no lower bound (MiniMax-M1, arXiv 2506.13585, Eq. 5)
    assert GRPOConfig(policy_loss="cispo").loss_hparams() == {"eps_low": 1.0, "eps_high": 0.28}
    assert GRPOConfig(policy_loss="cispo", algorithm="dapo").loss_hparams() == {"eps_low": 1.0, "eps_high": 0.28}


def test_importance_sampling_levels_get_their_losss_clip_range():
    assert GRPOConfig(importance_sampling_level="sequence_token").loss_hparams() == {"eps_low": 3e-4,
                                                                                    "eps_high": 4e-4}
    with pytest.raises(ConfigError, match="importance_sampling_level='sequence' and policy_loss='grpo' disagree: "
                                          "that level is policy_loss 'gspo'"):
        GRPOConfig(policy_loss="grpo", importance_sampling_level="sequence")
    with pytest.raises(ConfigError, match="importance_sampling_level='sequense' must be one of .* Did you mean"):
        GRPOConfig(importance_sampling_level="sequense")


def test_a_recipe_naming_the_grpo_preset_changes_nothing(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("algorithm: grpo\n")
    with_recipe = GRPOConfig.from_yaml(recipe, ["importance_sampling_level=sequence"])
    without = GRPOConfig.from_yaml(None, ["importance_sampling_level=sequence"])
    assert with_recipe.resolved() == without.resolved()
    assert with_recipe.loss_hparams() == {"eps_low": 3e-4, "eps_high": 4e-4}


def test_an_alias_never_overwrites_a_target_the_user_set_even_to_its_default():
    with pytest.raises(ConfigError, match="max_completion_length=512 and max_new_tokens=256 disagree"):
        GRPOConfig(max_completion_length=512, max_new_tokens=256)  # 256 is also the default
    with pytest.raises(ConfigError, match="max_completion_length=512 and max_new_tokens=256 disagree"):
        GRPOConfig.from_yaml(None, ["max_new_tokens=256", "max_completion_length=512"])
    with pytest.raises(ConfigError, match="beta=0.1 and kl_coef=0.0 disagree"):
        GRPOConfig(beta=0.1, kl_coef=0.0)
    same = GRPOConfig(max_completion_length=128, max_new_tokens=128)  # agreeing is fine
    assert same.max_new_tokens == 128 and "max_new_tokens" in same.explicit_fields
    assert GRPOConfig(max_completion_length=512).max_new_tokens == 512


def test_scale_rewards_is_never_silently_ignored():
    for advantage in ("rloo", "dr_grpo"):  # their functions take no `scale`
        with pytest.raises(ConfigError, match=rf"scale_rewards='batch' is set, but advantage estimator "
                                              rf"'{advantage}' \(grouprl.algo.advantages.{advantage}_advantages\) "
                                              rf"takes no 'scale'.*Fix: remove scale_rewards.*\(grpo\)"):
            GRPOConfig(advantage=advantage, scale_rewards="batch").check_names()
    assert GRPOConfig(algorithm="rloo").advantage_hparams() == {}  # the preset's own value is not an error
    with pytest.raises(ConfigError, match="scale_rewards='none' and advantage_kwargs.scale='batch' disagree"):
        GRPOConfig(scale_rewards="none", advantage_kwargs={"scale": "batch"}).check_names()
    assert GRPOConfig(advantage_kwargs={"scale": "batch"}).advantage_hparams()["scale"] == "batch"


@pytest.mark.parametrize(("kwargs", "needle"), [
    (dict(loss_kwargs="dual_clip=3"), "loss_kwargs='dual_clip=3' must be a mapping (YAML `loss_kwargs: {key: "
                                      "value}`, override `loss_kwargs.key=value`); got a str"),
    (dict(advantage_kwargs=["std"]), "advantage_kwargs=['std'] must be a mapping"),
    (dict(reward_funcs="accuracy"), "reward_funcs='accuracy' must be a list"),
    (dict(reward_weights=1.0), "reward_weights=1.0 must be a list (YAML `reward_weights: [a, b]`) or null"),
    (dict(policy_loss=3), "policy_loss=3 must be a string or null; got a int"),
    (dict(bf16="yes"), "bf16='yes' must be true or false"),
    (dict(num_generations=4.0), "num_generations=4.0 must be a whole number"),
    (dict(learning_rate="fast"), "learning_rate='fast' must be a number"),
])
def test_field_types_are_checked(kwargs, needle):
    with pytest.raises(ConfigError) as e:
        GRPOConfig(**kwargs)
    assert needle in str(e.value)


def test_a_string_for_a_dict_field_fails_from_the_command_line_too():
    with pytest.raises(ConfigError, match="loss_kwargs='dual_clip=3' must be a mapping"):
        GRPOConfig.from_yaml(None, ["loss_kwargs=dual_clip=3"])
    assert GRPOConfig.from_yaml(None, ["loss_kwargs.dual_clip=3"]).loss_hparams()["dual_clip"] == 3


@pytest.mark.parametrize(("kwargs", "needle"), [
    (dict(epsilon=5), "epsilon=5 must be >= 0.0 and < 1.0. Fix: the lower clip bound 1 - epsilon must stay > 0"),
    (dict(epsilon=1.0, epsilon_high=1.0), "epsilon=1.0 must be >= 0.0 and < 1.0"),
    (dict(epsilon=-0.1, epsilon_high=0.2), "epsilon=-0.1 must be >= 0.0 and < 1.0"),
    (dict(epsilon_high=50.0), "epsilon_high=50.0 must be >= 0.0 and <= 10.0"),
    (dict(epsilon_high=-0.2), "epsilon_high=-0.2 must be >= 0.0"),
])
def test_clip_ranges_are_bounded(kwargs, needle):
    with pytest.raises(ConfigError) as e:
        GRPOConfig(**kwargs)
    assert needle in str(e.value)


@pytest.fixture
def clipless_loss():
    """A plug-in loss with no clip range (registered for the test only)."""
    from grouprl.builtins import load_builtins
    from grouprl.registry import POLICY_LOSSES

    load_builtins()

    def reinforce(logp, old_logp, adv, mask, *, baseline: float = 0.0):
        return -(adv - baseline) * logp, {}

    POLICY_LOSSES.register("test_reinforce", reinforce)
    yield "test_reinforce"
    POLICY_LOSSES._fns.pop("test_reinforce")


def test_epsilon_for_a_loss_without_a_clip_range_is_an_error(clipless_loss):
    assert GRPOConfig(policy_loss=clipless_loss).loss_hparams() == {"baseline": 0.0}  # preset's clip not passed
    with pytest.raises(ConfigError, match=r"epsilon=0.1 is set, but policy loss 'test_reinforce' \(.*reinforce\) "
                                          r"takes no 'eps_low': it has no clip range to apply it to. Fix: remove "
                                          r"epsilon, or choose a policy_loss that takes it \(cispo, grpo, gspo, "
                                          r"gspo_token"):
        GRPOConfig(policy_loss=clipless_loss, epsilon=0.1).check_names()
    with pytest.raises(ConfigError, match="epsilon_high=0.3 is set, but policy loss 'test_reinforce'"):
        GRPOConfig(policy_loss=clipless_loss, epsilon_high=0.3).resolved()


def test_k1_with_a_kl_penalty_warns_once(monkeypatch):
    import grouprl.config.validate as validate

    monkeypatch.setattr(validate, "_warned", set())
    with pytest.warns(UserWarning, match="kl_estimator='k1' with kl_coef=0.05: as a loss term k1 has zero "
                                         "expected gradient"):
        GRPOConfig(kl_estimator="k1", kl_coef=0.05)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        GRPOConfig(kl_estimator="k1", kl_coef=0.05)  # once
        GRPOConfig(kl_estimator="k1", kl_coef=0.0)  # no penalty, nothing to warn about
        GRPOConfig(kl_estimator="k3", kl_coef=0.05)


def test_explicit_fields_are_what_the_user_gave():
    cfg = GRPOConfig(max_new_tokens=256, epsilon=None, beta=0.01)
    assert cfg.explicit_fields == {"max_new_tokens", "kl_coef"}
    assert GRPOConfig.from_yaml(None, ["scale_rewards=group"]).explicit_fields == {"scale_rewards"}


def test_new_fields_are_documented_and_checked():
    docs = GRPOConfig.field_docs()
    for name in ("lean_sampler", "missing_reward", "max_consecutive_skips", "kl_estimator"):
        assert len(docs[name]) > 40, name
    assert "seed" not in " ".join(d for n, d in docs.items() if n != "seed" and n != "torch_num_threads")
    with pytest.raises(ConfigError, match="missing_reward='skip' must be one of 'exclude', 'zero'"):
        GRPOConfig(missing_reward="skip")
    with pytest.raises(ConfigError, match="max_consecutive_skips=0 must be a positive integer"):
        GRPOConfig(max_consecutive_skips=0)
    with pytest.raises(ConfigError, match="lean_sampler='on' must be true or false or null"):
        GRPOConfig(lean_sampler="on")
    with pytest.raises(Exception, match="unknown KL estimator 'k4'"):
        GRPOConfig(kl_estimator="k4").check_names()


@pytest.mark.parametrize("text", ["save_strategy: no", "save_strategy: 'no'"])
def test_yaml_no_is_the_string_no_for_a_string_field(tmp_path, text):
    """YAML 1.1 reads a bare `no` as False; for a string field it is TRL's `save_strategy: no`."""
    recipe = tmp_path / "r.yaml"
    recipe.write_text(text + "\n")
    assert GRPOConfig.from_yaml(recipe).save_strategy == "no"
    assert GRPOConfig.from_yaml(None, ["save_strategy=no"]).save_strategy == "no"
