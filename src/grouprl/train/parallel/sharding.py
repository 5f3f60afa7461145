"""The sharding strategies a :class:`~grouprl.train.parallel.ranks.Ranks` holds (``ranks.sharding``):
:class:`NoSharding` here (one process, or data parallel), ``fsdp.FSDP2`` and ``deepspeed.ZeRO`` -- each with
``shard``, ``zero_init``, ``full_weights``, ``with_full_weights``, ``full_state_dict``, ``save_shards`` and
``load_zero`` -- and :func:`check_config`: what N processes cannot run, from the algorithm's declaration and
the strategies' own limits, checked before any model loads."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

from grouprl.errors import ConfigError
from grouprl.train.parallel import deepspeed, fsdp


class NoSharding:
    """Every rank holds the whole model (one process, or data parallel: gradients summed by
    :meth:`Ranks.sum_gradients`). The strategies with the same methods: ``fsdp.FSDP2``, ``deepspeed.ZeRO``."""

    sharded = False
    engine = None

    def shard(self, model: Any, reference: Any = None) -> bool:
        return False

    def zero_init(self, model: Any, optimizer: Any, cfg: Any) -> bool:
        return False

    def full_weights(self, model: Any) -> Any:
        return nullcontext()

    def with_full_weights(self, model: Any, fn: Callable) -> Callable:
        return fn

    def full_state_dict(self, model: Any) -> dict | None:
        return None

    def save_shards(self, output_dir: Any, step: int, model: Any, optimizer: Any) -> bool:
        return False

    def load_zero(self, folder: Any) -> None:
        deepspeed.load_without_engine(folder)


def check_config(cfg: Any, world: int) -> None:
    """What N processes cannot run, named before any model loads: the algorithm's declared process count
    (``Supports.max_processes``, grouprl.config.algorithms), then the limits of FSDP and DeepSpeed
    (``check_config`` in ``train.parallel.fsdp``, ``train.parallel.deepspeed``). Data parallel runs the rest
    (dynamic sampling ``drop`` / ``resample``: ranks draw extra prompts in lock-step, ``algorithms.rounds``;
    ``rollout_backend: vllm``: an engine per rank, or one server that rank 0 drives)."""
    from grouprl.config.algorithms import supports_of

    most = supports_of(cfg.algorithm).max_processes
    if most is not None and world > most:
        raise ConfigError(f"algorithm={cfg.algorithm!r} with {world} processes is not supported (its loop runs on "
                          f"at most {most}). Fix: launch {most} process{'es' if most > 1 else ''}, or "
                          f"algorithm=grpo / gspo / dpo, which run on several.")
    for plugin in (fsdp, deepspeed):
        if world > 1 and plugin.requested():
            plugin.check_config(cfg, world)
