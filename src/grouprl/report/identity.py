"""Reward versioning: what exactly produced a run's reward, written to ``RUN_DIR/run_meta.json``, and the
differences between two runs (``grouprl report --compare``).

A reward is identified by its registry name or import path, a sha256 of its source code (so an edited
function is a different reward even under the same name), its options, its weight and weight schedule, and
the grouprl version.
"""

from __future__ import annotations

import datetime
import functools
import hashlib
import inspect
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from grouprl.report.runlog import META_FILE


def grouprl_version() -> str:
    """The installed grouprl's version (package metadata: the report never imports the package root)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("grouprl")
    except PackageNotFoundError:
        return "unknown"

def _resolve(spec: Any) -> tuple[str, Callable | None]:
    """(name as configured, the callable) for a registry name, ``pkg.mod:fn`` or a Python callable."""
    from grouprl.registry import REWARDS

    if callable(spec):
        fn = spec.func if isinstance(spec, functools.partial) else spec
        target = fn if inspect.isfunction(fn) or inspect.isclass(fn) else type(fn)
        return f"{target.__module__}:{target.__qualname__}", spec
    if spec not in REWARDS and ":" not in str(spec):
        from grouprl.builtins import load_builtins

        load_builtins()
    try:
        return str(spec), REWARDS.resolve(str(spec)) if ":" in str(spec) else REWARDS.get(str(spec))
    except Exception:  # an unknown reward is reported as such, not raised: the trainer validated it already
        return str(spec), None


def source_hash(fn: Callable | None) -> str | None:
    """sha256 of the function's (or callable object's class's) source text; None when it has no source."""
    if fn is None:
        return None
    target = fn.func if isinstance(fn, functools.partial) else fn
    if not (inspect.isfunction(target) or inspect.isclass(target) or inspect.ismethod(target)):
        target = type(target)
    try:
        src = inspect.getsource(target)
    except (OSError, TypeError):
        return None
    return hashlib.sha256(src.encode()).hexdigest()


def reward_identity(reward_funcs: Sequence[Any], reward_kwargs: Mapping[str, Any] | None = None,
                    weights: Sequence[float] | None = None,
                    schedule: Mapping[str, Any] | Sequence[Any] | None = None) -> list[dict[str, Any]]:
    """One record per reward function: ``name`` (registry name or ``module:qualname``), ``kind``
    (``registry`` / ``import`` / ``callable``), ``module``, ``source_sha256``, ``options`` (its
    ``reward_kwargs`` entry), ``weight``, ``schedule`` and ``grouprl_version``.

    ``schedule``: the weight schedule if the run has one, either by reward name or one entry per reward.
    """
    reward_kwargs = reward_kwargs or {}
    out = []
    for i, spec in enumerate(reward_funcs):
        name, fn = _resolve(spec)
        kind = "callable" if callable(spec) else ("import" if ":" in name else "registry")
        target = getattr(fn, "func", fn)
        if isinstance(schedule, Mapping):
            sched = schedule.get(name)
        elif schedule is not None and i < len(schedule):
            sched = schedule[i]
        else:
            sched = None
        out.append({
            "name": name,
            "kind": kind,
            "module": getattr(target, "__module__", None) if fn is not None else None,
            "source_sha256": source_hash(fn),
            "options": json.loads(json.dumps(reward_kwargs.get(name, {}), default=str)),
            "weight": float(weights[i]) if weights is not None else 1.0,
            "schedule": json.loads(json.dumps(sched, default=str)) if sched is not None else None,
            "grouprl_version": grouprl_version(),
        })
    return out


def write_run_meta(run_dir: str | Path, reward_funcs: Sequence[Any], reward_kwargs: Mapping[str, Any] | None = None,
                   weights: Sequence[float] | None = None, schedule: Any = None,
                   extra: Mapping[str, Any] | None = None) -> Path:
    """Write ``RUN_DIR/run_meta.json``: ``{"grouprl_version", "written_at", "rewards": reward_identity(...)}``
    plus ``extra``. Call once at the start of training, after the output folder is prepared."""
    meta = {"grouprl_version": grouprl_version(),
            "written_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "rewards": reward_identity(reward_funcs, reward_kwargs, weights, schedule), **(extra or {})}
    path = Path(run_dir) / META_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(meta, indent=2, default=str) + "\n", encoding="utf-8")
    return path


def flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    """{'a': {'b': 1}} -> {'a.b': 1}; lists stay values."""
    if not isinstance(d, Mapping):
        return {prefix: d} if prefix else {}
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        out.update(flatten(v, key) if isinstance(v, Mapping) and v else {key: v})
    return out


IGNORED_CONFIG = ("output_dir", "run_name", "logging_dir", "overwrite_output_dir")


def config_diff(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Config keys whose values differ between two runs: ``[{key, a, b}]`` (missing = None)."""
    fa, fb = flatten(a), flatten(b)
    return [{"key": k, "a": fa.get(k), "b": fb.get(k)} for k in sorted(set(fa) | set(fb))
            if fa.get(k) != fb.get(k) and k.split(".")[0] not in IGNORED_CONFIG]


def rewards_of(meta: Mapping[str, Any], config: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A run's reward records: from run_meta.json when written, else what config.yaml says (no hashes)."""
    if meta.get("rewards"):
        return list(meta["rewards"])
    funcs = config.get("reward_funcs") or []
    weights = config.get("reward_weights") or [1.0] * len(funcs)
    kwargs = config.get("reward_kwargs") or {}
    return [{"name": str(f), "source_sha256": None, "options": kwargs.get(str(f), {}), "weight": w,
             "schedule": None, "grouprl_version": None} for f, w in zip(funcs, weights)]


def reward_diff(ra: list[dict[str, Any]], rb: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per reward name: its record in each run and which fields changed (``added``/``removed`` too)."""
    by_a, by_b = {r["name"]: r for r in ra}, {r["name"]: r for r in rb}
    out = []
    for name in list(by_a) + [n for n in by_b if n not in by_a]:
        a, b = by_a.get(name), by_b.get(name)
        if a is None or b is None:
            changed = ["added"] if a is None else ["removed"]
        else:
            changed = [k for k in ("source_sha256", "options", "weight", "schedule", "grouprl_version")
                       if a.get(k) != b.get(k)]
        out.append({"name": name, "a": a, "b": b, "changed": changed})
    return out
