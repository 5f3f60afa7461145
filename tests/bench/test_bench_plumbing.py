"""Plumbing of the benchmark scripts (no timing asserts): the shared reward, the step arithmetic, and that
both libraries are configured with the same batch shape."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from _common import GRPO, GSPO, PHASES, StepClock, make_dataset_rows, number_reward, summarize_steps  # noqa: E402


def test_number_reward_table():
    completions = ["so 42", "41 then 42", "42 then 41", "no digits", [{"role": "assistant", "content": "= 7"}]]
    answers = ["42", "42", "42", "42", "7"]
    assert number_reward(completions, answers) == [1.0, 1.0, 0.5, 0.0, 1.0]


def test_dataset_rows_are_deterministic_and_answered():
    rows = make_dataset_rows(5, seed=3)
    assert rows == make_dataset_rows(5, seed=3)
    for row in rows:
        a, b = (int(x) for x in row["prompt"][0]["content"][len("What is "):-1].split(" + "))
        assert row["answer"] == str(a + b)


def _row(step_time, generate, tokens, cpu):
    row = {k: 0.0 for k in PHASES}
    row.update(generate=generate, step_time=step_time, other=step_time - generate, completion_tokens=tokens,
               cpu_time=cpu, policy_fwd=0.0, policy_bwd=0.0)
    return row


def test_summary_uses_median_cycle_after_warmup():
    # warm-up step of 5 s is left out; cycles of 2 steps: (1+1)/2=1.0, (0.5+0.5)/2=0.5, (3+3)/2=3.0 s/step
    steps = [_row(5.0, 4.0, 100, 5.0),
             _row(1.0, 0.5, 64, 1.0), _row(1.0, 0.0, 0, 1.0),
             _row(0.5, 0.25, 64, 0.5), _row(0.5, 0.0, 0, 0.5),
             _row(3.0, 1.0, 64, 0.6), _row(3.0, 0.0, 0, 0.6)]
    out = summarize_steps(steps, warmup_steps=1, losses=[0.1, -0.2], rewards=[0.0, 1.0], cycle=2)
    assert out["steady_steps"] == 6
    assert out["steps_per_s"] == pytest.approx(1.0)  # median cycle: 1.0 s/step
    assert out["steps_per_s_mean"] == pytest.approx(6 / 9.0)
    assert out["steps_per_cpu_s"] == pytest.approx(1 / 0.6)  # median of 1.0, 0.5, 0.6 s/step
    assert out["completion_tokens_per_s"] == pytest.approx(32.0)  # 64 tokens per 2 steps of 1 s
    assert out["breakdown_s_per_step"]["generate"] == pytest.approx(0.25)
    # generate is model work; nothing else is timed, so overhead = other / step = 0.75
    assert out["overhead_frac"] == pytest.approx(0.75)
    assert out["losses_finite"] and out["rewards_finite"] and out["reward_mean"] == 0.5


def test_clock_splits_policy_detail_into_fwd_bwd():
    clock = StepClock()
    clock.start()
    clock.add("policy_fwd", 0.25)
    clock.add("policy_bwd", 0.5)
    clock.add("generate", 0.125)
    clock.tokens = 10
    clock.end_step()
    row = clock.steps[0]
    assert row["policy_fwd_bwd"] == 0.75 and row["policy_fwd"] == 0.25 and row["completion_tokens"] == 10
    assert row["other"] == pytest.approx(row["step_time"] - 0.875)


@pytest.mark.parametrize("w", [GRPO, GSPO, replace(GRPO, num_generations=4)])
def test_both_libraries_get_the_same_batch_shape(w, tmp_path):
    trl = pytest.importorskip("trl")
    from _grouprl_side import grouprl_config
    from _trl_side import trl_config_kwargs

    t = trl.GRPOConfig(**trl_config_kwargs(w, str(tmp_path / "trl")))
    g = grouprl_config(w, str(tmp_path / "g"))
    assert t.generation_batch_size == g.generation_batch_size == w.micro_batch * w.steps_per_generation
    assert t.per_device_train_batch_size == g.per_device_train_batch_size
    assert t.gradient_accumulation_steps == g.gradient_accumulation_steps
    assert (t.num_generations, t.max_completion_length, t.beta) == (g.num_generations, g.max_new_tokens, g.kl_coef)
    assert (t.epsilon, t.epsilon_high) == (g.epsilon, g.epsilon_high)
    assert t.generation_kwargs == {"min_new_tokens": w.max_new_tokens}
    assert g.policy_loss == ("gspo" if w.level == "sequence" else "grpo")
    # old log-probs are needed exactly when one generation round spans several optimizer steps
    assert g.needs_old_logp == (w.steps_per_generation > w.grad_accum)
