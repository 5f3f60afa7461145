"""Checkpoints that are never half-written, and exact resume.

Layout of ``<output_dir>/checkpoint-<step>/``:
  model files (``save_pretrained``: loads in transformers / vLLM unchanged; an adapter for LoRA runs),
  tokenizer files, ``trainer_state.pt`` (optimizer, scheduler, RNG states, data position, step, the training
  frontier -- the prompt ordinals ``0 .. frontier - 1`` training has consumed, ``data/stream.py`` -- and the
  unfinished generation round, if any) and ``trainer_state.json`` (the human-readable part).
A run sharded with FSDP (``grouprl.train.parallel.fsdp``) writes instead of the model files and the optimizer
state ``distcp/`` (torch.distributed.checkpoint: every rank's shards of the model and the optimizer,
loadable on any number of ranks, or one process) next to ``config.json``; ``trainer_state.pt`` keeps the rest.
A DeepSpeed ZeRO run (``grouprl.train.parallel.deepspeed``) writes ``deepspeed/`` instead (``engine.save_checkpoint``;
it resumes on the same number of ranks, ZeRO-2 also on another through DeepSpeed's universal checkpoint).
A checkpoint is written to ``.tmp-checkpoint-<step>``, flushed to disk (fsync) and renamed when complete;
``final/`` likewise (:func:`save_final_atomic`), so a kill never leaves a folder that looks finished.
The state also records the byte lengths of ``metrics.jsonl`` / ``samples.jsonl`` at the save
(``log_bytes``): a resumed run cuts the logs back to exactly what the checkpoint covers
(:func:`truncate_logs`), so nothing logged after the save (e.g. the final evaluation) is logged twice.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from grouprl.errors import ConfigError, SaveError
from grouprl.train.checkpoint import unpickle
from grouprl.train.checkpoint.layout import PATTERN, rng_state, set_rng_state, tmp_checkpoint, to_device


def list_checkpoints(output_dir: str | Path) -> list[Path]:
    root = Path(output_dir)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := PATTERN.match(p.name))]
    return [p for _, p in sorted(found)]


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    found = list_checkpoints(output_dir)
    return found[-1] if found else None


def save_checkpoint(output_dir: str | Path, step: int, model: Any, tokenizer: Any, optimizer: Any,
                    scheduler: Any, state: dict[str, Any], *, total_limit: int | None = None,
                    sharded: bool = False) -> Path:
    """Write checkpoint-<step> atomically; ``state`` holds data position, round buffer, metrics history.
    ``sharded``: every rank has already written the model and optimizer shards into
    ``tmp_checkpoint(...)/distcp`` (``Ranks.sharding.save_shards``); only the config is added here."""
    root = Path(output_dir)
    root.mkdir(parents=True, exist_ok=True)
    tmp = tmp_checkpoint(root, step)
    if tmp.exists() and not sharded:
        shutil.rmtree(tmp)
    try:
        _write_checkpoint(tmp, step, model, tokenizer, optimizer, scheduler, state, sharded)
    except (OSError, RuntimeError) as e:  # a full disk shows as OSError, or as torch.save's RuntimeError
        if not _is_write_error(e):
            raise
        raise save_failed(e, f"checkpoint-{step}", tmp, root) from e
    final = root / f"checkpoint-{step}"
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    fsync_tree(root, files=False)
    if total_limit:
        for old in list_checkpoints(root)[:-total_limit]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def _is_write_error(e: BaseException) -> bool:
    """An OSError, or torch.save's RuntimeError for a failed write ("... file write failed")."""
    return isinstance(e, OSError) or "writ" in str(e).lower()


def save_failed(error: BaseException, what: str, tmp: Path, root: Path) -> SaveError:
    """Remove the half-written ``tmp`` and say what is kept: the newest complete checkpoint and ``final/``
    (neither is touched before the new copy is whole)."""
    shutil.rmtree(tmp, ignore_errors=True)
    kept = [p.name for p in list_checkpoints(root)[-1:]] + (["final/"] if (root / "final").is_dir() else [])
    why = f"{error.strerror} ({error.filename})" if isinstance(error, OSError) and error.strerror else str(error)
    full = getattr(error, "errno", None) in (errno.ENOSPC, errno.EDQUOT) or "space" in why.lower() or "write" in why
    fix = "free disk space (or set output_dir elsewhere)" if full else "check that output_dir is writable"
    return SaveError(f"could not save {what} in {str(root)!r}: {why}. Nothing complete was lost: "
                     f"{', '.join(kept) or 'no earlier checkpoint'} {'is' if len(kept) < 2 else 'are'} intact and the "
                     f"partial copy was removed. Fix: {fix}, then rerun with --resume.")


def _write_checkpoint(tmp: Path, step: int, model: Any, tokenizer: Any, optimizer: Any, scheduler: Any,
                      state: dict[str, Any], sharded: bool) -> None:
    if sharded:
        model.config.save_pretrained(tmp)
    else:
        model.save_pretrained(tmp)
    if tokenizer is not None:
        tokenizer.save_pretrained(tmp)
    optim = {} if sharded else {"optimizer": optimizer.state_dict()}
    torch.save({**optim, "scheduler": scheduler.state_dict(), "rng": rng_state(), "step": step, **state},
               tmp / "trainer_state.pt")
    summary = {"step": step, "data": state.get("data"), "frontier": state.get("frontier"), "history": state.get("history", []),
               "log_bytes": state.get("log_bytes"), "config": state.get("config")}
    (tmp / "trainer_state.json").write_text(json.dumps(summary, indent=1, default=str))
    fsync_tree(tmp)


def fsync_tree(path: Path, *, files: bool = True) -> None:
    """Flush ``path``'s files (``files``) and the directory entry itself to disk before a rename relies on them."""
    if files:
        for f in path.rglob("*"):
            if f.is_file():
                fd = os.open(f, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms that cannot open a directory
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def save_final_atomic(model: Any, tokenizer: Any, output_dir: str | Path, step: int,
                      state_dict: dict | None = None) -> Path:
    """Write ``<output_dir>/final`` as a whole or not at all: into ``.tmp-final``, fsync, mark it complete
    (``final/.complete`` holds the step), then rename over any earlier ``final/``. ``state_dict``: the
    gathered full weights of a sharded model (``Ranks.sharding.full_state_dict``)."""
    from grouprl.run.output_dir import COMPLETE
    from grouprl.train.engine.model import save_final

    root = Path(output_dir)
    tmp, final, old = root / ".tmp-final", root / "final", root / ".old-final"
    for leftover in (tmp, old):
        if leftover.exists():
            shutil.rmtree(leftover)
    try:
        save_final(model, tokenizer, tmp, state_dict=state_dict)
        (tmp / COMPLETE).write_text(f"{step}\n")
        fsync_tree(tmp)
    except (OSError, RuntimeError) as e:  # a full disk: the earlier final/ (if any) stays as it was
        if not _is_write_error(e):
            raise
        raise save_failed(e, "final/", tmp, root) from e
    if final.exists():
        final.rename(old)
    tmp.rename(final)
    fsync_tree(root, files=False)
    shutil.rmtree(old, ignore_errors=True)
    return final


def log_sizes(output_dir: str | Path) -> dict[str, int]:
    """Byte length of each JSONL log now (the logger flushes after every write)."""
    root = Path(output_dir)
    return {name: (root / name).stat().st_size for name in ("metrics.jsonl", "samples.jsonl")
            if (root / name).is_file()}


def truncate_logs(output_dir: str | Path, checkpoint: Path, log_bytes: dict[str, int] | None) -> None:
    """Cut the logs in ``output_dir`` back to their length at the save of ``checkpoint`` (only for a checkpoint
    of this output_dir: one from another run says nothing about these files)."""
    root = Path(output_dir)
    if not log_bytes or checkpoint.resolve().parent != root.resolve():
        return
    for name, size in log_bytes.items():
        path = root / name
        if path.is_file() and path.stat().st_size > size:
            os.truncate(path, size)


def set_learning_rate(optimizer: Any, scheduler: Any, lr: float) -> float | None:
    """After a resume: a new ``learning_rate`` scales every param group's initial and base lr (and the
    scheduler's) by new/old, and the current lr is recomputed from this run's schedule at the restored step
    (so a new ``max_steps`` reshapes a decaying schedule from here on; unchanged, it is the saved value).
    Returns the old base lr when it changed, else None."""
    base = list(getattr(scheduler, "base_lrs", [])) or [g.get("initial_lr", g["lr"]) for g in optimizer.param_groups]
    old = base[0]
    changed = bool(old) and abs(old - lr) > 1e-12 * max(abs(old), abs(lr))
    ratio = lr / old if changed else 1.0
    for g in optimizer.param_groups:
        g["lr"] *= ratio
        if "initial_lr" in g:
            g["initial_lr"] *= ratio
    if hasattr(scheduler, "base_lrs"):
        scheduler.base_lrs = [b * ratio for b in scheduler.base_lrs]
    lambdas = getattr(scheduler, "lr_lambdas", None)
    if lambdas:  # the schedule of this run (a new max_steps changes its length): lr at the restored step
        for g, b, fn in zip(optimizer.param_groups, scheduler.base_lrs, lambdas):
            g["lr"] = b * fn(scheduler.last_epoch)
    if hasattr(scheduler, "_last_lr"):
        scheduler._last_lr = [g["lr"] for g in optimizer.param_groups]
    return old if changed else None


def resolve_resume(resume: Any, output_dir: str | Path) -> Path | None:
    """``True`` / ``"latest"`` -> newest checkpoint in output_dir; a path -> that path; falsy -> None;
    ``"auto"`` -> the newest checkpoint of an unfinished run, else None (``output_dir.decide_resume``)."""
    if resume == "auto":
        from grouprl.run.output_dir import decide_resume

        resume = decide_resume(SimpleNamespace(output_dir=output_dir, overwrite_output_dir=True), "auto")[0]
    if resume in (None, False, "", "false"):
        return None
    if resume is True or resume in ("true", "latest"):
        found = latest_checkpoint(output_dir)
        if found is None:
            raise ConfigError(f"resume requested but {str(output_dir)!r} holds no checkpoint-<step> directory. "
                              f"Fix: run without --resume, or point resume_from_checkpoint at a checkpoint.")
        return found
    path = Path(resume)
    if not (path / "trainer_state.pt").is_file():
        raise ConfigError(f"resume_from_checkpoint={str(resume)!r} is not a grouprl checkpoint "
                          f"(no trainer_state.pt inside).")
    return path


def load_checkpoint(path: Path, model: Any, optimizer: Any, scheduler: Any) -> dict[str, Any]:
    """Restore weights, optimizer, scheduler and RNG from ``path``; returns the rest of the saved state.

    The unfinished round (its micro-batches' tensors) is moved onto the model's device: it is read onto
    the CPU, and the next forward would otherwise mix devices.
    """
    state = torch.load(path / "trainer_state.pt", map_location="cpu", weights_only=False, pickle_module=unpickle)
    if (path / "distcp").is_dir():  # an FSDP checkpoint: loads into FSDP on any number of ranks, or one process
        from grouprl.train.parallel.fsdp import load_shards

        load_shards(path / "distcp", model, optimizer)
    elif (path / "deepspeed").is_dir() or _ranks().engine is not None:  # DeepSpeed ZeRO (train/parallel/deepspeed.py)
        _ranks().sharding.load_zero(path / "deepspeed")
    else:
        _load_plain(path, model, optimizer, state.pop("optimizer"))
    state.pop("optimizer", None)
    scheduler.load_state_dict(state.pop("scheduler"))
    set_rng_state(state.pop("rng"))
    if state.get("round") is not None:
        state["round"] = to_device(state["round"], next(model.parameters()).device)
    return state


def _ranks() -> Any:
    from grouprl.train.parallel import ranks as dist

    return dist.current()


def _load_plain(path: Path, model: Any, optimizer: Any, optimizer_state: dict) -> None:
    from grouprl.train.parallel.fsdp import is_sharded, load_full

    if is_sharded(model):  # saved without FSDP, resumed with it: every rank takes its shard of the full state
        load_full(model, optimizer, _read_weights(path), optimizer_state)
        return
    _load_weights(path, model)
    optimizer.load_state_dict(optimizer_state)


def _read_weights(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted(path.glob("model*.safetensors"))
    if not files:
        raise ConfigError(f"checkpoint {str(path)!r} has no model*.safetensors files.")
    weights: dict[str, torch.Tensor] = {}
    for f in files:
        weights.update(load_file(str(f)))
    return weights


def _load_weights(path: Path, model: Any) -> None:
    from grouprl.train.engine.model import is_peft

    if is_peft(model):
        from peft import set_peft_model_state_dict
        from peft.utils import load_peft_weights

        set_peft_model_state_dict(model, load_peft_weights(str(path), device="cpu"))
        return
    weights = _read_weights(path)
    missing, unexpected = model.load_state_dict(weights, strict=False)
    tied = {k for k in missing if "lm_head" in k}
    if set(missing) - tied or unexpected:
        raise ConfigError(f"checkpoint {str(path)!r} does not match the model: missing {sorted(missing)[:5]}, "
                          f"unexpected {sorted(unexpected)[:5]}.")
    if tied and hasattr(model, "tie_weights"):
        model.tie_weights()
