"""The report of a real (short) run of the built-in default recipe: every key the trainer logged is in the
page's data, every numeric key is plotted, the sample review and the eval curve are there, no alert fires."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from grouprl.cli import main
from grouprl.report.page import parse_data

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def real_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("real") / "run"
    cmd = [sys.executable, "-m", "grouprl.cli", "train", "-c", "recipes/default.yaml", "max_steps=6",
           "eval_steps=3", "max_eval_samples=20", f"output_dir={out}", "overwrite_output_dir=true",
           "log_completions_steps=2", "num_completions_to_log=16", "progress_bar=false"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
    # the first run of the suite builds the warm-start model (cached in the test cache, tests/conftest.py, ~2 min)
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    assert p.returncode == 0, p.stderr[-4000:]
    return out


def test_report_of_a_real_run_holds_every_logged_key(real_run, tmp_path):
    out = tmp_path / "report.html"
    assert main(["report", str(real_run), "-o", str(out), "--review-window", "5"]) == 0
    data = parse_data(out.read_text())
    rows = [json.loads(x) for x in (real_run / "metrics.jsonl").read_text().splitlines()]
    logged = {k for r in rows for k in r if k != "step"}
    assert logged and set(data["metric_keys"]) == logged
    cols = data["runs"][0]["columns"]
    assert cols["step"] == [r["step"] for r in rows]
    for k in logged:
        assert cols[k] == [r.get(k) for r in rows], k
    numeric = {k for r in rows for k, v in r.items() if k != "step" and isinstance(v, (int, float))}
    assert {k for p in data["panels"] for k in p["keys"]} == numeric
    assert "eval/accuracy" in next(p for p in data["panels"] if p["id"] == "panel-eval")["keys"]
    assert data["alerts"] == []


def test_real_run_samples_reach_the_review(real_run, tmp_path):
    samples = [json.loads(x) for x in (real_run / "samples.jsonl").read_text().splitlines()]
    train = [s for s in samples if not s.get("eval")]
    assert main(["report", str(real_run), "-o", str(tmp_path / "r.html")]) == 0
    data = parse_data((tmp_path / "r.html").read_text())
    reviewed = [r for w in data["review"] for r in w["top"] + w["bottom"]]
    assert len(reviewed) == min(len(train), 40) and all("advantage" in r and "length" in r for r in reviewed)
    assert max(r["reward"] for r in reviewed) == max(s["reward"] for s in train)
