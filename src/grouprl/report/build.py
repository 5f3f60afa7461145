"""``grouprl report``: build the run report (or the comparison of two runs) as one HTML file."""

from __future__ import annotations

import dataclasses
import html
from pathlib import Path
from typing import Any

from grouprl.report import data as D
from grouprl.report.alerts import Alert, AlertThresholds, compute_alerts
from grouprl.report.identity import config_diff, reward_diff, rewards_of
from grouprl.report.page import render
from grouprl.report.runlog import RunLog, load_run

REPORT_FILE = "report.html"


def reward_weights(run: RunLog) -> dict[str, float]:
    """Weight of each reward component by name, from run_meta.json or config.yaml."""
    return {r["name"]: float(r.get("weight") or 1.0) for r in rewards_of(run.meta, run.config)}


def _alerts_html(alerts: list[Alert], t: AlertThresholds) -> str:
    if not alerts:
        return ('<section id="alerts"><h2>Alerts</h2><div class="ok">No alert fired '
                f'(thresholds: {html.escape(_thresholds_text(t))}).</div></section>')
    items = "".join(
        f'<div class="alert"><b>{html.escape(a.name)}</b>: {html.escape(a.message)} '
        f'<a href="#{html.escape(a.anchor)}">see the curve</a></div>' for a in alerts)
    return f'<section id="alerts"><h2>Alerts ({len(alerts)})</h2>{items}</section>'


def _thresholds_text(t: AlertThresholds) -> str:
    return ", ".join(f"{k}={v}" for k, v in dataclasses.asdict(t).items())


SECTIONS = """
<section id="curves"><h2>Curves (x axis: step)</h2><div class="grid" id="plots"></div></section>
<section id="distribution"><h2>Reward distribution over time</h2><div id="hist" class="plot"></div></section>
<section id="changelog"><h2>Reward changelog</h2><div id="changelog-body"></div></section>
<section id="review"><h2>Sample review</h2>
<p class="muted">Highest- and lowest-reward training samples of each window. Mark each as
"looks right" or "looks like a hack"; marks stay in this browser until you download them and run
<code>grouprl report RUN_DIR --marks marks.json</code>. Tokens: green = positive advantage, red = negative,
grey = masked (tool output, not trained on).</p>
<div><button id="download-marks">Download marks (JSON)</button> <span id="mark-count"></span></div>
<div id="review-body"></div></section>
"""

COMPARE_SECTIONS = """
<section id="reward-diff"><h2>Rewards: what changed</h2><div id="reward-diff-body"></div></section>
<section id="config-diff"><h2>Config: what changed</h2><div id="config-diff-body"></div></section>
<section id="curves"><h2>Curves (x axis: step; solid: A, dashed: B)</h2><div class="grid" id="plots"></div></section>
<section id="changelog"><h2>Reward changelog (B)</h2><div id="changelog-body"></div></section>
"""


def _run_entry(run: RunLog) -> dict[str, Any]:
    return {"name": run.name, "path": str(run.path), "columns": D.columns(run)}


def report_data(run: RunLog, review_window: int = 100, thresholds: AlertThresholds | None = None) -> dict[str, Any]:
    """Everything the report page shows, as JSON-able data (also what tests parse back)."""
    t = thresholds or AlertThresholds()
    alerts = compute_alerts(run.metrics, t, reward_weights(run))
    return {
        "kind": "report", "run_key": str(run.path.resolve()), "runs": [_run_entry(run)],
        "metric_keys": run.metric_keys(), "panels": D.panels(run),
        "histograms": D.histograms(run, review_window), "review_window": review_window,
        "review": D.review(run, review_window), "changelog": D.changelog(run, review_window),
        "alerts": [a.as_dict() for a in alerts], "thresholds": dataclasses.asdict(t),
        "rewards": rewards_of(run.meta, run.config), "marks": list(run.marks.values()),
    }


def build_report(run_dir: str | Path, out: str | Path | None = None, review_window: int = 100,
                 thresholds: AlertThresholds | None = None) -> Path:
    """Write the report of ``run_dir`` to ``out`` (default ``RUN_DIR/report.html``) and return its path."""
    if review_window < 1:
        from grouprl.errors import ConfigError

        raise ConfigError(f"--review-window {review_window}: give a number of steps >= 1 (default 100).")
    run = load_run(run_dir)
    t = thresholds or AlertThresholds()
    data = report_data(run, review_window, t)
    alerts = [Alert(**a) for a in data["alerts"]]
    steps = run.metrics[-1]["step"] if run.metrics else 0
    page = render(f"grouprl run report: {run.name}", f"{run.path.resolve()} - {len(run.metrics)} logged steps, "
                  f"last step {steps}, {len(run.samples)} samples", _alerts_html(alerts, t) + SECTIONS, data,
                  "report.js")
    path = Path(out) if out else run.path / REPORT_FILE
    tmp = path.with_name(path.name + ".tmp")
    try:  # a full disk leaves the previous report whole, never a truncated one
        tmp.write_text(page, encoding="utf-8")
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def compare_data(a: RunLog, b: RunLog, review_window: int = 100) -> dict[str, Any]:
    panel_run = RunLog(a.path, a.metrics + b.metrics)  # the union of both runs' keys
    return {
        "kind": "compare", "runs": [_run_entry(a), _run_entry(b)], "metric_keys": panel_run.metric_keys(),
        "panels": D.panels(panel_run),
        "reward_diff": reward_diff(rewards_of(a.meta, a.config), rewards_of(b.meta, b.config)),
        "config_diff": config_diff(a.config, b.config), "changelog": D.changelog(b, review_window),
    }


def build_compare(run_a: str | Path, run_b: str | Path, out: str | Path | None = None,
                  review_window: int = 100) -> Path:
    """Write the side-by-side comparison of two runs (default ``RUN_B/compare.html``)."""
    a, b = load_run(run_a), load_run(run_b)
    page = render(f"grouprl compare: {a.name} (A) vs {b.name} (B)", f"A = {a.path.resolve()}  B = "
                  f"{b.path.resolve()}", COMPARE_SECTIONS, compare_data(a, b, review_window), "report.js")
    path = Path(out) if out else b.path / "compare.html"
    path.write_text(page, encoding="utf-8")
    return path
