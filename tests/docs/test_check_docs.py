"""benchmarks/check_docs.py: the docs still quote every range it checks, and its verdicts are right."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("check_docs", ROOT / "benchmarks" / "check_docs.py")
check_docs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check_docs)


def test_every_quoted_range_is_in_the_files_that_quote_it():
    for name in check_docs.CLAIMS:
        assert check_docs.judge(name, [])["missing_quotes"] == [], name


def test_a_figure_outside_its_range_fails_and_one_inside_passes():
    inside = [{"seed": 0, "start": 9.0, "end": 72.5}, {"seed": 1, "start": 9.0, "end": 76.0}]
    assert check_docs.judge("default", inside)["ok"]
    outside = inside + [{"seed": 2, "start": 9.0, "end": 40.0}]
    verdict = check_docs.judge("default", outside)
    assert not verdict["ok"] and verdict["checks"]["end"]["measured"] == [72.5, 76.0, 40.0]
    assert not check_docs.judge("default", [{"seed": 0, "error": ["error: x"]}])["ok"]


def test_evaluations_are_read_from_metrics_jsonl(tmp_path):
    rows = [{"step": 0, "eval/accuracy": 0.09}, {"step": 1, "reward": 0.5}, {"step": 10, "eval/accuracy": 0.705}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert check_docs.evals(tmp_path / "metrics.jsonl") == [(0, 9.0), (10, 70.5)]


def test_make_check_docs_runs_it():
    assert "benchmarks/check_docs.py" in (ROOT / "Makefile").read_text()
