"""Demo models that need no download, reachable only by name: ``model: builtin:<name>``.

Nothing in the library imports this package statically: the model loader (``grouprl.models``) asks for
it with ``importlib.import_module("grouprl.builtin")`` when a model name starts with ``builtin:``; importing
it registers :func:`model_path` as the ``builtin`` entry of ``MODEL_SOURCES``, which looks the name up in
:data:`MODELS`. So the training code carries
no demo code, and a newcomer can delete or replace a demo without touching ``train/``.

- :mod:`grouprl.builtin.tiny`: tiny random-weight Qwen2/Llama models and a locally trained tokenizer
  (what the tests and benchmarks build);
- :mod:`grouprl.builtin.warmstart`: those models after a short SFT on a built-in task, cached on disk
  (``builtin:arithmetic``, the ``make run`` model).
"""

from __future__ import annotations

import os
from collections.abc import Callable

from grouprl.builtin import warmstart
from grouprl.registry import MODEL_SOURCES

PREFIX = "builtin:"


def _warm_started(name: str, cache_dir: str | os.PathLike | None = None) -> str:
    return warmstart.builtin_model_path(name, cache_dir=cache_dir)  # looked up per call (tests patch it)


# name -> a function ``(name, cache_dir=None) -> str`` giving a local directory ``from_pretrained`` loads.
MODELS: dict[str, Callable[..., str]] = {name: _warm_started for name in warmstart.WARMSTARTS}


def model_path(name: str, cache_dir: str | os.PathLike | None = None) -> str:
    """Directory of the built-in model ``name`` (``"arithmetic"`` or ``"builtin:arithmetic"``).

    Unknown names raise ``UnknownNameError`` listing the known ones.
    """
    name = name.removeprefix(PREFIX)
    if name not in MODELS:
        warmstart.get_warmstart(name)  # raises with the list of known names and a "did you mean"
    return MODELS[name](name, cache_dir=cache_dir)


MODEL_SOURCES.register("builtin", model_path)  # how grouprl.models resolves builtin:<name>

__all__ = ["MODELS", "PREFIX", "model_path"]
