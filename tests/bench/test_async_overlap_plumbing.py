"""benchmarks/async_overlap.py's arithmetic (no timing asserts): the overlap bound and the share of it reached."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from async_overlap import bounds, summarize  # noqa: E402


def _run(k, seed, train_s, step_s=1.0, generate_s=0.2, reward_s=0.05, accuracy=0.7):
    return {"max_staleness": k, "seed": seed, "train_s": train_s, "wall_s": train_s + 5, "step_s": step_s,
            "generate_s": generate_s, "reward_s": reward_s, "accuracy": accuracy, "staleness_mean": float(k),
            "dropped": 0, "trainer_wait_s": 0.1}


def test_the_bound_is_step_over_the_longer_of_generation_and_the_rest():
    b = bounds([_run(0, 0, 10.0), _run(0, 1, 10.0, step_s=3.0, generate_s=0.6, reward_s=0.15)])
    # means: step 2.0, generate 0.4, reward 0.1 -> 2.0 / max(0.4, 1.6) = 1.25; worker share 0.5 vs 1.5 -> 1.333
    assert b["step_s"] == pytest.approx(2.0) and b["generate_frac"] == pytest.approx(0.2)
    assert b["bound"] == pytest.approx(1.25) and b["bound_worker"] == pytest.approx(2.0 / 1.5)
    # generation longer than the rest (the 70 % GPU split): the bound is step / generate = 1 / 0.7
    assert bounds([_run(0, 0, 1.0, step_s=1.0, generate_s=0.7, reward_s=0.0)])["bound"] == pytest.approx(1 / 0.7)


def test_speedup_and_share_of_the_bound_over_seeds():
    runs = [_run(0, 0, 10.0, accuracy=0.70), _run(0, 1, 12.0, accuracy=0.74),
            _run(1, 0, 9.0, accuracy=0.72), _run(1, 1, 9.0, accuracy=0.69)]
    s = summarize(runs, [0, 1])
    one = s["by_staleness"]["1"]
    # sync mean 11 s, async mean 9 s: 11/9 = 1.2222; the bound 1.25 -> (1.2222 - 1) / 0.25 = 0.8889 of it
    assert one["speedup"] == pytest.approx(11 / 9) and one["of_bound"] == pytest.approx((11 / 9 - 1) / 0.25)
    assert one["accuracy_range"] == [0.69, 0.72] and s["by_staleness"]["0"]["accuracy_range"] == [0.70, 0.74]
    assert s["by_staleness"]["0"]["speedup"] == pytest.approx(1.0) and "of_bound" not in s["by_staleness"]["0"]
