"""Datasets in, prompts out: Python rows, files, directories, hub names, built-in tasks and reasoning-gym.

A row has a ``prompt`` column -- plain text, or chat messages ``[{"role": ..., "content": ...}, ...]`` to
which the tokenizer's chat template is applied -- and any other columns (``answer``, ``tests``, ``tools``,
...), which are handed to the reward functions as keyword lists. A malformed row raises ``DataError``
naming the row and the column.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from grouprl.errors import DataError, did_you_mean

CHAT_ROLES = ("system", "user", "assistant", "tool")
"""The roles a prompt's chat messages may have (those the common chat templates render)."""
FILE_TYPES = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


def load_dataset_any(spec: Any, split: str = "train", **kwargs: Any):
    """Load ``spec`` as a ``datasets.Dataset``.

    ``spec`` is a Dataset (returned as is), a DatasetDict (its ``split``), an ``IterableDataset``, a list of
    dicts or any other iterable of rows (mappings; read once, at most :data:`MAX_ROWS`), a reasoning-gym
    dataset object, or a string: a .jsonl/.json/.parquet/.csv file, a directory (of such files, or saved with
    ``save_to_disk``; a file or sub-folder named after the split is used when present), ``builtin:<task>``,
    ``reasoning_gym:<name>`` (``kwargs`` are the reasoning-gym config keys, :mod:`grouprl.data.reasoning_gym`)
    or a hub name. Any other object is a DataError (never looked up on the hub). Returns ``None`` when the
    split does not exist for a file or directory other than the training split.
    """
    import datasets

    if isinstance(spec, datasets.Dataset):
        return spec
    if isinstance(spec, datasets.DatasetDict):
        if split not in spec:
            return None
        return spec[split]
    if not isinstance(spec, (str, Path)):
        return _from_python(spec)
    text = str(spec)
    if text.startswith("builtin:"):
        from grouprl.data.prefs import BUILTIN_PREFS, builtin_prefs_split
        from grouprl.data.tasks import load_task

        if text.split(":", 1)[1] in BUILTIN_PREFS:  # preference pairs: held out = the task's prompts
            return builtin_prefs_split(text.split(":", 1)[1], split, **kwargs)
        return load_task(text.split(":", 1)[1], split, **kwargs)
    if text.startswith("reasoning_gym:"):
        from grouprl.data.reasoning_gym import load_reasoning_gym

        return load_reasoning_gym(text.split(":", 1)[1], split, **kwargs)
    path = Path(text)
    if path.is_file():
        return _load_file(path) if split == "train" else None
    if path.is_dir():
        return _load_dir(path, split)
    try:
        return datasets.load_dataset(text, split=split, **kwargs)
    except ValueError as e:  # unknown split of an existing dataset
        if "split" in str(e).lower() and split != "train":
            return None
        raise DataError(f"dataset {text!r}: {e}") from e
    except Exception as e:
        raise DataError(
            f"dataset {text!r} is not a file, a directory, or a reachable hub dataset ({type(e).__name__}: {e}). "
            f"Give a .jsonl/.json/.parquet/.csv path, a directory, or builtin:<task>."
        ) from e


MAX_ROWS = 1_000_000
"""Rows read from a Python iterable (an endless generator is an error, not a hang)."""


def _from_python(spec: Any):
    """A Dataset from rows given as Python objects: a reasoning-gym dataset, or an iterable of mappings."""
    import datasets

    if type(spec).__module__.startswith("reasoning_gym"):
        from grouprl.data.reasoning_gym import from_reasoning_gym

        return from_reasoning_gym(spec)
    if isinstance(spec, (bytes, dict)) or not hasattr(spec, "__iter__"):
        raise DataError(f"dataset: got a {type(spec).__name__} object, which is not a dataset. Give a list of "
                        f"dicts (one per row), a datasets.Dataset, an iterable of rows, a reasoning-gym dataset, or "
                        f"a string naming a file, a folder, builtin:<task>, reasoning_gym:<name> or a hub dataset.")
    rows = []
    for i, row in enumerate(spec):
        if i >= MAX_ROWS:
            raise DataError(f"dataset: the iterable gave more than {MAX_ROWS:,} rows (an endless stream?). Take "
                            f"the rows you want first, e.g. itertools.islice(rows, 10_000).")
        if not isinstance(row, Mapping):
            raise DataError(f"dataset: row {i} is a {type(row).__name__} ({_short(row)}), not a mapping; each row "
                            f"must be a dict of columns such as {{'prompt': ..., 'answer': ...}}.")
        rows.append(dict(row))
    if not rows:
        raise DataError(f"dataset: the {type(spec).__name__} given has no rows.")
    return datasets.Dataset.from_list(rows)


def with_chat_template_kwargs(tokenizer: Any, template_kwargs: Mapping[str, Any] | None) -> Any:
    """``tokenizer`` whose ``apply_chat_template`` always passes ``template_kwargs`` (TRL's
    ``chat_template_kwargs``, e.g. ``{"enable_thinking": False}``); a call's own keywords win. A shallow copy:
    the given tokenizer is left as it was."""
    if not template_kwargs:
        return tokenizer
    import copy

    out, render, fixed = copy.copy(tokenizer), tokenizer.apply_chat_template, dict(template_kwargs)

    def apply_chat_template(conversation: Any, *args: Any, **kwargs: Any) -> Any:
        return render(conversation, *args, **{**fixed, **kwargs})

    out.apply_chat_template = apply_chat_template
    return out


def _load_file(path: Path):
    import datasets

    kind = FILE_TYPES.get(path.suffix.lower())
    if kind is None:
        raise DataError(f"dataset file {str(path)!r}: unsupported type {path.suffix!r}; use one of "
                        f"{', '.join(FILE_TYPES)}.")
    if path.suffix.lower() == ".jsonl":  # one linear scan: a bad line is named, not reported by pyarrow later
        check_data_file(str(path))
    try:
        if kind == "csv":  # cells stay text: an answer "007" or "1e3" must reach the reward unchanged
            import pandas as pd

            frame = pd.read_csv(path, dtype=str, keep_default_na=False)
            return datasets.Dataset.from_pandas(frame, preserve_index=False)
        return datasets.load_dataset(kind, data_files=str(path), split="train")
    except Exception as e:
        where = _bad_jsonl_line(path) if path.suffix.lower() == ".jsonl" else None
        if where:
            raise DataError(f"dataset file {str(path)!r}: {where}. Each line must be one JSON object.") from e
        raise DataError(f"dataset file {str(path)!r} could not be read as {kind}: {e}") from e


def check_data_file(spec: Any) -> None:
    """A local .jsonl file whose lines are all UTF-8 JSON objects (checked by a cheap scan; the loader's own
    error for a bad line names neither the line nor the cause)."""
    path = Path(str(spec))
    if isinstance(spec, str) and path.is_file() and path.suffix.lower() == ".jsonl":
        where = _bad_jsonl_line(path)
        if where:
            raise DataError(f"dataset file {str(path)!r}: {where}. Each line must be one JSON object.")


def _bad_jsonl_line(path: Path) -> str | None:
    """'line N: <problem>' for the first line of a .jsonl file that is not a JSON object (None if all are)."""
    import json

    row = -1
    with path.open("rb") as f:
        for n, raw in enumerate(f, start=1):
            try:
                text = raw.decode("utf-8").strip()
            except UnicodeDecodeError as e:
                return (f"line {n} is not UTF-8 (byte 0x{raw[e.start]:02x} at column {e.start + 1}). Fix: save the "
                        f"file as UTF-8 (e.g. iconv -f latin1 -t utf-8)")
            if not text:
                continue
            row += 1
            try:
                value = json.loads(text)
            except json.JSONDecodeError as e:
                return f"line {n} (row {row}) is not valid JSON ({e.msg} at column {e.colno}): {_short(text)}"
            if not isinstance(value, dict):
                return f"line {n} (row {row}) is a {type(value).__name__}, not an object: {_short(text)}"
    return None


def _load_dir(path: Path, split: str):
    import datasets

    if (path / "dataset_info.json").exists() or (path / "dataset_dict.json").exists():
        loaded = datasets.load_from_disk(str(path))
        if isinstance(loaded, datasets.DatasetDict):
            return loaded[split] if split in loaded else None
        return loaded if split == "train" else None
    if (path / split).is_dir():
        return _load_dir(path / split, "train")
    for suffix in FILE_TYPES:
        candidate = path / f"{split}{suffix}"
        if candidate.is_file():
            return _load_file(candidate)
    if split != "train":
        return None
    files = sorted(p for p in path.iterdir() if p.suffix.lower() in FILE_TYPES)
    if not files:
        raise DataError(f"dataset directory {str(path)!r} holds no {', '.join(FILE_TYPES)} files.")
    parts = [_load_file(p) for p in files]
    return datasets.concatenate_datasets(parts) if len(parts) > 1 else parts[0]


def check_rows(ds: Any, prompt_column: str = "prompt") -> None:
    """Raise DataError naming the first row and column that cannot be used as a prompt."""
    if prompt_column not in ds.column_names:
        raise DataError(
            f"dataset has no column {prompt_column!r} (columns: {', '.join(ds.column_names)}). "
            f"Rename the prompt column or set prompt_column."
        )
    for i, prompt in enumerate(ds[prompt_column]):
        problem = _prompt_problem(prompt)
        if problem:
            raise DataError(f"row {i}, column {prompt_column!r}: {problem} (value: {_short(prompt)}).")


def _prompt_problem(prompt: Any) -> str:
    if isinstance(prompt, str):
        return "" if prompt.strip() else "empty prompt"
    if isinstance(prompt, list):
        if not prompt:
            return "empty message list"
        for j, msg in enumerate(prompt):
            if not isinstance(msg, dict) or "role" not in msg or "content" not in msg:
                return f"message {j} must be a mapping with 'role' and 'content'"
            if not isinstance(msg["content"], str):
                return f"message {j} has non-text content"
            if msg["role"] not in CHAT_ROLES:
                return (f"message {j} has the unknown role {msg['role']!r}; chat templates know "
                        f"{', '.join(CHAT_ROLES)}.{did_you_mean(str(msg['role']), CHAT_ROLES)}")
        return ""
    return f"expected text or a list of chat messages, got {type(prompt).__name__}"


def _short(value: Any, n: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= n else text[: n - 3] + "..."


def render_prompt(prompt: Any, tokenizer: Any, system_prompt: str | None = None, chat_template: str = "auto") -> str:
    """The text the model sees (the ``apply_chat_template`` config field is ``chat_template``).

    ``auto``: chat messages, and plain text when ``system_prompt`` is set, go through the tokenizer's chat
    template with a generation prompt; plain text without a system prompt is fed as written. ``always``:
    plain text too (as one user message). ``never``: no template. Without a template (or with ``never``) the
    message contents are joined by new lines.

    >>> render_prompt("2+2=", None), render_prompt("2+2=", None, "Be brief.")
    ('2+2=', 'Be brief.\\n2+2=\\n')
    """
    if isinstance(prompt, str) and not system_prompt and chat_template != "always":
        return prompt
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    if system_prompt and messages[0].get("role") != "system":
        messages = [{"role": "system", "content": system_prompt}] + messages
    if chat_template != "never" and getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    if chat_template == "always":
        raise DataError("apply_chat_template=always but the tokenizer has no chat template. Fix: set "
                        "apply_chat_template=auto (or never), or use a tokenizer with a chat template.")
    return "\n".join(m["content"] for m in messages) + "\n"


def reward_columns(rows: list[dict], prompt_column: str = "prompt") -> dict[str, list]:
    """Every column except the prompt, as ``name -> list`` (the keyword arguments of reward functions)."""
    if not rows:
        return {}
    return {k: [r.get(k) for r in rows] for k in rows[0] if k != prompt_column}
