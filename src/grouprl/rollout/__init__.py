"""Generation backends: turn prompts into G completions each, with the masks the loss needs.

``make_backend(name, model, tokenizer)`` returns an object with ``generate(prompts, n, params) -> Rollout``
(see ``grouprl.rollout.base``). ``transformers`` (``generate`` with a KV cache) is built in; other backends
(vLLM) are imported lazily only when named, so they never cost an import otherwise.
"""

from __future__ import annotations

from typing import Any

from grouprl.rollout.base import Rollout, SamplingParams

BACKENDS = {
    "transformers": "grouprl.rollout.hf:TransformersBackend",
    "vllm": "grouprl.rollout.vllm:VLLMBackend",
}


def make_backend(name: str, model: Any, tokenizer: Any, **kwargs: Any):
    """Instantiate the backend called ``name`` (import happens here, not at package import)."""
    import importlib

    from grouprl.errors import ConfigError, did_you_mean

    if name not in BACKENDS:
        raise ConfigError(f"rollout_backend={name!r} is unknown.{did_you_mean(name, BACKENDS)} "
                          f"Known: {', '.join(BACKENDS)}.")
    module_name, _, cls_name = BACKENDS[name].partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ConfigError(f"rollout_backend={name!r} is not available here ({e}). "
                          f"Use rollout_backend=transformers or install the backend.") from e
    return getattr(module, cls_name)(model, tokenizer, **kwargs)


__all__ = ["Rollout", "SamplingParams", "make_backend"]
