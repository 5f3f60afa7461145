"""Read a run folder back: ``metrics.jsonl``, ``samples.jsonl``, ``config.yaml``, ``run_meta.json`` and the
reviewers' ``review_marks.jsonl``. Only reads files; knows nothing about the trainer that wrote them.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grouprl.errors import ConfigError

MARKS_FILE = "review_marks.jsonl"
META_FILE = "run_meta.json"
MARK_VALUES = ("right", "hack")


@dataclass
class RunLog:
    """Everything a report needs from one run folder."""

    path: Path
    metrics: list[dict[str, Any]] = field(default_factory=list)
    """One dict per logged step, as written (``step`` plus metric keys)."""
    samples: list[dict[str, Any]] = field(default_factory=list)
    """Sample rows; each gains an ``id`` (stable hash of step, prompt and completion)."""
    config: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    marks: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Reviewer marks by sample id (the latest mark of each sample wins)."""

    @property
    def name(self) -> str:
        return self.path.name

    def metric_keys(self) -> list[str]:
        """Every key the trainer logged (``step`` excluded), in first-seen order."""
        keys: dict[str, None] = {}
        for row in self.metrics:
            keys.update((k, None) for k in row if k != "step")
        return list(keys)

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """(steps, values) of a numeric metric, skipping steps where it is missing or not finite."""
        xs, ys = [], []
        for row in self.metrics:
            v = row.get(key)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                xs.append(int(row["step"]))
                ys.append(float(v))
        return xs, ys


def sample_id(row: dict[str, Any]) -> str:
    """A short id that stays the same for the same sample across reports (marks refer to it)."""
    text = json.dumps([row.get("step"), row.get("eval"), row.get("prompt"), row.get("completion")],
                      default=str, sort_keys=True)
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Rows of a JSON-lines file; a half-written last line (a run still writing) is skipped."""
    if not path.exists():
        return []
    rows = []
    lines = path.read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            if i == len(lines) - 1:
                break
            raise ConfigError(f"{path}: line {i + 1} is not JSON ({e}); fix or delete that line.") from e
    return rows


def load_run(run_dir: str | Path) -> RunLog:
    """Parse a run folder. It must hold ``metrics.jsonl``; everything else is optional."""
    path = Path(run_dir)
    if not (path / "metrics.jsonl").exists():
        raise ConfigError(f"{path} holds no metrics.jsonl: pass the output_dir of a grouprl training run.")
    metrics = [r for r in read_jsonl(path / "metrics.jsonl") if isinstance(r.get("step"), (int, float))]
    metrics.sort(key=lambda r: r["step"])
    samples = read_jsonl(path / "samples.jsonl")
    for row in samples:
        row["id"] = sample_id(row)
    config: dict[str, Any] = {}
    if (path / "config.yaml").exists():
        import yaml

        config = yaml.safe_load((path / "config.yaml").read_text(encoding="utf-8")) or {}
    meta = json.loads((path / META_FILE).read_text(encoding="utf-8")) if (path / META_FILE).exists() else {}
    marks = {m["id"]: m for m in read_jsonl(path / MARKS_FILE) if "id" in m}
    return RunLog(path, metrics, samples, config, meta, marks)


def fold_marks(run_dir: str | Path, marks_file: str | Path) -> int:
    """Append the marks a reviewer downloaded from the report (``marks.json``) to
    ``RUN_DIR/review_marks.jsonl``; the next report shows them. Returns how many marks were added.

    ``marks.json`` is ``{"marks": [{"id", "mark": "right"|"hack", "step", "note"?}, ...]}`` (or the bare
    list). A mark identical to the one already recorded for that sample is not written twice.
    """
    src = Path(marks_file)
    try:
        data = json.loads(src.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"--marks {src}: cannot read it as JSON ({e}); pass the file the report downloaded.") from e
    marks = data.get("marks") if isinstance(data, dict) else data
    if not isinstance(marks, list):
        raise ConfigError(f"--marks {src}: expected {{'marks': [...]}} as downloaded from the report.")
    dest = Path(run_dir) / MARKS_FILE
    known = {m["id"]: m for m in read_jsonl(dest) if "id" in m}
    added = []
    for m in marks:
        if not isinstance(m, dict) or "id" not in m or m.get("mark") not in MARK_VALUES + (None,):
            raise ConfigError(f"--marks {src}: bad entry {m!r}; each needs an 'id' and a 'mark' in {MARK_VALUES}.")
        old = known.get(m["id"])
        if old is None or old.get("mark") != m.get("mark") or old.get("note") != m.get("note"):
            added.append(m)
            known[m["id"]] = m
    with dest.open("a", encoding="utf-8") as f:
        for m in added:
            f.write(json.dumps(m, sort_keys=True) + "\n")
    return len(added)
