"""Each alert fires on a synthetic log made to trigger it, and none fires on a healthy synthetic run."""

from __future__ import annotations

import json
import pathlib

import pytest
from report_synth import healthy_metrics

from grouprl.errors import ConfigError
from grouprl.report.alerts import AlertThresholds, compute_alerts, smooth


def names(rows, **kw):
    return sorted({a.name for a in compute_alerts(rows, **kw)})


def test_healthy_run_fires_nothing():
    assert names(healthy_metrics()) == []


def test_smooth_is_a_trailing_mean():
    assert smooth([1, 2, 3, 4], 2) == [1.0, 1.5, 2.5, 3.5]


def _set(rows, key, fn):
    for r in rows:
        r[key] = fn(r["step"])
    return rows


def test_reward_rising_while_eval_flat():
    rows = healthy_metrics()
    for r in rows:
        if "eval/accuracy" in r:
            r["eval/accuracy"] = 0.5 - 0.001 * r["step"]  # falling slightly while the reward rises
    alerts = compute_alerts(rows)
    assert [a.name for a in alerts] == ["reward_vs_eval"]
    assert alerts[0].steps == [20, 100] and alerts[0].anchor == "panel-reward"
    assert "stayed flat" in alerts[0].message


def test_reward_rising_with_eval_rising_is_fine_even_if_eval_plateaus_late():
    rows = healthy_metrics()
    for r in rows:
        if "eval/accuracy" in r:
            r["eval/accuracy"] = min(0.2 + 0.02 * r["step"], 0.7)
    assert names(rows) == []


def test_length_blowup_by_growth_and_by_truncation():
    grow = _set(healthy_metrics(), "completions/mean_length", lambda s: 10 if s <= 10 else 10 * (1 + 0.1 * s))
    alerts = compute_alerts(grow)
    assert [a.name for a in alerts] == ["length_blowup"] and "grew" in alerts[0].message
    cut = _set(healthy_metrics(), "completions/truncated_frac", lambda s: 0.6 if s > 50 else 0.0)
    alerts = compute_alerts(cut)
    assert [a.name for a in alerts] == ["length_blowup"] and alerts[0].anchor == "panel-length"
    assert alerts[0].steps[1] == 100 and 55 <= alerts[0].steps[0] <= 60


def test_one_component_dominating():
    rows = _set(healthy_metrics(), "rewards/format/mean", lambda s: 0.01)
    assert names(rows) == ["component_dominates"]
    # the weights matter: accuracy 0.2..0.8 against format 0.5..0.74 weighted 100x
    assert names(healthy_metrics(), weights={"format": 100.0}) == ["component_dominates"]


def test_variance_collapse():
    rows = _set(healthy_metrics(), "frac_reward_zero_std", lambda s: 0.95 if s > 40 else 0.2)
    alerts = compute_alerts(rows)
    assert [a.name for a in alerts] == ["variance_collapse"] and alerts[0].steps[1] == 100


def test_kl_spike_names_the_step():
    rows = _set(healthy_metrics(), "kl", lambda s: 2.0 if s == 70 else 0.02)
    alerts = compute_alerts(rows)
    assert [a.name for a in alerts] == ["kl_spike"] and alerts[0].steps == [70]


def test_entropy_collapse():
    rows = _set(healthy_metrics(), "entropy", lambda s: 1.0 if s < 50 else 0.01)
    alerts = compute_alerts(rows)
    assert [a.name for a in alerts] == ["entropy_collapse"] and alerts[0].anchor == "panel-entropy"


def test_clip_fraction_persistently_high():
    rows = _set(healthy_metrics(), "policy/clip_frac_high", lambda s: 0.3 if s > 30 else 0.02)
    assert names(rows) == ["clip_high"]
    short = _set(healthy_metrics(), "policy/clip_frac_high", lambda s: 0.9 if s == 30 else 0.02)
    assert names(short) == []  # one bad step is not "persistently"


def test_component_that_never_changes():
    rows = healthy_metrics()
    for r in rows:
        r["rewards/format/mean"], r["rewards/format/std"] = 1.0, 0.0
    alerts = compute_alerts(rows)
    assert "component_constant" in [a.name for a in alerts]
    assert "'format'" in [a for a in alerts if a.name == "component_constant"][0].message


def test_thresholds_are_configurable():
    rows = _set(healthy_metrics(), "frac_reward_zero_std", lambda s: 0.7)
    assert names(rows) == []
    assert names(rows, thresholds=AlertThresholds.from_overrides(["zero_std_frac=0.6"])) == ["variance_collapse"]
    with pytest.raises(ConfigError, match="zero_std_frac"):
        AlertThresholds.from_overrides(["zero_std=0.6"])
    with pytest.raises(ConfigError, match="not a number"):
        AlertThresholds.from_overrides(["window=abc"])


def test_reward_rising_while_eval_falls_from_its_peak():
    rows = healthy_metrics()
    for r in rows:
        if "eval/accuracy" in r:
            r["eval/accuracy"] = 0.3 + 0.01 * r["step"] if r["step"] <= 50 else 0.8 - 0.005 * (r["step"] - 50)
        r["reward"] = 0.5 + 0.01 * r["step"]  # still rising after the held-out peak
    alerts = compute_alerts(rows)
    assert [a.name for a in alerts] == ["reward_vs_eval"] and "fell from its peak" in alerts[0].message
    assert alerts[0].steps[1] == 100


def test_no_alert_on_the_default_recipes_real_run():
    """metrics.jsonl of `grouprl train -c recipes/default.yaml` (100 steps, seed 0), trimmed to the keys the
    checks read. Closest calls: entropy 0.186 -> 0.046 (floor 0.02), zero-std fraction up to 0.48 (0.8),
    length x1.6 (x5), held-out accuracy 0.765 at its peak -> 0.742 at the end (drop 0.05 fires)."""
    path = pathlib.Path(__file__).parent / "data" / "default_recipe_100_steps.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) == 111 and compute_alerts(rows) == []  # 100 steps + 11 evaluation rows
    tight = AlertThresholds(entropy_floor=0.05)  # the log is really read: a tighter floor fires
    assert [a.name for a in compute_alerts(rows, tight)] == ["entropy_collapse"]
