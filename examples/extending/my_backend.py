"""A rollout-backend plug-in: the built-in transformers backend, recording every generate call.

A backend is any class built as ``Cls(model, tokenizer, **kwargs)`` with ``generate(prompts, n, params)
-> Rollout`` and ``sync_weights(model)`` (``grouprl.rollout.base.Backend``). The trainer calls
``sync_weights`` once per generation round, before generating, and before each evaluation. Wrapping the
built-in backend is the shortest way to add timing, caching or a different decoding policy.
"""

from __future__ import annotations

import time

from grouprl.rollout.hf import TransformersBackend


class RecordingBackend:
    """``TransformersBackend`` plus a record of each call in ``RecordingBackend.history`` (class-wide,
    because the trainer builds the instance): ``{"call": "generate", "prompts", "n", "temperature",
    "seconds"}`` or ``{"call": "sync_weights"}``."""

    history: list[dict] = []

    def __init__(self, model, tokenizer, **kwargs):
        self.inner = TransformersBackend(model, tokenizer, **kwargs)

    def sync_weights(self, model):
        RecordingBackend.history.append({"call": "sync_weights"})
        self.inner.sync_weights(model)

    def generate(self, prompts, n, params):
        start = time.perf_counter()
        rollout = self.inner.generate(prompts, n, params)
        RecordingBackend.history.append({"call": "generate", "prompts": len(prompts), "n": n,
                                         "temperature": params.temperature,
                                         "seconds": time.perf_counter() - start})
        return rollout
