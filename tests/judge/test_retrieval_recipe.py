"""recipes/retrieval.yaml end to end with one command: the run serves its own judge on loopback, scores with it,
prints the judge/rule agreement line, and leaves no server behind. Fast form: random tiny models in place
of the built-in policy and judge; slow form: the recipe's own warm-started models, a few steps."""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

import psutil
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SUMMARY = re.compile(r"judge/rule agreement (\S+) over (\d+) judged answers \((\d+) no opinion; rule: (\d+) correct, "
                     r"(\d+) supported; judge: (\d+) correct\)")


def _train(tmp_path, *overrides: str, timeout: int) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "grouprl", "train", "-c", "recipes/retrieval.yaml", f"output_dir={tmp_path / 'run'}",
           f"reward_kwargs.retrieval.judge.cache_dir={tmp_path / 'judge-cache'}", "progress_bar=false", *overrides]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    # the run's judge server was told to watch this run (--parent-pid); none may outlive it
    mine = ["--parent-pid", str(proc.pid)]
    left = [q.pid for q in psutil.process_iter(["cmdline"])
            if any((q.info["cmdline"] or [])[i:i + 2] == mine for i in range(len(q.info["cmdline"] or [])))]
    assert not left, f"judge servers left running: {left}"
    p = subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)
    assert p.returncode == 0, p.stderr[-4000:]
    return p


def _summary(stderr: str) -> tuple:
    found = SUMMARY.findall(stderr)
    assert len(found) == 1, stderr[-3000:]
    return found[0]


def test_the_recipe_runs_with_its_own_served_judge(tmp_path, tiny_model_dir, tiny_judge_dir):
    p = _train(tmp_path, f"model={tiny_model_dir}", "max_steps=1", "max_new_tokens=48", "per_device_train_batch_size=8",
               f"reward_kwargs.retrieval.judge.serve.model={tiny_judge_dir}",
               "reward_kwargs.retrieval.judge.serve.startup_timeout_s=180", timeout=900)
    agreement, judged, no_opinion, *_ = _summary(p.stderr)
    # training: 2 prompts x G=4; the final evaluation: the 2 held-out prompts. Structured replies always parse.
    assert int(judged) == 8 + 2 and int(no_opinion) == 0
    assert 0.0 <= float(agreement) <= 1.0
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert any("judge/agreement" in m for m in metrics), metrics[-1].keys()


@pytest.mark.slow
def test_the_recipe_with_its_built_in_models(tmp_path):
    """The recipe as shipped (3 steps): the retriever writes mostly supported answers and the judge scores every
    one of them. Its agreement with the rule is not asserted: on the policy's own answers the fenced judge agreed
    on 0.49-0.59 over full 20-step runs (recipe header, benchmarks/results/retrieval.json), where always-10 gets
    0.65-0.69 (0.659 on the held-out items of tests/judge/test_builtin_judge.py), i.e. about chance, and its
    random fence tags make it differ from run to run: a measurement, not a property."""
    p = _train(tmp_path, "max_steps=3", timeout=3600)
    agreement, judged, no_opinion, rule_correct, supported, _ = _summary(p.stderr)
    assert int(judged) == 3 * 32 + 2 and int(no_opinion) == 0
    assert int(supported) >= int(judged) // 2 and int(rule_correct) > 0  # the warm start copies the ids it was shown
    assert 0.0 <= float(agreement) <= 1.0
