"""benchmarks/code_repair_curve.py's table and plot, on a hand-made grid report (no training)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import code_repair_curve  # noqa: E402


def _cell(ws: int, rl: int, before: float, after: float) -> dict:
    return {"ws_seed": ws, "rl_seed": rl, "before": before, "after": after, "greedy_before": 0.4, "greedy_after": 0.6,
            "env_before": {"edits": 0.9, "iterations": 0.9}, "env_after": {"edits": 1.2, "iterations": 1.1},
            "greedy_env_before": {"edits": 1.0, "iterations": 1.0}, "greedy_env_after": {"edits": 1.0},
            "train_seconds": 500.0, "wall_seconds": 640.0}


def test_summary_rows_gain_points_and_counters():
    rows = code_repair_curve.summary({"cells": [_cell(0, 0, 0.43, 0.493), _cell(0, 1, 0.37, 0.547)]})
    assert [r["kn_gain_points"] for r in rows] == [6.3, 17.7]
    assert rows[0]["edits_per_traj"] == [0.9, 1.2] and rows[0]["iterations_per_traj"] == [0.9, 1.1]
    assert rows[1]["greedy_iterations_per_traj"] == [1.0, None]  # a counter missing from a record stays None
    assert rows[0]["greedy_kn"] == [0.4, 0.6] and rows[0]["wall_seconds"] == 640.0


def test_variants_and_plot(tmp_path):
    pytest.importorskip("matplotlib")
    assert code_repair_curve.VARIANTS["grpo"] == []
    assert "advantage=mt_grpo" in code_repair_curve.VARIANTS["mt_grpo"]
    curve = [{"step": s, "accuracy": a, "env": {"edits": 1.0, "iterations": 0.9}} for s, a in ((0, 0.4), (15, 0.5))]
    run = {"ws_seed": 0, "rl_seed": 0, "curve": curve, "per_step": []}
    report = {"recipe": "recipes/code_repair.yaml", "cpu_count": 2,
              "variants": {"grpo": {"runs": [run]}, "mt_grpo": {"runs": [run]}}}
    code_repair_curve.plot(report, tmp_path / "x.png")
    assert (tmp_path / "x.png").stat().st_size > 1000
