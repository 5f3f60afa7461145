"""Checkpoints that are never half-written, and exact resume.

Layout of ``<output_dir>/checkpoint-<step>/``:
  model files (``save_pretrained``: loads in transformers / vLLM unchanged; an adapter for LoRA runs),
  tokenizer files, ``trainer_state.pt`` (optimizer, scheduler, RNG states, data position, step, and the
  unfinished generation round, if any) and ``trainer_state.json`` (the human-readable part).
A checkpoint is written to ``.tmp-checkpoint-<step>`` and renamed when complete.
"""

from __future__ import annotations

import dataclasses
import json
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from grouprl.errors import ConfigError

PATTERN = re.compile(r"^checkpoint-(\d+)$")


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


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
                    scheduler: Any, state: dict[str, Any], *, total_limit: int | None = None) -> Path:
    """Write checkpoint-<step> atomically; ``state`` holds data position, round buffer, metrics history."""
    root = Path(output_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"checkpoint-{step}"
    tmp = root / f".tmp-checkpoint-{step}"
    if tmp.exists():
        shutil.rmtree(tmp)
    model.save_pretrained(tmp)
    if tokenizer is not None:
        tokenizer.save_pretrained(tmp)
    torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "rng": rng_state(),
                "step": step, **state}, tmp / "trainer_state.pt")
    summary = {"step": step, "data": state.get("data"), "history": state.get("history", [])}
    (tmp / "trainer_state.json").write_text(json.dumps(summary, indent=1, default=str))
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    if total_limit:
        for old in list_checkpoints(root)[:-total_limit]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def resolve_resume(resume: Any, output_dir: str | Path) -> Path | None:
    """``True`` / ``"latest"`` -> newest checkpoint in output_dir; a path -> that path; falsy -> None."""
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
    state = torch.load(path / "trainer_state.pt", map_location="cpu", weights_only=False)
    _load_weights(path, model)
    optimizer.load_state_dict(state.pop("optimizer"))
    scheduler.load_state_dict(state.pop("scheduler"))
    set_rng_state(state.pop("rng"))
    if state.get("round") is not None:
        state["round"] = to_device(state["round"], next(model.parameters()).device)
    return state


def to_device(obj: Any, device: torch.device | str) -> Any:
    """``obj`` with every tensor inside (dataclass fields, dicts, lists, tuples) moved to ``device``."""
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            setattr(obj, f.name, to_device(getattr(obj, f.name), device))
        return obj
    if isinstance(obj, dict):
        return {k: to_device(v, device) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_device(v, device) for v in obj)
    return obj


def _load_weights(path: Path, model: Any) -> None:
    from grouprl.train.model import is_peft

    if is_peft(model):
        from peft import set_peft_model_state_dict
        from peft.utils import load_peft_weights

        set_peft_model_state_dict(model, load_peft_weights(str(path), device="cpu"))
        return
    from safetensors.torch import load_file

    files = sorted(path.glob("model*.safetensors"))
    if not files:
        raise ConfigError(f"checkpoint {str(path)!r} has no model*.safetensors files.")
    weights: dict[str, torch.Tensor] = {}
    for f in files:
        weights.update(load_file(str(f)))
    missing, unexpected = model.load_state_dict(weights, strict=False)
    tied = {k for k in missing if "lm_head" in k}
    if set(missing) - tied or unexpected:
        raise ConfigError(f"checkpoint {str(path)!r} does not match the model: missing {sorted(missing)[:5]}, "
                          f"unexpected {sorted(unexpected)[:5]}.")
    if tied and hasattr(model, "tie_weights"):
        model.tie_weights()
