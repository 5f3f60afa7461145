"""reasoning-gym tasks as datasets: ``dataset: reasoning_gym:<name>`` with the task's config keys.

reasoning-gym (arXiv 2505.24760) generates each task procedurally from a config dataclass (``size``, ``seed``
and the task's own difficulty keys, e.g. ``basic_arithmetic``'s ``min_terms`` / ``max_digits``).
``dataset_kwargs`` are those keys, checked against the config before anything is generated. Each entry
becomes a row:

- ``prompt``: the entry's ``question``;
- ``answer``: its reference ``answer`` (so answer-reading rewards work too);
- ``reasoning_gym``: JSON ``{"name", "config", "index"}`` from which the ``reasoning_gym`` reward
  (:mod:`grouprl.rewards.reasoning_gym`) rebuilds the entry and calls the task's own ``score_answer``.

Splits: ``train`` is the config as given. Any other split (the held-out one, e.g. ``test``) is the same config
with ``seed + size`` and ``size = eval_size`` (default 200, a grouprl key): reasoning-gym draws entry ``i``
from ``Random(seed + i)``, so these are the entries right after the training ones (``seed + 1`` would repeat
all but one of them). Every question that also occurs in the training split is removed -- a small task
space repeats problems across draws.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from grouprl.errors import DataError, did_you_mean

EVAL_SIZE = 200


def _module() -> Any:
    try:
        import reasoning_gym
    except ImportError as e:
        raise DataError("dataset reasoning_gym:<name> needs the reasoning-gym package: pip install reasoning-gym") from e
    return reasoning_gym


def config_class(name: str) -> type:
    """The config dataclass of task ``name``; DataError with the known names (and a "did you mean")."""
    from reasoning_gym.factory import DATASETS

    _module()
    if name not in DATASETS:
        raise DataError(f"reasoning_gym:{name} is not a reasoning-gym task.{did_you_mean(name, sorted(DATASETS))} "
                        f"Known: {', '.join(sorted(DATASETS))}.")
    return DATASETS[name][1]


def check_config(name: str, config: dict) -> None:
    """DataError for a key the task's config does not have (it would be a TypeError deep in reasoning-gym)."""
    known = [f.name for f in dataclasses.fields(config_class(name))]
    for key in config:
        if key not in known:
            raise DataError(f"dataset_kwargs.{key} is not a config key of reasoning_gym:{name}."
                            f"{did_you_mean(str(key), known)} Known: {', '.join(known)}, and eval_size.")


def load_reasoning_gym(name: str, split: str = "train", **kwargs: Any):
    """A ``datasets.Dataset`` of task ``name`` (see the module docstring for the split rule)."""
    eval_size = int(kwargs.pop("eval_size", EVAL_SIZE))
    check_config(name, kwargs)
    rg = _module()
    try:
        train = rg.create_dataset(name, **kwargs)
    except Exception as e:  # the config's own validation (e.g. min > max)
        raise DataError(f"reasoning_gym:{name} with {kwargs}: {type(e).__name__}: {e}") from e
    if split == "train":
        return _rows(train, {"name": name, "config": kwargs})
    seed = kwargs.get("seed", train.config.seed)
    held = {**kwargs, "seed": (seed if seed is not None else 0) + len(train), "size": eval_size}
    seen = {entry["question"] for entry in train}
    return _rows(rg.create_dataset(name, **held), {"name": name, "config": held}, skip=seen)


def from_reasoning_gym(dataset: Any):
    """Rows of a reasoning-gym dataset object given in Python (``GRPOTrainer(train_dataset=rg.create_dataset(...))``);
    the object is kept in this process for the reward (:func:`grouprl.rewards.reasoning_gym.remember_dataset`)."""
    from grouprl.rewards.reasoning_gym import remember_dataset

    if not (hasattr(dataset, "score_answer") and hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")):
        raise DataError(f"dataset: a {type(dataset).__name__} from reasoning_gym is not a task dataset (it has no "
                        f"score_answer / indexing); give reasoning_gym.create_dataset(name, ...) or "
                        f"dataset: reasoning_gym:<name>.")
    key = f"{type(dataset).__qualname__}@{id(dataset):x}"
    remember_dataset(key, dataset)
    return _rows(dataset, {"key": key})


def _rows(dataset: Any, ref: dict, skip: set | None = None):
    import datasets

    rows = []
    for index in range(len(dataset)):
        entry = dataset[index]
        if skip and entry["question"] in skip:
            continue
        rows.append({"prompt": entry["question"], "answer": str(entry["answer"]),
                     "reasoning_gym": json.dumps({**ref, "index": index}, sort_keys=True)})
    if not rows:
        raise DataError(f"reasoning-gym dataset {ref.get('name', ref.get('key'))!r} has no rows left (every "
                        f"held-out question also occurs in training: raise size or widen the task's config).")
    return datasets.Dataset.from_list(rows)
