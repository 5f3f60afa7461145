"""Metric names a TRL dashboard reads: TRL's keys under ``train/`` in TensorBoard, no rows for what does not apply."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch

from grouprl.train.metrics import MetricsLogger, board_tag, report_step, round_metrics, with_trl_names


def test_trl_aliases_and_no_kl_without_reference():
    m = with_trl_names({"lr": 1e-4, "loss/total": 0.5, "loss/policy": 0.25, "policy/clip_frac_low": 0.1,
                        "policy/clip_frac_high": 0.2, "policy/clip_frac": 0.3, "completions/truncated_frac": 0.125,
                        "time/step": 3.0, "tools/calls_per_traj": 1.5, "tools/failure_frac": 0.5, "kl": math.nan})
    assert "kl" not in m
    assert (m["learning_rate"], m["loss"], m["policy_loss"]) == (1e-4, 0.5, 0.25)
    assert (m["clip_ratio/low_mean"], m["clip_ratio/high_mean"], m["clip_ratio/region_mean"]) == (0.1, 0.2, 0.3)
    assert (m["completions/clipped_ratio"], m["step_time"]) == (0.125, 3.0)
    assert (m["tools/call_frequency"], m["tools/failure_frequency"]) == (1.5, 0.5)
    assert m["lr"] == 1e-4  # ours stay
    assert with_trl_names({"kl": 0.02})["kl"] == 0.02  # a real KL is kept
    assert board_tag("reward") == "train/reward" and board_tag("eval/accuracy") == "eval/accuracy"


def test_terminated_lengths_count_completions_that_ended():
    # 3 completions of 4, 2 and 5 model tokens; the 5-token one hit the budget (no EOS)
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 1]])
    rollout = SimpleNamespace(completion_mask=mask, loss_mask=None, truncated=torch.tensor([False, False, True]))
    m = round_metrics([], torch.tensor([[1.0, 0.0, 1.0]]), [[], [], []], rollout, torch.zeros(3),
                      torch.tensor([False]))
    assert (m["completions/mean_terminated_length"], m["completions/min_terminated_length"],
            m["completions/max_terminated_length"]) == (3.0, 2.0, 4.0)
    assert m["completions/mean_length"] == pytest.approx(11 / 3)
    everything_cut = SimpleNamespace(completion_mask=mask, loss_mask=None, truncated=torch.tensor([True] * 3))
    m = round_metrics([], torch.tensor([[1.0, 0.0, 1.0]]), [[], [], []], everything_cut, torch.zeros(3),
                      torch.tensor([False]))
    assert m["completions/mean_terminated_length"] == 0.0  # TRL's convention, not NaN


def test_tensorboard_tags_and_jsonl(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logger = MetricsLogger(tmp_path, ["tensorboard"], run_name=None, total_steps=1, progress=False)
    cfg = SimpleNamespace(logging_steps=1, log_completions_steps=0)
    metrics = {"reward": 0.5, "lr": 1e-3, "kl": math.nan, "time/step": 2.0, "seq_tokens": 10.0,
               "loss/total": 0.1, "eval/accuracy": 0.25, "entropy": math.inf}
    report_step(cfg, logger, 1, 1, metrics, [], [])
    logger.close()
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"train/reward", "train/learning_rate", "train/lr", "train/loss", "train/step_time",
            "eval/accuracy", "train/tokens_per_s"} <= tags
    assert "train/kl" not in tags and "train/entropy" not in tags  # not applicable / not finite: no row
    assert acc.Scalars("train/learning_rate")[0].value == pytest.approx(1e-3)
    record = json.loads((tmp_path / "metrics.jsonl").read_text())
    assert "kl" not in record and "learning_rate" not in record and record["lr"] == 1e-3  # one name per number
    assert record["tokens_per_s"] == pytest.approx(5.0)
