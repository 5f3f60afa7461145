"""The base of the sharding strategies (``sharding.NoSharding``, ``fsdp.FSDP2``, ``deepspeed.ZeRO``): what
follows from a strategy's own ``full_weights`` context is written once here."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class Strategy:
    """A strategy defines ``full_weights(model)`` (a context in which every rank sees the whole model);
    :meth:`with_full_weights` wraps a function in it, for code that must run on unsharded weights (the
    evaluation of rank 0, a checkpoint's full state dict)."""

    def full_weights(self, model: Any) -> Any:
        raise NotImplementedError

    def with_full_weights(self, model: Any, fn: Callable) -> Callable:
        """``fn`` called inside :meth:`full_weights` (on every rank)."""
        def call(*args: Any, **kwargs: Any) -> Any:
            with self.full_weights(model):
                return fn(*args, **kwargs)
        return call
