"""What a fresh run may find in its ``output_dir``, and what it does about it (torch-free: checked before any
model loads).

A run writes ``checkpoint-<step>/`` (and ``.tmp-checkpoint-<step>/`` while saving), ``final/``,
``metrics.jsonl``, ``samples.jsonl``, ``tensorboard/events.out.tfevents.*`` and ``config.yaml``. A fresh
(non-resume) run into a directory that holds an earlier run's checkpoints or final model would mix the two:
``--resume`` could later pick the old run's newest checkpoint, and ``save_total_limit`` could delete the new
run's checkpoints while keeping the old, higher-numbered ones. So, as in HF's ``overwrite_output_dir``:

* resuming: nothing is checked or removed;
* earlier checkpoints / final model and ``overwrite_output_dir`` false: ``ConfigError`` naming the directory,
  the newest checkpoint and the fixes;
* otherwise the earlier run's artefacts listed above are removed (only those names; the directory itself and
  any other file in it are left alone), so nothing of the old run mixes with the new one.

Whether a run resumes is decided here too, before any model loads (:func:`decide_resume`, :func:`check_run_folder`):
``resume_from_checkpoint: auto`` (the recipes' setting) resumes an unfinished run and starts afresh after a
finished one; ``--resume`` with no complete checkpoint yet starts a fresh run, saying so; a resume whose
config changed is checked by ``grouprl.run.resume_config``. :func:`start_run` does all of it for the
trainer, under the output_dir lock (``grouprl.run.lock``).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

from grouprl.errors import ConfigError

CHECKPOINT = re.compile(r"^(?:\.tmp-)?checkpoint-(\d+)$")
# what a run writes besides checkpoints and final/: logs, its report and records (an overwrite removes them)
LOG_FILES = ("metrics.jsonl", "samples.jsonl", "report.html", "run_meta.json", "config_changes.jsonl",
             "review_marks.jsonl")
TB_DIR = "tensorboard"


def is_resuming(resume: Any, cfg: Any) -> bool:
    """The loop's rule: the ``train(resume_from_checkpoint=)`` argument wins, else the config field."""
    value = resume if resume is not None else cfg.resume_from_checkpoint
    return value not in (None, False, "", "false")


def earlier_run(output_dir: str | Path) -> dict[str, Any]:
    """The artefacts of an earlier run in ``output_dir``: checkpoints (complete, by step), leftover
    ``.tmp-checkpoint-*``, ``final/``, log files and TensorBoard event files."""
    root = Path(output_dir)
    found: dict[str, Any] = {"checkpoints": [], "partial": [], "final": None, "logs": []}
    if not root.is_dir():
        return found
    steps = []
    for p in root.iterdir():
        m = CHECKPOINT.match(p.name)
        if m and p.is_dir():
            (found["partial"] if p.name.startswith(".tmp-") else steps).append((int(m.group(1)), p))
    found["checkpoints"] = [p for _, p in sorted(steps)]
    found["partial"] = [p for _, p in sorted(found["partial"])]
    found["partial"] += [root / n for n in (".tmp-final", ".old-final") if (root / n).is_dir()]  # killed final save
    if (root / "final").is_dir():
        found["final"] = root / "final"
    found["logs"] = [root / name for name in LOG_FILES if (root / name).exists()]
    tb = root / TB_DIR
    if tb.is_dir() and not tb.is_symlink():
        found["logs"] += sorted(tb.glob("events.out.tfevents.*"))
    return found


def check_output_dir(cfg: Any, resume: Any = None) -> dict[str, Any] | None:
    """Raise ConfigError when a fresh run would mix with an earlier one; return what would be removed
    (``None`` when resuming). Reads only: safe for ``--dry-run`` and before any model loads."""
    if is_resuming(resume, cfg):
        return None
    found = earlier_run(cfg.output_dir)
    if (found["checkpoints"] or found["final"]) and not cfg.overwrite_output_dir:
        raise ConfigError(_refusal(cfg.output_dir, found))
    _check_not_inside(cfg, found)
    return found


def prepare_output_dir(cfg: Any, resume: Any = None) -> list[Path]:
    """Check (as :func:`check_output_dir`), then remove the earlier run's artefacts. Returns the removed paths."""
    found = check_output_dir(cfg, resume)
    if found is None:
        return []
    removed = []
    for path in [*found["checkpoints"], *found["partial"], *([found["final"]] if found["final"] else []),
                 *found["logs"]]:
        if path.is_symlink() or path.is_file():
            path.unlink()
        else:
            shutil.rmtree(path)
        removed.append(path)
    tb = Path(cfg.output_dir) / TB_DIR
    if tb.is_dir() and not tb.is_symlink() and not any(tb.iterdir()):
        tb.rmdir()
    return removed


def _refusal(output_dir: str | Path, found: dict[str, Any]) -> str:
    newest = found["checkpoints"][-1] if found["checkpoints"] else None
    held = (f"checkpoints of an earlier run (newest: {newest.name}, {len(found['checkpoints'])} in all)"
            if newest else "the final model of an earlier run (final/)")
    fixes = []
    if newest:
        fixes.append(f"`--resume` (or resume_from_checkpoint=true) to continue it from {newest.name}")
    fixes.append("`overwrite_output_dir=true` to delete its checkpoints, final model and logs and start afresh")
    fixes.append("a different output_dir=<dir>")
    return (f"output_dir {str(output_dir)!r} already holds {held}; a fresh run there would mix with it. "
            f"Fix: " + "; or ".join(fixes) + ".")


def _check_not_inside(cfg: Any, found: dict[str, Any]) -> None:
    """Never delete the model or data the new run reads (e.g. model=<output_dir>/final with overwrite)."""
    doomed = [p.resolve() for p in [*found["checkpoints"], *found["partial"]]
              + ([found["final"]] if found["final"] else [])]
    for name in ("model", "dataset"):
        value = getattr(cfg, name, None)
        if not isinstance(value, str) or not value or value.startswith("builtin:"):
            continue
        src = Path(value).expanduser()
        if not src.exists():
            continue
        src = src.resolve()
        for d in doomed:
            if src == d or d in src.parents:
                raise ConfigError(f"{name}={value!r} lies in {str(d)!r}, which this fresh run would delete from "
                                  f"output_dir {str(cfg.output_dir)!r} (overwrite_output_dir=true). Fix: use another "
                                  f"output_dir, or copy the {name} elsewhere first.")


# ---- which run this is: fresh, resumed, or (resume_from_checkpoint: auto) decided by what the folder holds
COMPLETE = ".complete"  # written into final/ (before its atomic rename) with the step it was saved at


def is_finished(found: dict[str, Any]) -> bool:
    """A complete ``final/`` at least as new as the newest checkpoint (a finished run later extended with
    ``--resume max_steps=...`` and killed has newer checkpoints than its final model: unfinished)."""
    if found["final"] is None:
        return False
    if not found["checkpoints"]:
        return True
    newest = int(CHECKPOINT.match(found["checkpoints"][-1].name).group(1))
    try:
        step = int((found["final"] / COMPLETE).read_text().strip() or 0)
    except (OSError, ValueError):  # a final/ from before the marker: compare times
        return found["final"].stat().st_mtime >= found["checkpoints"][-1].stat().st_mtime
    return step >= newest


def decide_resume(cfg: Any, resume: Any = None) -> tuple[Any, str | None]:
    """What to do with ``output_dir``, decided before any model loads: (the resume value to run with --
    ``False`` = fresh, ``True`` = newest checkpoint, or a path --, a line saying what was decided or None).

    * ``auto``: an unfinished run (checkpoints, no complete final/) is resumed; a finished one (or an empty
      folder) gives a fresh run -- which, like any fresh run, needs ``overwrite_output_dir: true`` to delete
      the finished run's files, and is refused otherwise.
    * ``true`` / ``latest`` with no complete checkpoint yet (a run stopped before its first save): a fresh run.
    """
    value = resume if resume is not None else cfg.resume_from_checkpoint
    if value in (None, False, "", "false"):
        return False, None
    out = str(cfg.output_dir)
    found = earlier_run(out)
    newest = found["checkpoints"][-1].name if found["checkpoints"] else None
    if value == "auto":
        if newest and not is_finished(found):
            return True, (f"grouprl: {out} holds an unfinished run (newest checkpoint {newest}, no complete "
                          f"final/): resuming it (resume_from_checkpoint: auto)")
        if found["final"] is not None:
            what = ("deleting its checkpoints, final model and logs (overwrite_output_dir: true; to keep them, "
                    "copy final/ elsewhere or set another output_dir)" if cfg.overwrite_output_dir else
                    "but overwrite_output_dir is false")
            return False, (f"grouprl: {out} holds a finished run (complete final/): starting afresh, {what} "
                           f"(resume_from_checkpoint: auto)")
        return False, None
    if value is True or value in ("true", "latest"):
        if newest is None:
            return False, (f"grouprl: --resume: {out} holds no complete checkpoint yet (the run stopped before its "
                           f"first save): starting a fresh run")
        return True, None
    return value, None


def resume_checkpoint(cfg: Any, resume: Any) -> Path | None:
    """The checkpoint a decided resume value (:func:`decide_resume`) points at, or None."""
    if resume in (None, False, "", "false"):
        return None
    if resume is True or resume in ("true", "latest"):
        found = earlier_run(cfg.output_dir)["checkpoints"]
        return found[-1] if found else None
    return Path(resume)


def check_run_folder(cfg: Any, resume: Any = None) -> tuple[Any, dict[str, list]]:
    """Everything about the output folder that can be decided before a model loads (reads only): what to
    resume (printing what was decided), whether a fresh run may use the folder, and whether the config may
    change this way on resume. Returns (the resume value to run with, the safe config changes). Decided
    once: called again with that decision and the same config (``grouprl train``, then the trainer's
    :func:`start_run`) it returns the same answer without checking again."""
    from grouprl.run.resume_config import check_resume_config

    key = repr((cfg.to_dict(), earlier_run(cfg.output_dir)))  # the same config and the same folder contents
    done = cfg.__dict__.get("_run_folder")
    if done is not None and done[0] == key and done[1] == resume:
        return done[1], done[2]
    resume, note = decide_resume(cfg, resume)
    if note:
        print(note, flush=True)
    check_output_dir(cfg, resume)
    changes = check_resume_config(cfg, resume_checkpoint(cfg, resume))
    cfg.__dict__["_run_folder"] = (key, resume, changes)
    return resume, changes


def start_run(cfg: Any, resume: Any = None) -> Any:
    """:func:`check_run_folder`, then clear an earlier run's files (fresh run), write the config in effect to
    ``config.yaml`` and record resume-time changes in ``config_changes.jsonl``. Call with the run lock held
    (``grouprl.run.lock``). Returns the resume value for ``loop.train``."""
    from grouprl.run.resume_config import record_changes

    resume, changes = check_run_folder(cfg, resume)
    removed = prepare_output_dir(cfg, resume)  # refuses to mix with an earlier run
    if removed:
        names = sorted({p.name for p in removed})
        print(f"grouprl: removed {len(removed)} item(s) of an earlier run from {cfg.output_dir} "
              f"({', '.join(names[:6])}{', ...' if len(names) > 6 else ''})")
    Path(cfg.output_dir).mkdir(parents=True, exist_ok=True)
    checkpoint = resume_checkpoint(cfg, resume)
    if changes and checkpoint is not None:
        record_changes(cfg.output_dir, checkpoint, changes)
        print("grouprl: resuming with a changed config: " + ", ".join(f"{k} {v[0]!r} -> {v[1]!r}"
                                                                     for k, v in changes.items()))
    cfg.to_yaml(Path(cfg.output_dir) / "config.yaml")  # the config in effect from now on
    return resume
