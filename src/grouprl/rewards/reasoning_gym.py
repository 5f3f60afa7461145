"""``reasoning_gym``: score an answer with reasoning-gym's own ``score_answer`` (its per-task verifier).

reasoning-gym (github.com/open-thought/reasoning-gym; arXiv 2505.24760) generates procedural tasks, each with a
scorer that knows the task: ``dataset.score_answer(answer, entry) -> float`` in [0, 1], partial credit
included where the task defines it. That scorer reads the *answer*, not a whole completion, so this reward
extracts it first:

1. the last ``<answer>...</answer>`` block (reasoning-gym's ``extract_answer``, the format its system prompt
   asks for);
2. else the text after the last ``Answer:`` (the format of grouprl's built-in models), up to the line's end;
3. else no answer: 0.0 (the scorer is not shown raw text it would give partial credit to).

Rows from ``dataset: reasoning_gym:<name>`` (:mod:`grouprl.data.reasoning_gym`) carry a ``reasoning_gym``
column (JSON: the task name, its config, the entry's index) from which the entry -- question, answer and the
metadata its scorer needs -- is rebuilt exactly (reasoning-gym entries are a pure function of config and
index); a dataset object handed over in Python is kept in this process and used directly. A row without
the column gets ``None`` (no opinion).
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any

from grouprl.errors import ConfigError
from grouprl.registry import REWARDS

_LIVE: dict[str, Any] = {}  # key -> a reasoning-gym dataset object given in Python (see remember_dataset)
_ANSWER_LINE = re.compile(r"Answer:\s*(.*)")


def remember_dataset(key: str, dataset: Any) -> None:
    """Keep ``dataset`` (a reasoning-gym ProceduralDataset) for the rows whose column names ``key``."""
    _LIVE[key] = dataset


def _import() -> Any:
    try:
        import reasoning_gym
    except ImportError as e:
        raise ConfigError("reward 'reasoning_gym' needs the reasoning-gym package: pip install reasoning-gym") from e
    return reasoning_gym


@functools.lru_cache(maxsize=32)
def _dataset(name: str, config_json: str) -> Any:
    return _import().create_dataset(name, **json.loads(config_json))


def entry_for(ref: str | dict) -> tuple[Any, dict]:
    """``(dataset, entry)`` for a row's ``reasoning_gym`` column (JSON ``{"name", "config", "index"}`` or
    ``{"key", "index"}`` for a dataset object kept by :func:`remember_dataset`)."""
    info = json.loads(ref) if isinstance(ref, str) else dict(ref)
    key = info.get("key")
    if key is not None and key in _LIVE:
        dataset = _LIVE[key]
    elif "name" in info:
        dataset = _dataset(info["name"], json.dumps(info.get("config") or {}, sort_keys=True))
    else:
        raise ConfigError(f"reward 'reasoning_gym': the dataset object behind rows {key!r} is not in this process; "
                          f"use dataset: reasoning_gym:<name> so the rows can be rebuilt anywhere")
    return dataset, dataset[int(info["index"])]


def extract_answer(completion: str) -> str | None:
    """The answer of ``completion`` (see the module docstring), or None.

    >>> extract_answer("<think>2+2</think><answer> 4 </answer>"), extract_answer("so... Answer: 12\\nok")
    ('4', '12')
    """
    from reasoning_gym.utils import extract_answer as tagged

    found = tagged(completion)
    if found is not None:
        return found
    lines = _ANSWER_LINE.findall(completion)
    return lines[-1].strip() if lines and lines[-1].strip() else None


@REWARDS.register("reasoning_gym")
def reasoning_gym_reward(completion: str, *, answer=None, reasoning_gym: str | dict | None = None,
                         **meta) -> float | None:
    """The task's own score_answer on the extracted answer (0.0 without one, None off reasoning-gym rows).

    >>> import json
    >>> ref = json.dumps({"name": "basic_arithmetic", "config": {"size": 2, "seed": 1}, "index": 0})
    >>> reasoning_gym_reward("<answer>-4</answer>", reasoning_gym=ref), reasoning_gym_reward("-4", reasoning_gym=ref)
    (1.0, 0.0)
    """
    if reasoning_gym is None:
        return None
    dataset, entry = entry_for(reasoning_gym)
    extracted = extract_answer(completion)
    if extracted is None:
        return 0.0
    return float(dataset.score_answer(answer=extracted, entry=entry))
