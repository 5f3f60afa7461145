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


def refresh(output_dir: str | Path, review_window: int = 100) -> Path | None:
    """Rebuild ``report.html`` from the run folder; returns its path (``None`` and a warning on failure)."""
    from grouprl.report import build_report

    try:
        return build_report(output_dir, review_window=review_window)
    except Exception as e:  # reporting must never end a run
        log.warning("could not build the run report (%s: %s); training goes on", type(e).__name__, e)
        return None
