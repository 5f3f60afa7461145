"""Preference pairs for ``algorithm: dpo``: loading, row checks, and ``builtin:arithmetic_prefs``.

A preference row has ``prompt``, ``chosen`` and ``rejected`` columns (TRL's preference format): plain text,
or chat messages -- ``prompt`` a list of messages, ``chosen`` / ``rejected`` the assistant turn(s) as a list
of messages. Other columns are kept. :func:`check_pref_rows` raises ``DataError`` naming the first row that
cannot be trained on (a missing column, an empty value, ``chosen == rejected``) before any model loads.

``builtin:arithmetic_prefs`` are pairs made offline from a model's own samples on the ``arithmetic``
training prompts, labelled by the same verifiable reward GRPO trains on (:func:`pairs_from_samples`):
``chosen`` = a sample the reward scores correct, ``rejected`` = one it scores wrong; prompts whose samples
all agree give no pair. The sampling itself needs a model, so the trainer (``grouprl.train.algorithms.dpo``) draws the
samples and this module turns them into pairs and caches the result under
``<cache_dir>/prefs/arithmetic_prefs-<hash>`` (``$GROUPRL_CACHE``, else ``$XDG_CACHE_HOME/grouprl``, else
``~/.cache/grouprl``, as the built-in warm starts), the hash covering everything that determines the pairs.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

from grouprl.errors import DataError

COLUMNS = ("prompt", "chosen", "rejected")
BUILTIN_PREFS = ("arithmetic_prefs",)
"""``builtin:<name>`` preference datasets (built from the policy's own samples by grouprl.train.algorithms.dpo)."""
FORMAT_VERSION = 1
META_FILE = "meta.json"
PAIRS_FILE = "pairs.jsonl"


def check_pref_rows(rows: Any, where: str = "dataset") -> None:
    """Raise DataError naming the first unusable row: a missing column, an empty or malformed value, or
    ``chosen`` equal to ``rejected`` (a pair that says nothing)."""
    names = list(rows.column_names) if hasattr(rows, "column_names") else (list(rows[0]) if len(rows) else [])
    missing = [c for c in COLUMNS if c not in names]
    if missing:
        raise DataError(f"{where}: preference data needs columns {', '.join(COLUMNS)}; missing "
                        f"{', '.join(missing)} (columns: {', '.join(names) or 'none'}). Rename the columns, or "
                        f"use a preference dataset (e.g. builtin:arithmetic_prefs).")
    if len(rows) == 0:
        raise DataError(f"{where}: no preference rows.")
    for i in range(len(rows)):
        row = rows[i]
        for column in COLUMNS:
            problem = _value_problem(row.get(column), prompt=column == "prompt")
            if problem:
                raise DataError(f"{where}, row {i}, column {column!r}: {problem} (value: {_short(row.get(column))}).")
        if _text(row["chosen"]) == _text(row["rejected"]):
            raise DataError(f"{where}, row {i}: chosen and rejected are the same ({_short(row['chosen'])}): the pair "
                            f"prefers nothing. Remove the row or fix one side.")


def _value_problem(value: Any, *, prompt: bool) -> str:
    if value is None:
        return "missing value"
    if isinstance(value, str):
        return "" if value.strip() else "empty text"
    if isinstance(value, list):
        if not value:
            return "empty message list"
        for j, msg in enumerate(value):
            if not isinstance(msg, dict) or "role" not in msg or not isinstance(msg.get("content"), str):
                return f"message {j} must be a mapping with 'role' and text 'content'"
        if not prompt and not any(m["content"].strip() for m in value):
            return "every message is empty"
        return ""
    return f"expected text or a list of chat messages, got {type(value).__name__}"


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def _short(value: Any, n: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= n else text[: n - 3] + "..."


def is_builtin_prefs(spec: Any) -> bool:
    return isinstance(spec, str) and spec.startswith("builtin:") and spec.split(":", 1)[1] in BUILTIN_PREFS


BUILD_KEYS = {"n": 1000, "samples_per_prompt": 8, "temperature": 1.0, "pairs_per_prompt": 1, "threshold": 1.0,
              "batch": 64}
"""dataset_kwargs of the arithmetic_prefs builder and their defaults; any other key goes to the arithmetic task."""


def split_kwargs(dataset_kwargs: dict) -> tuple[dict[str, Any], dict[str, Any]]:
    """(builder settings with defaults filled, the arithmetic task's keywords)."""
    build = {k: dataset_kwargs.get(k, v) for k, v in BUILD_KEYS.items()}
    task = {k: v for k, v in dataset_kwargs.items() if k not in BUILD_KEYS}
    if int(build["samples_per_prompt"]) < 2:
        raise DataError(f"dataset_kwargs.samples_per_prompt={build['samples_per_prompt']}: a pair needs at least "
                        f"2 samples per prompt (8 is a good start).")
    return build, task


def builtin_prefs_split(name: str, split: str, **dataset_kwargs: Any):
    """The held-out split of a built-in preference dataset: the ``arithmetic`` task's own test split (prompts
    with answers, what GRPO evaluates on). Its training pairs come from a model's samples, so they are built by
    ``grouprl train`` with ``algorithm: dpo`` (grouprl.train.algorithms.dpo_prefs), not here."""
    from grouprl.data.tasks import load_task

    if split == "train":
        raise DataError(f"builtin:{name} is made from a model's own samples: train on it with `algorithm: dpo` "
                        f"(`grouprl train`), which builds and caches it.")
    _, task = split_kwargs(dataset_kwargs)
    return load_task("arithmetic", split, n=dataset_kwargs.get("n", BUILD_KEYS["n"]), **task)


# ---- pairs from a model's own samples, labelled by a verifiable reward -----------------------------------
def pairs_from_samples(rows: list[dict], samples: list[list[str]], rewards: list[list[float]], *, seed: int,
                       threshold: float = 1.0, pairs_per_prompt: int = 1) -> list[dict]:
    """Preference pairs: for row ``i``, ``chosen`` = a sample of ``samples[i]`` with reward >= ``threshold``,
    ``rejected`` = one below it (NaN rewards = no opinion: neither). Up to ``pairs_per_prompt`` pairs of
    distinct texts per prompt, picked with ``random.Random(f"{seed}|{i}")``; a prompt whose samples all
    agree (all correct, all wrong, or the same text) gives none.

    >>> pairs_from_samples([{"prompt": "1+1?", "answer": "2"}], [["Answer: 2", "Answer: 3"]], [[1.0, 0.0]],
    ...                    seed=0)
    [{'prompt': '1+1?', 'answer': '2', 'chosen': 'Answer: 2', 'rejected': 'Answer: 3'}]
    """
    pairs = []
    for i, (row, texts, scores) in enumerate(zip(rows, samples, rewards, strict=True)):
        good = list(dict.fromkeys(t for t, r in zip(texts, scores) if r == r and r >= threshold and t.strip()))
        bad = list(dict.fromkeys(t for t, r in zip(texts, scores) if r == r and r < threshold and t.strip()))
        bad = [t for t in bad if t not in good]
        if not good or not bad:
            continue
        rng = random.Random(f"{seed}|{i}")
        rng.shuffle(good)
        rng.shuffle(bad)
        for chosen, rejected in list(zip(good, bad))[:pairs_per_prompt]:
            pairs.append({**row, "chosen": chosen, "rejected": rejected})
    return pairs


def cache_root() -> Path:
    """``$GROUPRL_CACHE``, else ``$XDG_CACHE_HOME/grouprl`` (an absolute one, as the XDG spec says), else
    ``~/.cache/grouprl``: where every cache of grouprl lives (warm-started models, preference pairs)."""
    if os.environ.get("GROUPRL_CACHE"):
        root, where = Path(os.environ["GROUPRL_CACHE"]).expanduser(), "$GROUPRL_CACHE"
    else:
        xdg = os.environ.get("XDG_CACHE_HOME")
        base = Path(xdg).expanduser() if xdg and Path(xdg).is_absolute() else Path.home() / ".cache"
        root, where = base / "grouprl", "$XDG_CACHE_HOME/grouprl" if xdg else "~/.cache/grouprl"
    for part in (root, *root.parents):
        if part.exists():
            if not part.is_dir():
                from grouprl.errors import ConfigError

                raise ConfigError(f"the grouprl cache {where}={str(root)!r} cannot be a folder: {str(part)!r} is a "
                                  f"file. Fix: export GROUPRL_CACHE=<a folder> (or remove the file).")
            break
    return root


def cache_key(settings: dict[str, Any]) -> str:
    """A 12-hex-digit hash of everything that determines a built dataset (and the format version)."""
    blob = json.dumps({"v": FORMAT_VERSION, **settings}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


@contextlib.contextmanager
def building(target: Path, marker: str):
    """Build a cache folder atomically: yields a temporary folder next to ``target``, renamed to ``target``
    when the block ends (the ``marker`` file, written last, says it is complete). When another process
    published ``target`` first, its copy is kept; the temporary folder is always removed."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        yield tmp
        try:
            tmp.rename(target)
        except OSError:  # another process finished first: keep its copy
            if not (target / marker).exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def cache_dir_for(name: str, settings: dict[str, Any], cache_dir: str | os.PathLike | None = None) -> Path:
    root = Path(cache_dir) if cache_dir is not None else cache_root()
    return root / "prefs" / f"{name}-{cache_key(settings)}"


def load_cached(path: Path) -> tuple[list[dict], dict[str, Any]] | None:
    """``(pairs, metadata)`` of a built dataset at ``path``, or None when it is not there (complete)."""
    if not (path / META_FILE).is_file():
        return None
    try:
        meta = json.loads((path / META_FILE).read_text())
        with (path / PAIRS_FILE).open(encoding="utf-8") as f:
            pairs = [json.loads(line) for line in f if line.strip()]
        count = meta.pop("cached_pairs", None) if isinstance(meta, dict) else None
        if isinstance(count, int) and count != len(pairs):
            raise ValueError(f"{len(pairs)} pairs where {count} were built")
    except (OSError, ValueError) as e:  # a truncated or edited entry: rebuilt, and said so
        import sys

        print(f"grouprl: the cached preference pairs in {path} are damaged ({type(e).__name__}: {e}); rebuilding "
              f"them", file=sys.stderr, flush=True)
        aside = Path(tempfile.mkdtemp(prefix=f".damaged-{path.name}-", dir=path.parent))
        path.rename(aside / path.name)
        shutil.rmtree(aside, ignore_errors=True)
        return None
    return pairs, meta


def save_cached(path: Path, pairs: list[dict], meta: dict[str, Any]) -> Path:
    """Write ``pairs.jsonl`` and ``meta.json`` into ``path`` atomically (a temporary folder, then renamed)."""
    with building(path, META_FILE) as tmp:
        with (tmp / PAIRS_FILE).open("w", encoding="utf-8") as f:
            for pair in pairs:
                f.write(json.dumps(pair) + "\n")
        # written last: marks it complete; the count tells a truncated pairs.jsonl
        (tmp / META_FILE).write_text(json.dumps({**meta, "cached_pairs": len(pairs)}, indent=2) + "\n")
    return path
