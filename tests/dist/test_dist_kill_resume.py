"""kill -9 of one of 2 gloo training processes, then a resume on 2: every prompt trained exactly once.

The rank killed dies at once (``tests/train/kill_points.py``); the other must end with an error at its next
collective (never a hang), and ``resume=True`` (``--resume``) on 2 processes must train each prompt ordinal
exactly once (``tests/train/exactly_once.py``: rank 0 logs the first half of every global batch) with the
metrics of an uninterrupted 2-process run. The run (``dist_workers.KILL_RUN``): 6 steps, 2 per round,
2 prompts x 2 completions per rank and round; checkpoint-3 falls in the middle of a round (both ranks'
rounds are saved).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
from dist_harness import run_ranks, values  # noqa: E402
from dist_workers import KILL_RUN, run_training_killed  # noqa: E402
from exactly_once import assert_trained_exactly_once, same_ordinals  # noqa: E402

STEPS = KILL_RUN["max_steps"]
COMPARED = ["reward", "advantage/std", "loss/policy", "grad_norm", "entropy", "policy/ratio_max"]


def _check(out: Path) -> list:
    return assert_trained_exactly_once(out, steps_per_round=2, num_generations=2, total_steps=STEPS, full_rounds=True,
                                       shares=2)


def _records(out: Path) -> list[dict]:
    return [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "reward" in r]


@pytest.fixture(scope="module")
def reference(tiny_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("dist-kill-ref")
    values(run_ranks(run_training_killed, 2, "", str(tiny_model_dir), str(root / "full"), workdir=root / "w",
                     timeout=400))
    rounds = _check(root / "full")
    assert [(r.first, r.last) for r in rounds] == [(0, 3), (4, 7), (8, 11)]  # 4 prompts a round over 2 ranks
    return _records(root / "full"), rounds


CASES = [
    pytest.param("clip:4:1", "checkpoint-3", id="rank1-during-step-4-update-mid-round"),
    pytest.param("ckpt_write:1:0", None, marks=pytest.mark.slow, id="rank0-during-checkpoint-3-write"),
    pytest.param("after_ckpt:1:0", "checkpoint-3", marks=pytest.mark.slow, id="rank0-after-checkpoint-3"),
    pytest.param("generate:3:1", "checkpoint-3", marks=pytest.mark.slow, id="rank1-generating-round-3"),
]


@pytest.mark.parametrize(("kill", "resumes_from"), CASES)
def test_sigkill_of_one_rank_then_resume_on_two_trains_every_prompt_once(kill, resumes_from, tiny_model_dir,
                                                                         reference, tmp_path):
    from grouprl.train.checkpoint import latest_checkpoint

    out, dead = tmp_path / "killed", int(kill.rsplit(":", 1)[1])
    res = run_ranks(run_training_killed, 2, kill, str(tiny_model_dir), str(out), workdir=tmp_path / "a", timeout=400,
                    collective_timeout=60)
    assert res[dead].exitcode == -9, res[dead]  # SIGKILL: no result, no cleanup
    survivor = res[1 - dead]
    assert survivor.exitcode == 0 and survivor.value["error"], survivor  # it stopped with an error, not a hang
    left = latest_checkpoint(out)
    assert (left.name if left else None) == resumes_from
    values(run_ranks(run_training_killed, 2, "", str(tiny_model_dir), str(out), True, workdir=tmp_path / "b",
                     timeout=400))
    full_records, full_rounds = reference
    same_ordinals(full_rounds, _check(out))
    records = _records(out)
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    for a, b in zip(full_records, records):
        for key in COMPARED:
            assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-6), (a["step"], key)


@pytest.mark.slow
def test_async_rank_killed_while_its_worker_runs_ahead_resumes_on_two_exactly_once(tiny_model_dir, tmp_path):
    """max_staleness 2 on 2 ranks (a rollout worker per rank): rank 1 killed in step 4 while rounds are queued;
    the resume on 2 trains every ordinal once. (Its numbers after checkpoint-3 are not the uninterrupted
    run's: the rounds in flight are sampled again with checkpoint-3's weights, tests/train/test_kill_resume.py.)"""
    out = tmp_path / "killed"
    res = run_ranks(run_training_killed, 2, "clip:4:1", str(tiny_model_dir), str(out), None, 2, workdir=tmp_path / "a",
                    timeout=400, collective_timeout=60)
    assert res[1].exitcode == -9 and res[0].exitcode == 0 and res[0].value["error"], res
    values(run_ranks(run_training_killed, 2, "", str(tiny_model_dir), str(out), True, 2, workdir=tmp_path / "b",
                     timeout=400))
    rounds = _check(out)
    assert [(r.first, r.last) for r in rounds] == [(0, 3), (4, 7), (8, 11)]
    records = _records(out)
    assert all(r["async/dropped"] == 0 for r in records) and max(r["async/staleness_max"] for r in records) >= 1
