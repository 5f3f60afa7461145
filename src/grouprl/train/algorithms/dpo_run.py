"""``algorithm: dpo`` from a config to a trained model: start-up checks, data, model, pairs, the loop
(:func:`grouprl.train.algorithms.dpo.train_dpo`), the final model and a summary -- what ``grouprl train`` runs.

Order, as for GRPO runs: the output folder is locked and checked, the pairs of a dataset on disk are checked
row by row, the model folder and prompt lengths are checked, and only then do the weights load. The pairs of
``builtin:arithmetic_prefs`` need the model's own samples, so they are built (or read from the cache) after
it loads (:mod:`grouprl.train.algorithms.dpo_prefs`). On N processes (``accelerate launch``) rank 0 alone holds the lock,
decides resume / fresh, writes the run's files and builds ``builtin:arithmetic_prefs`` (the other ranks
receive the pairs); every rank trains on its share of each global batch (:mod:`grouprl.train.algorithms.dpo`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from grouprl.data.prefs import check_pref_rows
from grouprl.errors import DataError
from grouprl.train.algorithms.base import Algorithm, register_algorithm
from grouprl.train.algorithms.dpo import train_dpo


def run_dpo(cfg: Any, resume: Any = None) -> dict[str, Any]:
    """``grouprl train`` with ``algorithm: dpo``: check the pairs (before any model loads, for a dataset on
    disk), load the model, build ``builtin:arithmetic_prefs`` if named, train, save ``<output_dir>/final``."""
    from contextlib import nullcontext

    from grouprl.run.lock import run_lock
    from grouprl.run.output_dir import check_run_folder
    from grouprl.train.parallel import ranks as dist

    ranks = dist.current()
    with run_lock(cfg.output_dir) if ranks.is_main else nullcontext():  # from before the model loads to the end
        check_dpo_paths(cfg)
        resume, _ = ranks.on_main(check_run_folder, cfg, resume)  # resume or fresh, an earlier run's files, config changes
        return _run_locked(cfg, resume)


def check_dpo_paths(cfg: Any) -> None:
    """The checks of ``grouprl.run.checks.check_paths`` for a DPO run: output_dir writable, dataset_kwargs
    (for builtin:arithmetic_prefs: the builder's keys and the arithmetic task's own)."""
    from grouprl.data.prefs import BUILD_KEYS, is_builtin_prefs, split_kwargs
    from grouprl.errors import ConfigError, did_you_mean
    from grouprl.run import checks as startup

    if cfg.model is None or cfg.dataset is None:
        raise DataError("algorithm: dpo needs `model` and `dataset` (preference pairs with prompt, chosen and "
                        "rejected columns, or builtin:arithmetic_prefs).")
    startup.check_output_dir_writable(cfg.output_dir)
    if is_builtin_prefs(cfg.dataset):
        for key, value in split_kwargs(cfg.dataset_kwargs)[1].items():
            try:
                startup.check_dataset_kwargs("builtin:arithmetic", {key: value})
            except ConfigError as e:
                raise ConfigError(f"{e} builtin:arithmetic_prefs adds {', '.join(BUILD_KEYS)}."
                                  f"{did_you_mean(str(key), BUILD_KEYS)}") from e
    else:
        startup.check_dataset_kwargs(cfg.dataset, cfg.dataset_kwargs)


def load_pairs(cfg: Any) -> tuple[Any, Any]:
    """(training pairs, held-out rows) of a dataset on disk or the hub, checked row by row (no model needed);
    ``(None, held-out rows)`` for builtin:arithmetic_prefs, whose pairs need the model's samples."""
    from grouprl.data.load import load_dataset_any
    from grouprl.data.prefs import is_builtin_prefs

    rows = None
    if not is_builtin_prefs(cfg.dataset):
        rows = load_dataset_any(cfg.dataset, cfg.train_split, **cfg.dataset_kwargs)
        if rows is None:
            raise DataError(f"dataset {cfg.dataset!r} has no training split {cfg.train_split!r}.")
        if cfg.max_train_samples is not None:
            rows = rows.select(range(min(cfg.max_train_samples, len(rows))))
        check_pref_rows(rows, where=f"dataset {cfg.dataset!r}")
    evals = load_dataset_any(cfg.dataset, cfg.eval_split, **cfg.dataset_kwargs) if cfg.eval_split else None
    if evals is not None and cfg.max_eval_samples is not None:
        evals = evals.select(range(min(cfg.max_eval_samples, len(evals))))
    return rows, evals


def dry_run_dpo(cfg: Any, resume: Any = None) -> list[str]:
    """``grouprl train --dry-run`` for ``algorithm: dpo``: every check made before the model loads (the
    output folder and ``resume`` are checked by the caller, ``grouprl.run.output_dir.check_run_folder``)."""
    from grouprl.run import checks as startup
    from grouprl.train.score import resolve_reward_funcs

    check_dpo_paths(cfg)
    resolve_reward_funcs(list(cfg.reward_funcs) + [cfg.eval_reward], cfg.reward_kwargs)
    _, evals = load_pairs(cfg)
    if isinstance(cfg.model, str):
        startup.check_model_folder(cfg.model)
    return [n for n in [startup.eval_split_note(cfg, False, evals)] if n]


def _run_locked(cfg: Any, resume: Any) -> dict[str, Any]:
    import json

    import transformers

    from grouprl.data.prefs import is_builtin_prefs
    from grouprl.models import check_model_source, load_model, load_tokenizer, pick_device, resolve_model_path
    from grouprl.run import checks as startup
    from grouprl.run import reporting
    from grouprl.run.output_dir import start_run
    from grouprl.train.checkpoint import save_final_atomic
    from grouprl.train.engine.model import apply_peft, apply_torch_threads
    from grouprl.train.parallel import ranks as dist
    from grouprl.train.score import resolve_reward_funcs

    ranks = dist.current()
    builtin = is_builtin_prefs(cfg.dataset)
    rows, evals = load_pairs(cfg)  # bad rows fail here, before the model loads
    note = startup.eval_split_note(cfg, False, evals)
    if note and ranks.is_main:
        print(note, flush=True)
    check_model_source(cfg.model)
    apply_torch_threads(cfg)
    folder = resolve_model_path(cfg.model)
    tokenizer = load_tokenizer(folder)
    startup.check_prompt_lengths(cfg, tokenizer, startup.model_context(folder),
                                 {"train": None if builtin else rows, "test": evals})
    transformers.set_seed(cfg.seed)
    model = apply_peft(load_model(cfg.model, ranks.device(pick_device(cfg.device))), cfg)
    meta = None
    if builtin:
        from grouprl.train.algorithms.dpo_prefs import arithmetic_prefs, eval_rows

        rows, meta = ranks.on_main(arithmetic_prefs, cfg, model, tokenizer)  # rank 0 samples; all get the pairs
        evals = eval_rows(cfg)
        if ranks.is_main:
            print(f"grouprl: {meta['num_pairs']} preference pairs from {meta['samples_drawn']} samples "
                  f"({meta['num_prompts']} prompts)", flush=True)
        transformers.set_seed(cfg.seed)  # a cached and a fresh build leave the same RNG for training
    resume = ranks.on_main(start_run, cfg, resume)  # clears a finished run's files (fresh run); writes config.yaml
    if ranks.is_main:  # which rewards, in which version (run_meta.json), as GRPO runs
        reporting.write_meta(cfg, list(cfg.reward_funcs))
    if meta is not None and ranks.is_main:
        (Path(cfg.output_dir) / "prefs_meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    if ranks.enabled and ranks.is_main:
        per, ga = cfg.per_device_train_batch_size, cfg.gradient_accumulation_steps
        print(f"grouprl: {ranks.world} processes; global batch {per * ga * ranks.world} preference pairs per "
              f"optimizer step = per_device_train_batch_size {per} x gradient_accumulation_steps {ga} x "
              f"{ranks.world} processes", flush=True)
    eval_fn = resolve_reward_funcs([cfg.eval_reward], cfg.reward_kwargs)[0] if evals is not None else None
    result = train_dpo(cfg, model, tokenizer, rows, evals, eval_fn, resume=resume)
    final = ranks.on_main(save_final_atomic, model, tokenizer, cfg.output_dir, result["global_step"])
    result["final_model"], result["prefs"] = str(final), meta
    if ranks.is_main:  # rank 0 writes the run's files: the final report, as GRPO runs
        result["report"] = str(reporting.refresh(cfg.output_dir, cfg.review_window) or "")
        _print_summary(result, cfg)
    return result


def _print_summary(result: dict[str, Any], cfg: Any) -> None:
    before, after = result["evals"].get("before", {}), result["evals"].get("after", {})
    fmt = lambda e: f"{e['accuracy']:.3f}" if e and e.get("accuracy") == e.get("accuracy") else "-"  # noqa: E731
    last = result["history"][-1] if result["history"] else {}
    lines = [f"grouprl: trained {result['global_step']} DPO steps ({cfg.dpo_loss}, beta {cfg.dpo_beta}) on "
             f"{result['num_pairs']} pairs"]
    if before or after:
        lines.append(f"held-out accuracy: before {fmt(before)}  ->  after {fmt(after)}  "
                     f"({after.get('num_prompts', before.get('num_prompts', 0))} prompts)")
    if last:
        lines.append(f"last step: loss {last['loss']:.4f}, rewards/accuracies {last['rewards/accuracies']:.3f}, "
                     f"rewards/margins {last['rewards/margins']:.3f}")
    lines += [f"final model:  {result['final_model']}", f"metrics:      {result['metrics_path']}"]
    if result.get("report"):
        lines.append(f"report:       {result['report']}  (open it in a browser)")
    print("\n".join(lines), flush=True)


register_algorithm("dpo", Algorithm(run=run_dpo, dry_run=dry_run_dpo))

__all__ = ["dry_run_dpo", "load_pairs", "run_dpo"]
