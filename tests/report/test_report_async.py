"""The run report draws the asynchronous pipeline's metrics in their own panels when a run logged them."""

from __future__ import annotations

import json

from grouprl.report.data import panels
from grouprl.report.runlog import load_run


def _run(tmp_path, extra):
    rows = [{"step": s, "reward": 0.1 * s, "time/step": 1.0, **extra(s)} for s in range(1, 5)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return load_run(tmp_path)


def test_async_metrics_get_their_panels(tmp_path):
    run = _run(tmp_path, lambda s: {"async/staleness_mean": min(s - 1, 2), "async/staleness_max": min(s - 1, 2),
                                    "async/dropped": 0, "async/trainer_wait_s": 0.01, "async/rollout_wait_s": 0.5,
                                    "async/policy_version": max(0, s - 3), "mismatch/logp_abs_diff": 0.01 * s})
    got = {p["id"]: p["keys"] for p in panels(run)}
    assert got["panel-staleness"] == ["async/staleness_mean", "async/staleness_max", "async/dropped"]
    assert got["panel-async_wait"] == ["async/trainer_wait_s", "async/rollout_wait_s"]
    assert got["panel-mismatch"] == ["mismatch/logp_abs_diff"] and got["panel-async"] == ["async/policy_version"]


def test_a_synchronous_run_has_no_async_panel(tmp_path):
    ids = {p["id"] for p in panels(_run(tmp_path / "", lambda s: {}))}
    assert not ids & {"panel-staleness", "panel-async_wait", "panel-mismatch", "panel-async"}
