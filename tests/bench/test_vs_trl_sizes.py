"""Plumbing of ``vs_trl.py --size`` (no timing asserts): the shared presets, the config pass-through to each
side, the floor multiples, the targets and the three-size table, on hand-made numbers."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import _sizes  # noqa: E402
import floor  # noqa: E402
from _common import GRPO, GSPO, SIZES, size_workload  # noqa: E402


def test_presets_are_the_issue_sizes_and_shared_with_floor():
    assert floor.SIZES is SIZES  # one definition for vs_trl.py, scaling.py and floor.py
    tiny, small, medium = SIZES["tiny"], SIZES["small"], SIZES["medium"]
    assert (tiny.hidden, tiny.layers, tiny.tokens) == (64, 2, 64)
    assert (small.hidden, small.layers, small.tokens) == (256, 4, 128)
    assert medium.vocab >= 32768 and medium.tokens == 256
    # about 25M parameters: tied embedding V*h plus per layer attention (q, o: h*h; k, v: h*h/2 with 2 of 4
    # KV heads; biases on q, k, v), MLP 3*h*4h and two norms; plus the final norm
    h, v = medium.hidden, medium.vocab
    per_layer = 2 * h * h + 2 * h * h // 2 + (h + h // 2 + h // 2) + 3 * h * 4 * h + 2 * h
    assert 24e6 <= v * h + medium.layers * per_layer + h <= 26e6


def test_size_workload_takes_length_and_steps_per_config():
    w = size_workload(GRPO, SIZES["small"])
    assert (w.max_new_tokens, w.steps, w.level) == (128, 5, "token")
    g = size_workload(GSPO, SIZES["medium"])
    assert (g.max_new_tokens, g.steps, g.level) == (256, 4, "sequence")
    # GSPO keeps one warm-up round (2 steps) and at least one steady round
    assert g.steps - g.warmup_steps >= g.optimizer_steps_per_generation


def test_cpu_clock_makes_every_phase_timer_read_cpu_time(monkeypatch):
    import time

    from _common import StepClock, use_clock

    monkeypatch.setattr(time, "perf_counter", time.perf_counter)  # restored after the test
    use_clock("wall")
    assert time.perf_counter is not time.process_time
    use_clock("cpu")
    assert time.perf_counter is time.process_time
    clock = StepClock()
    clock.start()
    time.sleep(0.2)  # wall time passes, almost no CPU time
    clock.end_step()
    assert clock.steps[0]["step_time"] < 0.1
    with pytest.raises(ValueError, match="clock='gpu'"):
        use_clock("gpu")


def test_parse_opts_types_values_and_names_the_flag():
    assert _sizes.parse_opts(["logits_chunk_size=4096", "bf16=true", "ref_dtype=bfloat16", "x=1.5"], "--g") == {
        "logits_chunk_size": 4096, "bf16": True, "ref_dtype": "bfloat16", "x": 1.5}
    with pytest.raises(SystemExit, match="--grouprl-opt 'oops': expected KEY=VALUE"):
        _sizes.parse_opts(["oops"], "--grouprl-opt")


def test_opts_reach_each_side_only(tmp_path):
    from _grouprl_side import grouprl_config
    from _trl_side import trl_config_kwargs

    w = replace(GRPO, grouprl_opts={"gradient_checkpointing": True}, trl_opts={"top_p": 0.5})
    assert grouprl_config(w, str(tmp_path)).gradient_checkpointing is True
    assert grouprl_config(replace(w, grouprl_opts={}), str(tmp_path)).gradient_checkpointing is False
    assert trl_config_kwargs(w, str(tmp_path))["top_p"] == 0.5
    assert trl_config_kwargs(replace(w, trl_opts={}), str(tmp_path))["top_p"] == 1.0
    with pytest.raises(Exception, match="no_such_field"):  # a typo is an error, not silently ignored
        grouprl_config(replace(GRPO, grouprl_opts={"no_such_field": 1}), str(tmp_path))


def test_precision_sets_bf16_on_both_sides_and_the_floor_stays_fp32(tmp_path, monkeypatch):
    import vs_trl
    from _grouprl_side import grouprl_config
    from _trl_side import trl_config_kwargs

    bf16 = replace(GRPO, precision="bf16")
    assert grouprl_config(bf16, str(tmp_path)).bf16 is True and grouprl_config(GRPO, str(tmp_path)).bf16 is False
    trl = trl_config_kwargs(bf16, str(tmp_path))
    assert trl["bf16"] is True and trl["use_cpu"] is True and trl_config_kwargs(GRPO, str(tmp_path))["bf16"] is False
    assert vs_trl.parse_args(["--precision", "bf16"]).precision == "bf16"
    specs = []
    monkeypatch.setattr(vs_trl, "run_child", lambda script, lib, spec: specs.append(spec) or {"ok": False,
                                                                                              "returncode": 1,
                                                                                              "log_tail": ""})
    vs_trl.floor_child(bf16, "m", 1, log=lambda m: None)
    assert specs[0]["workload"]["precision"] == "fp32"


def _side(gen, ref, fwd_bwd, step, steps_per_s, rss):
    b = {"generate": gen, "reward": 0.001, "ref_logp": ref, "old_logp": 0.0, "policy_fwd_bwd": fwd_bwd,
         "optimizer": 0.002, "other": step - gen - ref - fwd_bwd - 0.003, "step_time": step}
    return {"repeats": 3, "breakdown_s_per_step": b, "steps_per_s": steps_per_s, "peak_rss_mib": rss}


def _size_result():
    floor_res = {"ok": True, "floor_s": {"generate": 1.0, "policy_fwd_bwd": 1.0, "ref_logp": 0.25}}
    grouprl = _side(0.8, 0.5, 1.2, 2.6, 1 / 2.6, 400.0)
    trl = _side(2.0, 0.5, 1.5, 4.2, 1 / 4.2, 600.0)
    ratio = {"steps_per_s": 4.2 / 2.6, "steps_per_cpu_s": 1.6, "peak_rss_mib": 400 / 600}
    res = {"model": {"parameters": 24_650_000},
           "floor": floor_res, "configs": {"grpo": {"grouprl": grouprl, "trl": trl, "ratio_grouprl_over_trl": ratio},
                                           "gspo": {"grouprl": grouprl, "trl": trl, "ratio_grouprl_over_trl": ratio}}}
    for cfg, r in res["configs"].items():
        r["floor_multiple"] = _sizes.floor_multiples(cfg, r["grouprl"], floor_res)
    return res


def test_floor_multiples_and_targets():
    res = _size_result()
    assert res["configs"]["grpo"]["floor_multiple"] == pytest.approx(
        {"generate": 0.8, "policy_fwd_bwd": 1.2, "ref_logp": 2.0})
    assert res["configs"]["gspo"]["floor_multiple"] == pytest.approx({"policy_fwd_bwd": 1.2})  # the floor is GRPO's
    assert _sizes.floor_multiples("grpo", {}, res["floor"]) == {}  # a failed side gives no multiple
    rows = {(t["config"], t["target"]): t["met"] for t in _sizes.size_targets("medium", res)}
    assert rows[("grpo", "steps/s grouprl / TRL")] is True  # 1.62x >= 1.5
    assert rows[("grpo", "peak RSS grouprl / TRL")] is True  # 0.67x <= 0.8
    assert rows[("grpo", "ref_logp / floor")] is False  # 2.0x > 1.3
    assert rows[("grpo", "generate / floor")] is True
    tiny = {(t["config"], t["target"]): t["met"] for t in _sizes.size_targets("tiny", res)}
    assert tiny == {("grpo", "steps/s grouprl / TRL"): False, ("gspo", "steps/s grouprl / TRL"): False}


def test_three_size_markdown():
    res = _size_result()
    res["targets"] = _sizes.size_targets("medium", res)
    table = _sizes.markdown_sizes({"sizes": {"medium": res}, "clock": "cpu"})
    assert table.startswith("Clock: cpu time.")
    assert ("| medium | 24.65M | grpo | 0.385 | 0.238 | **1.62x** | 1.60x | 400 | 600 | 0.67x | 0.80x | 1.20x "
            "| 2.00x |") in table
    assert "| medium | grpo step | plain PyTorch floor | 1000.0 | 250.0 | | 1000.0 | | |" in table
    # other = step - (generate + ref + old + policy) = 2.6 - 2.5 (reward and optimizer are in it)
    assert "| medium | grpo | grouprl | 800.0 | 500.0 | 0.0 | 1200.0 | 100.0 | 2600.0 |" in table
    assert "| medium | grpo | ref_logp / floor <= 1.3 | 2.00 | **no** |" in table
