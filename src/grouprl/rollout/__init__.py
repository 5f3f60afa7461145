"""Generation backends and engines: turn prompts into G completions each, with the masks the loss needs.

Every rollout runs on one token-in/token-out interface, :class:`grouprl.rollout.engine.Engine`:
``generate(prompt_ids, max_new_tokens, sampling) -> [Generation(token_ids, logprobs, finish_reason)]``.
``make_backend(name, model, tokenizer)`` returns the run's backend: ``generate(prompts, n, params) ->
Rollout`` for single-turn rounds and ``sync_weights(model)`` (``grouprl.rollout.base.Backend``); the
multi-turn rollout takes the backend's engine (:func:`grouprl.rollout.engine.engine_for`).
``transformers`` (``generate`` with a KV cache, or the lean CPU sampler, using the training weights) and
``vllm`` (``grouprl.rollout.vllm_backend``: an engine with its own copy of the weights, colocated or a
``grouprl vllm-serve`` server; needs the ``vllm`` extra) are built in. Another engine (SGLang, a scripted
policy, ...) plugs in as ``rollout_backend: "package.module:Class"``: a subclass of ``Engine`` serves
single-turn and multi-turn runs (docs/EXTENDING.md, "A rollout engine"); a class with the text-level
``generate(prompts, n, params) -> Rollout`` serves single-turn runs only. It is imported only when named,
and the loop calls its ``sync_weights`` once per generation round, before generating (and before each
evaluation).
"""

from __future__ import annotations

from typing import Any

from grouprl.rollout.base import Backend, Rollout, SamplingParams
from grouprl.rollout.engine import Engine, EngineBackend, Generation, is_engine_class

BACKENDS = {"transformers": "grouprl.rollout.hf:TransformersBackend",
            "vllm": "grouprl.rollout.vllm_backend:VLLMBackend"}


def backend_class(name: str) -> Any:
    """The class ``name`` stands for (a built-in name or ``package.module:Class``), imported here."""
    import importlib

    from grouprl.errors import ConfigError, did_you_mean

    spec = BACKENDS.get(name, name)
    module_name, sep, cls_name = spec.partition(":")
    if not sep:
        raise ConfigError(f"rollout_backend={name!r} is unknown.{did_you_mean(name, BACKENDS)} Built in: "
                          f"{', '.join(BACKENDS)}; others plug in as 'package.module:Class' subclassing "
                          f"grouprl.rollout.engine.Engine (generate(prompt_ids, max_new_tokens, sampling)).")
    try:
        module = importlib.import_module(module_name)
        return getattr(module, cls_name)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"rollout_backend={name!r} cannot be loaded ({e}).") from e


def check_agent_backend(name: str) -> None:
    """ConfigError unless ``rollout_backend`` can drive multi-turn rollouts (built-ins and Engine plug-ins)."""
    if name in BACKENDS:
        return
    cls = backend_class(name)
    if not is_engine_class(cls):
        from grouprl.errors import ConfigError

        raise ConfigError(f"rollout_backend={name!r} is a text-level backend (generate(prompts, n, params)); "
                          f"multi-turn tool rollouts need token ids in and out. Fix: subclass "
                          f"grouprl.rollout.engine.Engine and implement generate(prompt_ids, max_new_tokens, "
                          f"sampling) (docs/EXTENDING.md, 'A rollout engine').")


def make_backend(name: str, model: Any, tokenizer: Any, *, lean_sampler: bool | None = None,
                 vllm_options: dict | None = None, rollout_dtype: str = "auto", **kwargs: Any) -> Backend:
    """Instantiate the backend ``name`` (a built-in name or ``package.module:Class``), importing it here.

    ``lean_sampler`` and ``rollout_dtype`` reach the built-in transformers backend only (``None``: lean
    sampler on CPU only); ``vllm_options`` (``grouprl.rollout.vllm_backend.options_from``) the vllm backend
    only. A plug-in :class:`Engine` is built as ``Class(model, tokenizer)`` and wrapped in an
    :class:`EngineBackend` for single-turn rounds.
    """
    spec = BACKENDS.get(name, name)
    if spec == BACKENDS["transformers"]:
        kwargs.setdefault("lean", lean_sampler)
        kwargs.setdefault("rollout_dtype", rollout_dtype)
    if spec == BACKENDS["vllm"]:
        kwargs.update(vllm_options or {})
    cls = backend_class(name)
    if is_engine_class(cls):
        return EngineBackend(cls(model, tokenizer, **kwargs), tokenizer)
    return cls(model, tokenizer, **kwargs)


__all__ = ["Backend", "Engine", "EngineBackend", "Generation", "Rollout", "SamplingParams", "check_agent_backend",
           "make_backend"]
