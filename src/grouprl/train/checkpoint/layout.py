"""The names and plain state of a checkpoint folder, shared by the writers (``store``, and the sharded
writers of ``train/parallel``): ``checkpoint-<step>``, its temporary twin, the RNG states, and moving a saved
round's tensors between devices. Imports no other grouprl module (docs/DESIGN.md, "Layout")."""

from __future__ import annotations

import dataclasses
import random
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

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


def tmp_checkpoint(output_dir: str | Path, step: int) -> Path:
    """Where checkpoint-<step> is written before its rename."""
    return Path(output_dir) / f".tmp-checkpoint-{step}"


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
