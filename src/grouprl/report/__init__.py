"""The offline run report and the algorithm explainers: HTML pages built from a run folder's files
(``metrics.jsonl``, ``samples.jsonl``, ``config.yaml``, ``run_meta.json``); never imports the trainer.

- :func:`build_report` / :func:`build_compare`: ``grouprl report RUN_DIR`` / ``--compare RUN_A RUN_B``.
- :func:`write_run_meta` / :func:`reward_identity`: the reward versioning record the trainer writes.
- :func:`compute_alerts`: the checks shown at the top of the report (pure functions over the metrics).
- :func:`fold_marks`: reviewers' marks downloaded from the page, back into the run folder.
"""

from grouprl.report.alerts import Alert, AlertThresholds, compute_alerts
from grouprl.report.build import REPORT_FILE, build_compare, build_report
from grouprl.report.identity import reward_identity, write_run_meta
from grouprl.report.runlog import fold_marks, load_run

__all__ = ["Alert", "AlertThresholds", "compute_alerts", "REPORT_FILE", "build_compare", "build_report",
           "reward_identity", "write_run_meta", "fold_marks", "load_run"]
