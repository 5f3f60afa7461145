"""Generation backends: turn prompts into G completions each, with the masks the loss needs.

``make_backend(name, model, tokenizer)`` returns an object with ``generate(prompts, n, params) -> Rollout``
and ``sync_weights(model)`` (see ``grouprl.rollout.base.Backend``). ``transformers`` (``generate`` with a KV
cache, using the training weights) and ``vllm`` (``grouprl.rollout.vllm_backend``: an engine with its own
copy of the weights, colocated or a ``grouprl vllm-serve`` server; needs the ``vllm`` extra) are built in.
Another engine (SGLang, ...) plugs in as
``rollout_backend: "package.module:Class"``; it is imported only when named, and the loop calls its
``sync_weights`` once per generation round, before generating (and before each evaluation).
"""

from __future__ import annotations

from typing import Any

from grouprl.rollout.base import Backend, Rollout, SamplingParams

BACKENDS = {"transformers": "grouprl.rollout.hf:TransformersBackend",
            "vllm": "grouprl.rollout.vllm_backend:VLLMBackend"}


def make_backend(name: str, model: Any, tokenizer: Any, *, lean_sampler: bool | None = None,
                 vllm_options: dict | None = None, rollout_dtype: str = "auto", **kwargs: Any) -> Backend:
    """Instantiate the backend ``name`` (a built-in name or ``package.module:Class``), importing it here.

    ``lean_sampler`` and ``rollout_dtype`` reach the built-in transformers backend only (``None``: lean
    sampler on CPU only);
    ``vllm_options`` (``grouprl.rollout.vllm_backend.options_from``) the vllm backend only.
    """
    import importlib

    from grouprl.errors import ConfigError, did_you_mean

    spec = BACKENDS.get(name, name)
    if spec == BACKENDS["transformers"]:
        kwargs.setdefault("lean", lean_sampler)
        kwargs.setdefault("rollout_dtype", rollout_dtype)
    if spec == BACKENDS["vllm"]:
        kwargs.update(vllm_options or {})
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
