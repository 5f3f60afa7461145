"""Checks that run before any model loads -- in ``GRPOTrainer`` and in ``grouprl train --dry-run`` alike.

Each one turns a mistake that would otherwise end in a traceback (often after minutes of loading) into one
line naming the value and the fix: an ``output_dir`` that cannot be written, a model folder that is not a
model (or is a run folder instead of its ``final/``), a mistyped local path that would be sent to the hub,
a misspelt ``dataset_kwargs`` key of a built-in task, data rows the loader cannot use, prompts longer than
the model's context, and a resume from a checkpoint of another architecture. This module imports no torch.
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import re
import tempfile
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from grouprl.errors import ConfigError, DataError, did_you_mean
from grouprl.models import check_model_folder  # re-exported

log = logging.getLogger("grouprl")
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")
"""Config keys that hold a model's context length, in the order they are read."""
SHAPE_KEYS = ("model_type", "architectures", "hidden_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "intermediate_size", "vocab_size")
"""config.json keys that must agree between a checkpoint and the model it is loaded into."""


def check_output_dir_writable(output_dir: str | os.PathLike) -> None:
    """``output_dir`` is a writable directory, or can be created (nothing is created here)."""
    path = Path(output_dir).expanduser()
    fix = "Fix: set output_dir=<a folder you can write>."
    if path.exists() and not path.is_dir():
        raise ConfigError(f"output_dir={str(output_dir)!r} is a file, not a folder. {fix}")
    probe = path
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if not probe.is_dir():
        raise ConfigError(f"output_dir={str(output_dir)!r} cannot be created: {str(probe)!r} is a file. {fix}")
    what = "is read-only" if probe == path else f"cannot be created: nothing can be written in {str(probe)!r}"
    if not os.access(probe, os.W_OK | os.X_OK):
        raise ConfigError(f"output_dir={str(output_dir)!r} {what}. {fix}")
    try:  # access() says yes to root everywhere: /proc, read-only mounts; one empty file tells the truth
        fd, name = tempfile.mkstemp(prefix=".grouprl-write-test-", dir=probe)
        os.close(fd)
        os.unlink(name)
    except OSError as e:
        raise ConfigError(f"output_dir={str(output_dir)!r} {what} ({e.strerror}). {fix}") from None


def check_dataset_kwargs(dataset: Any, kwargs: dict) -> None:
    """For ``builtin:<task>``, every ``dataset_kwargs`` key is a parameter of ``load_task`` or of the task's
    generator (a misspelt key would otherwise end in a TypeError deep in the generator)."""
    if not (isinstance(dataset, str) and dataset.startswith("builtin:")) or not kwargs:
        return
    from grouprl.data.tasks import get_task, load_task

    task = get_task(dataset.split(":", 1)[1])
    own = [p for p in inspect.signature(load_task).parameters if p not in ("task", "split", "task_kwargs")]
    gen = [p for p in inspect.signature(task.make).parameters if p != "rng"]
    for key in kwargs:
        if key not in own + gen:
            raise ConfigError(f"dataset_kwargs.{key} is not an option of {dataset}.{did_you_mean(str(key), own + gen)} "
                              f"Known: {', '.join(own + gen)}.")


def apply_task_defaults(cfg: Any, reward_funcs: Any = None) -> list[str]:
    """A built-in task (``dataset: builtin:<task>``) or a reasoning-gym task (``reasoning_gym:<name>``: the
    ``reasoning_gym`` reward) brings its own reward: when the user set neither
    ``reward_funcs`` (nor passed reward functions) nor ``eval_reward``, they become the task's (countdown
    trains on ``countdown``: ``accuracy`` would pay for repeating the target, which is in the prompt).
    Returns the names of the fields it filled."""
    if isinstance(cfg.dataset, str) and cfg.dataset.startswith("reasoning_gym:"):  # scored by the task's own verifier
        task = SimpleNamespace(reward_funcs=["reasoning_gym"], eval_reward="reasoning_gym")
    elif not (isinstance(cfg.dataset, str) and cfg.dataset.startswith("builtin:")):
        return []
    else:
        from grouprl.data.tasks import get_task

        task = get_task(cfg.dataset.split(":", 1)[1])
    filled = []
    if reward_funcs is None and "reward_funcs" not in cfg.explicit_fields and task.reward_funcs:
        cfg.reward_funcs, filled = list(task.reward_funcs), filled + ["reward_funcs"]
    if "eval_reward" not in cfg.explicit_fields and task.eval_reward:
        cfg.eval_reward, filled = task.eval_reward, filled + ["eval_reward"]
    return filled


def dataset_object(given: Any) -> Any:
    """``train_dataset=`` / ``eval_dataset=`` as the loader takes it: a pandas DataFrame or a dict of
    equal-length column lists becomes a ``datasets.Dataset`` (they were read as a file name before); any other
    value is returned as it is. Unequal columns are a ConfigError naming their lengths."""
    if type(given).__name__ == "DataFrame" and hasattr(given, "to_dict"):
        import datasets

        return datasets.Dataset.from_pandas(given, preserve_index=False)
    if isinstance(given, dict) and given and all(isinstance(v, (list, tuple)) for v in given.values()):
        lengths = {str(k): len(v) for k, v in given.items()}
        if len(set(lengths.values())) > 1:
            raise ConfigError(f"train_dataset as a dict of columns needs columns of one length; got {lengths}. "
                              f"Fix: one value per row in every column.")
        import datasets

        return datasets.Dataset.from_dict({k: list(v) for k, v in given.items()})
    return given


DATA_SUFFIXES = (".jsonl", ".json", ".csv", ".parquet", ".arrow", ".txt")


def check_dataset_path(dataset: Any) -> None:
    """A ``dataset`` that names a local file or folder (``./x.jsonl``, ``data/train.jsonl``) must exist: "no
    such file" now, not a hub lookup's "Repo id must use alphanumeric chars" later."""
    if not isinstance(dataset, str) or dataset.startswith("builtin:") or Path(dataset).expanduser().exists():
        return
    from grouprl.models import looks_like_path  # torch is loaded by then; run/ itself imports none

    if looks_like_path(dataset) or dataset.lower().endswith(DATA_SUFFIXES):
        raise ConfigError(f"dataset={dataset!r}: no such file or folder (looked in {str(Path.cwd())!r}). Fix: check "
                          f"the path; a hub dataset id looks like org/name, a built-in task like builtin:arithmetic.")


def check_config_once(cfg: Any, reward_funcs: Any = None) -> None:
    """The config checks of the one start-up path (``grouprl train`` and ``GRPOTrainer`` alike): registry
    names and their kwargs, ``reward_kwargs``, the sandbox isolation this machine can give. Each runs once:
    a second call with the same config and rewards does nothing (the CLI checks before it builds the trainer)."""
    from grouprl.sandbox.config import configure_for_run

    key = repr((cfg.to_dict(), reward_funcs))
    if cfg.__dict__.get("_checked") == key:
        return
    cfg.check_names()  # registry names and kwargs: fail before any model loads
    cfg.check_reward_kwargs(reward_funcs if reward_funcs is not None else cfg.reward_funcs)
    configure_for_run(cfg)  # an isolation level this machine cannot give fails here, not mid-run
    cfg.__dict__["_checked"] = key


def check_paths(cfg: Any) -> None:
    """The checks that need neither data nor a model: output_dir, dataset_kwargs, a resume folder. (The model
    folder is checked after the data, by ``grouprl.models.check_model_source``.)"""
    check_output_dir_writable(cfg.output_dir)
    check_dataset_path(cfg.dataset)
    if isinstance(cfg.model, str) and cfg.model.startswith("builtin:"):
        from grouprl.data.prefs import cache_root

        cache_root()  # where a built-in model is built: a file there is an error now, not a traceback later
    check_dataset_kwargs(cfg.dataset, cfg.dataset_kwargs)
    resume = cfg.resume_from_checkpoint
    if isinstance(resume, str) and ("/" in resume or resume.startswith("checkpoint-")):
        if not Path(resume).expanduser().is_dir():
            raise ConfigError(f"resume_from_checkpoint={resume!r}: no such folder. Fix: give a checkpoint-<step> "
                              f"folder, or true for the newest one in output_dir.")


def dry_run(cfg: Any, resume: Any = None) -> list[str]:
    """Every check ``grouprl train`` makes before loading weights, for ``--dry-run``: :func:`check_paths`, the
    reward functions (plug-ins are imported), local data (each line of a .jsonl file, every prompt row; a hub
    dataset is not downloaded), the model folder and, when the model is a local folder, a resume's
    architecture. Returns the notes a real run would print."""
    from grouprl.data.load import check_data_file, check_rows, load_dataset_any
    from grouprl.rewards import make_reward_func

    apply_task_defaults(cfg)
    check_paths(cfg)
    for item in [*cfg.reward_funcs, cfg.eval_reward]:  # plug-ins import here (as train.score resolves them)
        make_reward_func(item, **(dict(cfg.reward_kwargs.get(item, {})) if isinstance(item, str) else {}))
    notes = []
    local = isinstance(cfg.dataset, str) and (cfg.dataset.startswith("builtin:") or Path(cfg.dataset).exists())
    if local:  # a hub dataset is not downloaded by a dry run
        check_data_file(cfg.dataset)  # before importing datasets: a bad line is named in milliseconds
        import datasets

        datasets.disable_progress_bars()  # a dry run prints the recipe, or one line of error
        for split, limit in ((cfg.train_split, cfg.max_train_samples), (cfg.eval_split, cfg.max_eval_samples)):
            ds = None if split is None else load_dataset_any(cfg.dataset, split, **cfg.dataset_kwargs)
            if ds is None and split == cfg.train_split:
                raise ConfigError(f"dataset {cfg.dataset!r} has no training split {split!r}.")
            if ds is not None:
                check_rows(ds.select(range(min(limit or len(ds), len(ds)))), cfg.prompt_column)
            elif split == cfg.eval_split:
                notes.append(eval_split_note(cfg, False, None))
    if isinstance(cfg.model, str):
        check_model_folder(cfg.model)
    if isinstance(cfg.model, str) and (Path(cfg.model).expanduser() / "config.json").is_file():
        from grouprl.run.output_dir import resume_checkpoint

        check_resume_model(_read_config(Path(cfg.model).expanduser()) or {}, resume_checkpoint(cfg, resume))
    return [n for n in notes if n]


def eval_split_note(cfg: Any, eval_given: bool, eval_ds: Any) -> str | None:
    """The line said at start when evaluation was asked for (eval_split set) but there is no such split."""
    if eval_ds is not None or eval_given or cfg.eval_split is None or cfg.dataset is None:
        return None
    return (f"grouprl: no evaluation: dataset {cfg.dataset!r} has no {cfg.eval_split!r} split (a single file is "
            f"the training split only). Fix: give a folder with train and {cfg.eval_split} files, or set "
            f"eval_split=null to silence this.")


# ---- prompt lengths -----------------------------------------------------------------------------------
def context_length(config: Any) -> int | None:
    """The model's context length (max_position_embeddings or an equivalent key), or None if unknown."""
    for key in CONTEXT_KEYS:
        value = config.get(key) if isinstance(config, dict) else getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def model_context(source: Any) -> int | None:
    """Context length of a model object, a local folder, a hub id or ``builtin:<name>`` (reads only the
    config; None when it cannot be read cheaply)."""
    if not isinstance(source, str):
        return context_length(getattr(source, "config", None))
    from transformers import AutoConfig

    from grouprl.models import resolve_model_path

    try:
        return context_length(AutoConfig.from_pretrained(resolve_model_path(source)))
    except (OSError, ValueError):
        return None


def check_prompt_lengths(cfg: Any, tokenizer: Any, context: int | None, datasets: dict[str, Any],
                         agent: Any = None) -> int:
    """Check every prompt (as rendered) against max_prompt_length and the model's context; returns how many
    prompts will be cut from the left. ``truncation: error`` makes a too-long prompt an error; ``left`` warns
    once with the count. A prompt + completion that cannot fit the context is always an error.

    ``agent`` (``grouprl.train.agent.Agent``; tools or an environment): each first prompt is measured as the
    agent renders it (chat template with the tool schemas) and one above max_prompt_length is always an
    error, whatever ``truncation`` says: cutting it from the left would cut the system prompt and tool block."""
    cut, longest = 0, (0, "", -1)
    completion = max(cfg.max_new_tokens, cfg.eval_max_new_tokens or 0)
    for split, ds in datasets.items():
        if ds is None:
            continue
        lengths = _prompt_lengths(cfg, tokenizer, ds[cfg.prompt_column], agent)
        for i, n in enumerate(lengths):
            if n > longest[0]:
                longest = (n, split, i)
            if agent is not None and cfg.max_prompt_length is not None and n > cfg.max_prompt_length:
                raise DataError(f"{split} row {i}: the agent's first prompt (chat template with the tool schemas) "
                                f"is {n} tokens, above max_prompt_length={cfg.max_prompt_length}. A tool-using "
                                f"conversation is never cut from the left (that would cut the system prompt and "
                                f"the tool descriptions), whatever truncation says. Fix: raise max_prompt_length "
                                f"to at least {n}, or shorten the prompt, the system prompt or the tool "
                                f"descriptions (docstrings).")
            if cfg.max_prompt_length is not None and n > cfg.max_prompt_length:
                if cfg.truncation == "error":
                    raise DataError(f"{split} row {i}: the prompt is {n} tokens, above max_prompt_length="
                                    f"{cfg.max_prompt_length} (truncation=error). Fix: shorten it, raise "
                                    f"max_prompt_length, or set truncation=left to cut it from the left.")
                cut += 1
    kept = longest[0] if cfg.max_prompt_length is None else min(longest[0], cfg.max_prompt_length)
    if context is not None and kept + completion > context:
        n, split, i = longest
        room = context - completion
        where = f"the longest prompt ({split} row {i}) is {n} tokens"
        if cfg.max_prompt_length is not None:
            where = f"max_prompt_length={cfg.max_prompt_length} (the longest prompt, {split} row {i}, is {n} tokens)"
        raise ConfigError(f"{where}; with {completion} new tokens that is {kept + completion} positions, above the "
                          f"model's context of {context}. Fix: set max_prompt_length <= {room} (longer prompts are "
                          f"cut from the left) or lower max_new_tokens." if room > 0 else
                          f"{where}; max_new_tokens={completion} alone fills the model's context of {context}. "
                          f"Fix: lower max_new_tokens.")
    if cut:
        msg = (f"{cut} prompt(s) are longer than max_prompt_length={cfg.max_prompt_length} tokens and will be cut "
               f"from the left (the longest: {longest[0]} tokens, {longest[1]} row {longest[2]}). Set "
               f"truncation=error to stop instead, or raise max_prompt_length.")
        log.warning("grouprl: %s", msg)
        warnings.warn(msg, UserWarning, stacklevel=2)
    return cut


def _prompt_lengths(cfg: Any, tokenizer: Any, prompts: Any, agent: Any) -> list[int]:
    """Token counts of ``prompts`` as the run renders them (the agent's first prompt with its tools, if any)."""
    from grouprl.data.load import render_prompt

    if agent is not None:
        return agent.first_prompt_lengths(tokenizer, list(prompts), cfg.system_prompt)
    texts = [render_prompt(p, tokenizer, cfg.system_prompt, cfg.apply_chat_template) for p in prompts]
    return [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]


# ---- resume -------------------------------------------------------------------------------------------
def _read_config(folder: Path) -> dict | None:
    try:
        return json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return None


def check_resume_model(model_config: dict, checkpoint: Path | None) -> None:
    """A checkpoint's weights fit only the architecture and shapes they were saved from: compare the
    checkpoint's config.json with the model's before loading them."""
    if checkpoint is None:
        return
    saved = _read_config(Path(checkpoint))
    if saved is None:
        return
    for key in SHAPE_KEYS:
        if key in saved and key in model_config and saved[key] != model_config[key]:
            raise ConfigError(f"resuming from {str(checkpoint)!r}: its model has {key}={saved[key]!r} but the model "
                              f"given has {key}={model_config[key]!r}; a checkpoint resumes only the model it was "
                              f"saved from. Fix: set model= to the run's model, or start a fresh run.")


# ---- what a run used ----------------------------------------------------------------------------------
def describe_callable(fn: Any) -> str:
    """``module:qualname`` for an importable function, its name otherwise."""
    if isinstance(fn, str):
        return fn
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__
    module = getattr(fn, "__module__", None)
    return f"{module}:{name}" if module and module != "__main__" and "<" not in name else name


def recorded_config(cfg: Any, *, model: Any, train_dataset: Any, reward_funcs: Any) -> dict:
    """``cfg.to_dict()`` with what the run actually used in place of what the Python caller passed directly:
    the model's name_or_path, ``<python object: N rows>`` for data and the reward functions' import paths."""
    data = cfg.to_dict()
    if model is not None and not isinstance(model, str):
        data["model"] = getattr(getattr(model, "config", None), "_name_or_path", None) or type(model).__name__
    elif isinstance(model, str):
        data["model"] = model
    if train_dataset is not None and not isinstance(train_dataset, str):
        data["dataset"] = f"<python object: {len(train_dataset)} rows>"
    elif isinstance(train_dataset, str):
        data["dataset"] = train_dataset
    if reward_funcs is not None:
        funcs = reward_funcs if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
        data["reward_funcs"] = [describe_callable(f) for f in funcs]
    return data
