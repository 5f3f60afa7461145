"""Generation backends: turn prompts into G completions each, with the masks the loss needs.

``make_backend(name, model, tokenizer)`` returns an object with ``generate(prompts, n, params) -> Rollout``
and ``sync_weights(model)`` (see ``grouprl.rollout.base.Backend``). ``transformers`` (``generate`` with a KV
cache, using the training weights) is built in. Another engine (vLLM, SGLang) plugs in as
``rollout_backend: "package.module:Class"``; it is imported only when named, and the loop calls its
``sync_weights`` once per generation round, before generating (and before each evaluation).
"""

from __future__ import annotations

from typing import Any

from grouprl.rollout.base import Backend, Rollout, SamplingParams

BACKENDS = {"transformers": "grouprl.rollout.hf:TransformersBackend"}


def make_backend(name: str, model: Any, tokenizer: Any, *, lean_sampler: bool | None = None,
                 **kwargs: Any) -> Backend:
    """Instantiate the backend ``name`` (a built-in name or ``package.module:Class``), importing it here.

    ``lean_sampler`` reaches the built-in transformers backend only (``None``: lean sampler on CPU only).
    """
    import importlib

    from grouprl.errors import ConfigError, did_you_mean

    spec = BACKENDS.get(name, name)
    if spec == BACKENDS["transformers"]:
        kwargs.setdefault("lean", lean_sampler)
    module_name, sep, cls_name = spec.partition(":")
    if not sep:
        raise ConfigError(f"rollout_backend={name!r} is unknown.{did_you_mean(name, BACKENDS)} Built in: "
                          f"{', '.join(BACKENDS)}; others plug in as 'package.module:Class' implementing "
                          f"grouprl.rollout.base.Backend (generate + sync_weights).")
    try:
        module = importlib.import_module(module_name)
        cls = getattr(module, cls_name)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"rollout_backend={name!r} cannot be loaded ({e}).") from e
    return cls(model, tokenizer, **kwargs)


__all__ = ["Backend", "Rollout", "SamplingParams", "make_backend"]
