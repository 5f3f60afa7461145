"""The run report (``grouprl report``) kept up to date by the trainer.

``write_meta`` records, once per run, the identity of every reward function (registry name or import
path, a hash of its source, its options and weights); ``refresh`` rewrites ``RUN_DIR/report.html`` at each
evaluation, checkpoint and at the end. A report that fails to build only warns: it never stops training.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

log = logging.getLogger("grouprl")


def write_meta(cfg: Any, reward_funcs: Any) -> Path | None:
    """``RUN_DIR/run_meta.json`` with the rewards in use (``reward_funcs``: names, import paths or the callables
    the user passed)."""
    from grouprl.report import write_run_meta

    try:
        funcs = reward_funcs if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
        return write_run_meta(cfg.output_dir, list(funcs), cfg.reward_kwargs, cfg.reward_weights)
    except Exception as e:  # reporting must never end a run
        log.warning("could not write run_meta.json (%s: %s); training goes on", type(e).__name__, e)
        return None


_WARNED: dict[str, set[tuple[str, str]]] = {}


def refresh(output_dir: str | Path, review_window: int = 100) -> Path | None:
    """Rebuild ``report.html`` from the run folder; returns its path (``None`` and a warning on failure).
    Each alert the report raises is also printed on the console once per run (:func:`warn_alerts`)."""
    from grouprl.report import build_report

    try:
        path = build_report(output_dir, review_window=review_window)
    except Exception as e:  # reporting must never end a run
        log.warning("could not build the run report (%s: %s); training goes on", type(e).__name__, e)
        return None
    warn_alerts(output_dir)
    return path


def warn_alerts(output_dir: str | Path) -> list[str]:
    """Print ``grouprl: warning: <alert>`` on stderr for each alert of the run's report not printed before
    (the same checks, :func:`grouprl.report.compute_alerts`); returns the lines printed."""
    import sys

    from grouprl.report import compute_alerts
    from grouprl.report.build import load_run

    try:
        alerts = compute_alerts(load_run(output_dir).metrics)
    except Exception as e:  # reporting must never end a run
        log.warning("could not check the run's alerts (%s: %s)", type(e).__name__, e)
        return []
    seen = _WARNED.setdefault(str(Path(output_dir).resolve()), set())
    lines = []
    for a in alerts:
        if (a.name, a.anchor) not in seen:
            seen.add((a.name, a.anchor))
            lines.append(f"grouprl: warning: {a.name}: {a.message}")
            print(lines[-1], file=sys.stderr, flush=True)
    return lines
