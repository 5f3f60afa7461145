"""A config builds exactly the algorithm it names: preset x override -> the functions and hyper-parameters
training calls (``GRPOConfig.resolved()``), or the exact error. Expected values are written out by hand from
each function's signature in grouprl/algo (grpo loss 0.2/0.2, gspo and gspo_token 3e-4/4e-4, cispo 1.0/0.28)
and the presets' documentation (dapo 0.2/0.28)."""

from __future__ import annotations

import pytest

from grouprl.config import GRPOConfig
from grouprl.errors import ConfigError

PRESETS = ("grpo", "gspo", "dr_grpo", "dapo", "rloo")
GRPO_LOSS = {"eps_low": 0.2, "eps_high": 0.2, "dual_clip": None, "delta": None}
DAPO_LOSS = {**GRPO_LOSS, "eps_high": 0.28}
GSPO = {"eps_low": 3e-4, "eps_high": 4e-4}
CISPO = {"eps_low": 1.0, "eps_high": 0.28}
ADV = {"eps": 1e-8, "std": "population", "scale": "group"}
AGG = {"grpo": "seq_mean_token_mean", "gspo": "seq_mean_token_mean", "dr_grpo": "seq_mean_token_sum_norm",
       "dapo": "token_mean", "rloo": "token_mean"}
PRESET_ADV = {"grpo": ("grpo", ADV), "gspo": ("grpo", ADV), "dr_grpo": ("dr_grpo", {}), "dapo": ("grpo", ADV),
              "rloo": ("rloo", {})}
PRESET_LOSS = {"grpo": ("grpo", GRPO_LOSS), "gspo": ("gspo", GSPO), "dr_grpo": ("grpo", GRPO_LOSS),
               "dapo": ("grpo", DAPO_LOSS), "rloo": ("grpo", GRPO_LOSS)}


def _same(value):
    return dict.fromkeys(PRESETS, value)


def _loss_for_grpo_presets(**update):
    """grpo-loss presets keep their clip range; gspo's preset range does not carry to another loss."""
    return {"grpo": ("grpo", {**GRPO_LOSS, **update}), "gspo": ("grpo", {**GRPO_LOSS, **update}),
            "dr_grpo": ("grpo", {**GRPO_LOSS, **update}), "dapo": ("grpo", {**DAPO_LOSS, **update}),
            "rloo": ("grpo", {**GRPO_LOSS, **update})}


# override -> preset -> (policy_loss, loss_hparams) | error text
LOSS_TABLE = {
    "none": PRESET_LOSS,
    "policy_loss=cispo": _same(("cispo", CISPO)),
    "policy_loss=gspo_token": _same(("gspo_token", GSPO)),
    "policy_loss=grpo": _loss_for_grpo_presets(),
    "importance_sampling_level=token": _loss_for_grpo_presets(),
    "importance_sampling_level=sequence": _same(("gspo", GSPO)),
    "importance_sampling_level=sequence_token": _same(("gspo_token", GSPO)),
    "epsilon=0.1": {"grpo": ("grpo", {**GRPO_LOSS, "eps_low": 0.1, "eps_high": 0.1}),
                    "gspo": ("gspo", {"eps_low": 0.1, "eps_high": 0.1001}),  # gspo's gap 4e-4 - 3e-4 kept
                    "dr_grpo": ("grpo", {**GRPO_LOSS, "eps_low": 0.1, "eps_high": 0.1}),
                    "dapo": ("grpo", {**GRPO_LOSS, "eps_low": 0.1, "eps_high": 0.18}),  # DAPO's gap 0.08 kept
                    "rloo": ("grpo", {**GRPO_LOSS, "eps_low": 0.1, "eps_high": 0.1})},
    "epsilon_high=0.28": {p: (loss, {**hp, "eps_high": 0.28}) for p, (loss, hp) in PRESET_LOSS.items()},
    "policy_loss=cispo epsilon=0.1": _same(("cispo", {"eps_low": 0.1, "eps_high": 0.1})),
    "policy_loss=cispo epsilon_high=4.0": _same(("cispo", {"eps_low": 1.0, "eps_high": 4.0})),
    "loss_kwargs.dual_clip=3": {**{p: (loss, {**hp, "dual_clip": 3}) for p, (loss, hp) in PRESET_LOSS.items()},
                                "gspo": "policy loss 'gspo' takes no argument 'dual_clip' (in loss_kwargs)"},
    "loss_kwargs.eps_low=0.1": {p: (loss, {**hp, "eps_low": 0.1}) for p, (loss, hp) in PRESET_LOSS.items()},
    "epsilon=0.15 loss_kwargs.eps_low=0.1": _same("epsilon=0.15 and loss_kwargs.eps_low=0.1 disagree"),
    "policy_loss=grpo importance_sampling_level=sequence": _same(
        "importance_sampling_level='sequence' and policy_loss='grpo' disagree"),
}

# override -> preset -> (advantage, advantage_hparams) | error text
ADV_TABLE = {
    "none": PRESET_ADV,
    "scale_rewards=batch": {**_same(("grpo", {**ADV, "scale": "batch"})),
                            "dr_grpo": "scale_rewards='batch' is set, but advantage estimator 'dr_grpo'",
                            "rloo": "scale_rewards='batch' is set, but advantage estimator 'rloo'"},
    "scale_rewards=group": {**_same(("grpo", ADV)),
                            "dr_grpo": "scale_rewards='group' is set, but advantage estimator 'dr_grpo'",
                            "rloo": "scale_rewards='group' is set, but advantage estimator 'rloo'"},
    "scale_rewards=none": {**_same(("grpo", {**ADV, "scale": "none"})), "dr_grpo": ("dr_grpo", {}),
                           "rloo": ("rloo", {})},
    "advantage_kwargs.std=unbiased": {**_same(("grpo", {**ADV, "std": "unbiased"})),
                                      "dr_grpo": "advantage estimator 'dr_grpo' takes no argument 'std'",
                                      "rloo": "advantage estimator 'rloo' takes no argument 'std'"},
    "advantage_kwargs.scale=batch": {**_same(("grpo", {**ADV, "scale": "batch"})),
                                     "dr_grpo": "advantage estimator 'dr_grpo' takes no argument 'scale'",
                                     "rloo": "advantage estimator 'rloo' takes no argument 'scale'"},
    "scale_rewards=group advantage_kwargs.scale=batch": {
        **_same("scale_rewards='group' and advantage_kwargs.scale='batch' disagree"),
        "dr_grpo": "advantage estimator 'dr_grpo' takes no argument 'scale'",
        "rloo": "advantage estimator 'rloo' takes no argument 'scale'"},
    "advantage=rloo": _same(("rloo", {})),
    "advantage=grpo": _same(("grpo", ADV)),
}


def _build(preset: str, override: str) -> GRPOConfig:
    items = [] if override == "none" else override.split()
    return GRPOConfig.from_yaml(None, [f"algorithm={preset}", *items])


def _cases(table):
    return [(o, p, table[o][p]) for o in table for p in PRESETS]


@pytest.mark.parametrize(("override", "preset", "expected"), _cases(LOSS_TABLE))
def test_policy_loss_and_its_hyper_parameters(override, preset, expected):
    if isinstance(expected, str):
        with pytest.raises(ConfigError, match=expected.replace("(", r"\(").replace(")", r"\)")):
            _build(preset, override).resolved()
        return
    r = _build(preset, override).resolved()
    assert r["policy_loss"] == expected[0]
    assert r["loss_hparams"] == pytest.approx(expected[1])
    assert r["aggregation"] == AGG[preset]  # an override of the loss never changes the aggregation


@pytest.mark.parametrize(("override", "preset", "expected"), _cases(ADV_TABLE))
def test_advantage_and_its_hyper_parameters(override, preset, expected):
    if isinstance(expected, str):
        with pytest.raises(ConfigError, match=expected):
            _build(preset, override).resolved()
        return
    r = _build(preset, override).resolved()
    assert (r["advantage"], r["advantage_hparams"]) == expected
    assert (r["policy_loss"], r["loss_hparams"]) == PRESET_LOSS[preset]  # nor the loss


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("advantage", [None, "grpo", "dr_grpo", "rloo"])
def test_resolved_config_round_trips_through_yaml(preset, advantage, tmp_path):
    cfg = GRPOConfig(algorithm=preset, advantage=advantage)
    cfg.to_yaml(tmp_path / "c.yaml")
    back = GRPOConfig.from_yaml(tmp_path / "c.yaml")  # every field now set explicitly: still consistent
    assert back == cfg and back.resolved() == cfg.resolved()
    assert (cfg.resolved()["kl_estimator"], cfg.resolved()["kl_coef"]) == ("k3_st", 0.0)
