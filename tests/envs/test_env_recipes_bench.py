"""benchmarks/env_recipes.py without training: the summary of a run's metrics and the curves' JSON + PNG."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "env_recipes.py"
spec = importlib.util.spec_from_file_location("env_recipes", PATH)
env_recipes = importlib.util.module_from_spec(spec)
spec.loader.exec_module(env_recipes)


def game_records(n: int = 20) -> list[dict]:
    """Steps 1..n: solved 0.5 for the first 10, 0.8 after; 2 s a step; an evaluation row without a step time."""
    rows = [{"step": s, "time/step": 2.0, env_recipes.SOLVED: 0.5 if s <= 10 else 0.8,
             "rewards/GuessNumberEnv/mean": 0.4 if s <= 10 else 0.7, "turns/mean": 3.0 if s <= 10 else 2.5}
            for s in range(1, n + 1)]
    return rows + [{"step": n, "eval/accuracy": 0.9}]


def test_game_summary_is_first_10_steps_against_last_10():
    out = env_recipes.summarize("guess_number", game_records())
    assert out["solved_first10"] == 0.5 and out["solved_last10"] == 0.8 and out["points"] == pytest.approx(30.0)
    assert out["solved_per_10_steps"] == [0.5, 0.8] and out["turns_per_10_steps"] == [3.0, 2.5]
    assert out["train_s"] == 40.0  # 20 steps x 2 s; the evaluation row adds nothing
    # one point per 10-step window, at its last step and the training seconds spent by then
    assert out["curve"] == [{"step": 10, "train_seconds": 20.0, "accuracy": 0.5},
                            {"step": 20, "train_seconds": 40.0, "accuracy": 0.8}]


def test_reasoning_gym_summary_is_held_out_accuracy_before_and_after():
    records = [{"step": 0, "eval/accuracy": 0.25}] + [{"step": s, "time/step": 1.5} for s in range(1, 11)]
    records.append({"step": 10, "eval/accuracy": 0.5})
    out = env_recipes.summarize("reasoning_gym", records)
    assert (out["accuracy_before"], out["accuracy_after"], out["points"]) == (0.25, 0.5, 25.0)
    assert out["curve"] == [{"step": 0, "train_seconds": 0.0, "accuracy": 0.25},
                            {"step": 10, "train_seconds": 15.0, "accuracy": 0.5}]


def test_replot_draws_every_seed_from_the_json(tmp_path):
    pytest.importorskip("matplotlib")
    runs = [{"seed": s, "points": 30.0, **env_recipes.summarize("guess_number", game_records())} for s in (0, 1)]
    path = tmp_path / "guess_number.json"
    path.write_text(json.dumps({"recipe": "recipes/guess_number.yaml", "runs": runs, "points_range": [30.0, 30.0]}))
    env_recipes.main(["guess_number", "--replot", "--out", str(path)])
    assert path.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
