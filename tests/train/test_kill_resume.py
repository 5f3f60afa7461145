"""kill -9 anywhere, then ``--resume``: every prompt of the run is trained exactly once, to the same numbers.

Each case runs ``grouprl train`` in a subprocess that SIGKILLs itself at one point of the loop
(``kill_points.py``), resumes it with ``--resume`` from whatever the kill left on disk, and checks the
result against one uninterrupted run: the prompt ordinals of every step (``exactly_once.py``: none
skipped, none twice), the samples trained, and the metrics of every step (bit-exact up to 1e-5). With
``max_staleness: 2`` (the rollout worker of ``grouprl.train.pipeline`` samples ahead) the ordinals are those
of the uninterrupted run too, but the rounds in flight at the checkpoint are sampled again with the
checkpoint's weights, not the older ones the uninterrupted run used: the metrics after the checkpoint are
compared with that checkpoint of the uninterrupted run resumed (the same for every kill after it).

The run: 10 steps, 2 optimizer steps per generation round (``num_iterations: 2``, so old log-probs are
used; ``kl_coef`` > 0, so the reference forward runs), 2 prompts x 4 completions per round, 8 rows (4
rounds per epoch: steps 9-10 are in epoch 1). Checkpoints every 3 steps: checkpoint-3 and checkpoint-9
fall in the middle of a round (the round is saved and finished after the resume), checkpoint-6 on a
boundary. The two processes case is ``tests/dist/test_dist_kill_resume.py``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from exactly_once import assert_trained_exactly_once, same_ordinals
from train_helpers import train_records

HERE = Path(__file__).parent
STEPS, STEPS_PER_ROUND, G = 10, 2, 4
COMPARED = ["reward", "reward_std", "advantage/std", "loss/policy", "grad_norm", "lr", "entropy", "kl",
            "policy/ratio_mean", "policy/ratio_max", "completions/mean_length", "epoch"]
CODE = "import sys, kill_points; kill_points.install(); from grouprl.cli import main; sys.exit(main(sys.argv[1:]))"


def command(model_dir: Path, data: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-c", CODE, "train", "-c", str(HERE / "recipes" / "tiny_grpo.yaml"), f"model={model_dir}",
            f"dataset={data}", f"output_dir={out}", "eval_split=null", f"max_steps={STEPS}", "max_new_tokens=24",
            "save_steps=3", "num_iterations=2", "kl_coef=0.05", "learning_rate=1e-2",
            "reward_funcs=[train_helpers:alpha_fraction]", "log_completions_steps=1", "logging_steps=1", *extra]


def environment(kill: str | None = None) -> dict[str, str]:
    # the helpers' folder first, then the caller's PYTHONPATH (so the tree under test is the one that runs)
    path = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=path)
    env.pop("GROUPRL_TEST_KILL", None)
    if kill:
        env["GROUPRL_TEST_KILL"] = kill
    return env


def check(out: Path) -> list:
    return assert_trained_exactly_once(out, steps_per_round=STEPS_PER_ROUND, num_generations=G, total_steps=STEPS,
                                       full_rounds=True)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("kill-data") / "train.jsonl"
    path.write_text("\n".join(json.dumps({"prompt": f"{i} + 1 =", "answer": str(i + 1)}) for i in range(8)))
    return path


@pytest.fixture(scope="module")
def reference(tiny_model_dir, data, tmp_path_factory):
    """``reference(k)``: the uninterrupted run with ``max_staleness: k`` -- its metrics and the rounds it trained."""
    runs: dict[int, tuple] = {}

    def run(k: int) -> tuple:
        if k not in runs:
            out = tmp_path_factory.mktemp("kill-reference") / f"k{k}"
            subprocess.run(command(tiny_model_dir, data, out, f"max_staleness={k}"), check=True, env=environment(),
                           capture_output=True, timeout=600)
            records, rounds = train_records(out), check(out)
            assert [(r.first, r.last) for r in rounds] == [(0, 1), (2, 3), (4, 5), (6, 7), (8, 9)]  # 2 prompts a round
            assert records[-1]["epoch"] == 1 and records[7]["epoch"] == 0  # the last round opens epoch 1
            assert records[-1]["kl"] > 0 and records[-1]["reward"] != records[0]["reward"]  # the policy really moved
            if k:  # the worker really ran ahead: rounds trained by weights up to k steps old, none dropped
                assert max(r["async/staleness_max"] for r in records) >= 1
                assert all(r["async/dropped"] == 0 for r in records)
            runs[k] = records, rounds, out
        return runs[k]

    return run


@pytest.fixture(scope="module")
def resumed_reference(tiny_model_dir, data, reference, tmp_path_factory):
    """``resumed_reference(k, "checkpoint-N")``: the uninterrupted run's checkpoint-N resumed to the end --
    what a kill at any point after checkpoint-N must give. With ``max_staleness: 0`` it is the uninterrupted
    run itself; with k >= 1 the rounds in flight at checkpoint-N are sampled again with its weights (version
    N; the uninterrupted run sampled them with the older versions it held), so the numbers after step N
    differ from the uninterrupted run's, and must be the same for every kill that resumes from there."""
    import shutil

    runs: dict[tuple, list] = {}

    def run(k: int, checkpoint: str | None) -> list:
        records, _, full = reference(k)
        if k == 0 or checkpoint is None:
            return records
        if (k, checkpoint) not in runs:
            out = tmp_path_factory.mktemp("kill-resumed-reference") / f"k{k}"
            shutil.copytree(full, out)
            shutil.rmtree(out / "final")
            step = int(checkpoint.split("-")[1])
            for later in out.glob("checkpoint-*"):
                if int(later.name.split("-")[1]) > step:
                    shutil.rmtree(later)
            subprocess.run(command(tiny_model_dir, data, out, f"max_staleness={k}", "--resume"), check=True,
                           env=environment(), capture_output=True, timeout=600)
            runs[k, checkpoint] = train_records(out)
        return runs[k, checkpoint]

    return run


# (max_staleness, kill point, the checkpoint the resume starts from): ``None`` = none written yet, a fresh start.
# One case in the default suite (each costs 3 processes); `pytest -m slow tests/train/test_kill_resume.py` runs all.
SYNC = [
    pytest.param("clip:4", "checkpoint-3", marks=pytest.mark.slow, id="during-step-4-update-mid-round"),
    pytest.param("ckpt_write:2", "checkpoint-3", id="during-checkpoint-6-write"),
    pytest.param("generate:1", None, marks=pytest.mark.slow, id="first-generation-no-checkpoint"),
    pytest.param("reward:3", "checkpoint-3", marks=pytest.mark.slow, id="scoring-round-3"),
    pytest.param("logp:8", "checkpoint-6", marks=pytest.mark.slow, id="old-logp-forward-round-4"),
    pytest.param("after_update:7", "checkpoint-6", marks=pytest.mark.slow, id="step-7-applied-not-logged"),
    pytest.param("log:5", "checkpoint-3", marks=pytest.mark.slow, id="half-written-metrics-record"),
    pytest.param("ckpt_rename:3", "checkpoint-6", marks=pytest.mark.slow, id="checkpoint-9-complete-not-renamed"),
    pytest.param("after_ckpt:1", "checkpoint-3", marks=pytest.mark.slow, id="after-checkpoint-3-before-step-4"),
    pytest.param("after_ckpt:3", "checkpoint-9", marks=pytest.mark.slow, id="after-checkpoint-9-epoch-1-mid-round"),
]
# max_staleness 2: the rollout worker (grouprl.train.pipeline) samples a round ahead while the trainer trains
ASYNC = [
    pytest.param("clip:4", "checkpoint-3", marks=pytest.mark.slow, id="k2-trainer-mid-step-rounds-queued"),
    pytest.param("push:5", "checkpoint-3", marks=pytest.mark.slow, id="k2-trainer-during-weight-push-5"),
    pytest.param("worker_gen:3", "checkpoint-3", marks=pytest.mark.slow, id="k2-worker-mid-round-3"),
    pytest.param("worker_push:7", "checkpoint-6", marks=pytest.mark.slow, id="k2-worker-during-weight-push-7"),
]
CASES = [pytest.param(0, *p.values, marks=p.marks, id=p.id) for p in SYNC] + \
        [pytest.param(2, *p.values, marks=p.marks, id=p.id) for p in ASYNC]


@pytest.mark.parametrize(("k", "kill", "resumes_from"), CASES)
def test_sigkill_then_resume_trains_every_prompt_exactly_once(k, kill, resumes_from, tiny_model_dir, data, reference,
                                                              resumed_reference, tmp_path):
    from grouprl.train.checkpoint import latest_checkpoint

    full_records, full_rounds, _ = reference(k)
    out, extra = tmp_path / "killed", [f"max_staleness={k}"] if k else []
    killed = subprocess.run(command(tiny_model_dir, data, out, *extra), env=environment(kill), capture_output=True,
                            text=True, timeout=600)
    if kill.startswith("worker_"):  # the worker died: the trainer stops with an error naming it (exit code 2)
        assert killed.returncode == 2 and "died with exit code -9" in killed.stderr, (killed.returncode,
                                                                                     killed.stderr[-3000:])
    else:
        assert killed.returncode == -signal.SIGKILL, (killed.returncode, killed.stderr[-3000:])
    left = latest_checkpoint(out)
    assert (left.name if left else None) == resumes_from
    assert not (out / "final").exists()  # what the kill left is an interrupted run, not a finished one
    resumed = subprocess.run(command(tiny_model_dir, data, out, *extra, "--resume"), env=environment(),
                             capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert not list(out.glob(".tmp-checkpoint-*"))  # a half-written checkpoint was redone and replaced
    records, rounds = train_records(out), check(out)
    same_ordinals(full_rounds, rounds)
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    expected = resumed_reference(k, resumes_from)
    for a, b in zip(expected, records):
        for key in COMPARED:
            assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-6), (a["step"], key)
        if k:  # the regenerated rounds were sampled by the same weight versions
            assert b["async/policy_version"] == a["async/policy_version"], a["step"]
            assert b["async/dropped"] == 0, a["step"]
