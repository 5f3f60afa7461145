"""Sharded training with FSDP2 (``torch.distributed.fsdp.fully_shard``), as configured through accelerate.

``accelerate launch --config_file fsdp2.yaml`` (``distributed_type: FSDP``, ``fsdp_version: 2``) or
``--use_fsdp --fsdp_version 2`` sets ``ACCELERATE_USE_FSDP=true`` and ``FSDP_*`` variables in every rank's
environment. accelerate's own ``Accelerator.prepare`` shards only on GPUs (on CPU it reports
``DistributedType.MULTI_CPU`` and has no ``fsdp_plugin``), so grouprl reads the same settings through
accelerate's ``FullyShardedDataParallelPlugin`` and applies ``fully_shard`` itself, as accelerate's
``fsdp2_prepare_model`` does: one FSDP unit per decoder layer (the plugin's
``transformer_cls_names_to_wrap``, else the model's ``_no_split_modules``), then the root (embeddings,
final norm, LM head). The same code runs on GPUs (NCCL) and CPUs (gloo).

Exact gradients. grouprl normalises every micro-batch loss by the token / sequence counts of the whole
global step (``train/parallel/ranks.py``), so the global gradient is the SUM of the ranks' gradients. FSDP's
reduce-scatter averages by default; every unit here gets ``set_gradient_divide_factor(1.0)`` and
``set_force_sum_reduction_for_comms(True)``: a plain SUM reduce-scatter (gloo has no ``PREMUL_SUM``).
Each rank then holds the summed gradient of its shard; ``clip_grad_norm_`` takes the global norm over the
shards (DTensor) and AdamW steps each shard.

Generation. The lean sampler reads the parameters directly and ``generate`` runs many forwards whose
number may differ between ranks (rank 0 evaluates alone, agent turns), so a generation round and an
evaluation run inside :func:`unsharded`: every unit is unsharded once (one all-gather per unit, every
rank), resharding after forward is switched off, and no collective happens until the block ends
(transformers' ``synced_gpus`` is kept off too). Memory: the full policy on every rank while generating.

Checkpoints hold the sharded model and optimizer through ``torch.distributed.checkpoint`` (DCP,
``<checkpoint>/distcp``, keys of ``get_state_dict``: parameter names, whatever the sharding), which any
number of ranks -- one process without FSDP too -- can load; a checkpoint saved without FSDP loads into
the shards too (:func:`load_full`). ``final/`` is a plain ``save_pretrained`` folder of the full state dict
gathered on rank 0 (:func:`gather_state_dict`).

The loop reaches all of this through ``train.parallel.ranks.Ranks``, which holds an :class:`FSDP2` as its ``sharding`` when FSDP is configured.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import torch

from grouprl.errors import ConfigError
from grouprl.train.parallel.strategy import Strategy

ENV = "ACCELERATE_USE_FSDP"
SHARDS = "distcp"  # the DCP folder inside a checkpoint


def _flag(name: str) -> bool:
    return os.environ.get(name, "").lower() in ("1", "true", "yes")


def requested() -> bool:
    """Whether accelerate's environment asks for FSDP (``ACCELERATE_USE_FSDP=true``)."""
    return _flag(ENV)


def check_env() -> None:
    """Refuse what grouprl does not shard: FSDP1, parameter offloading."""
    version = os.environ.get("FSDP_VERSION", "1")
    if version != "2":
        raise ConfigError(f"accelerate is configured for FSDP version {version} (FSDP_VERSION={version}); grouprl "
                          f"shards with FSDP2 only. Fix: fsdp_version: 2 in the accelerate config file (or "
                          f"--fsdp_version 2); see docs/DISTRIBUTED.md and examples/accelerate/fsdp2.yaml.")
    if _flag("FSDP_OFFLOAD_PARAMS"):
        raise ConfigError("accelerate is configured for FSDP with CPU offloading (FSDP_OFFLOAD_PARAMS=true / "
                          "fsdp_offload_params: true), which grouprl does not support yet. Fix: "
                          "fsdp_offload_params: false.")


def check_config(cfg: Any, world: int) -> None:
    """What FSDP on ``world`` processes cannot run, named before any model loads."""
    if cfg.use_peft:
        raise ConfigError(f"use_peft=true with FSDP on {world} processes is not supported (the LoRA merge of "
                          f"final/ needs the full weights). Fix: launch without FSDP (data parallel keeps a "
                          f"LoRA run's small optimizer state replicated), or use_peft=false.")
    if cfg.dynamic_sampling in ("drop", "resample"):
        raise ConfigError(f"dynamic_sampling={cfg.dynamic_sampling!r} with FSDP on {world} processes: ranks would "
                          f"run different numbers of forwards and backwards, and every FSDP forward is a "
                          f"collective. Fix: dynamic_sampling=none, or launch without FSDP (data parallel "
                          f"supports {cfg.dynamic_sampling}).")
    if cfg.rollout_backend == "vllm":
        raise ConfigError(f"rollout_backend='vllm' with FSDP on {world} processes is not supported (pushing "
                          f"sharded weights to the engine is not built). Fix: rollout_backend=transformers, or "
                          f"launch without FSDP (data parallel supports vllm).")


def _plugin() -> Any:
    from accelerate.utils import FullyShardedDataParallelPlugin

    return FullyShardedDataParallelPlugin()  # reads the FSDP_* variables accelerate launch set


def layer_classes(model: torch.nn.Module, names: list[str] | None) -> tuple[type, ...]:
    """The module classes that get their own FSDP unit: ``names`` (the config's
    ``fsdp_transformer_layer_cls_to_wrap``) or the model's ``_no_split_modules`` (its decoder layer)."""
    wanted = list(names or getattr(model, "_no_split_modules", None) or [])
    found = {type(m).__name__: type(m) for m in model.modules()}
    missing = [n for n in wanted if n not in found]
    if missing:
        own = getattr(model, "_no_split_modules", None)
        raise ConfigError(f"fsdp_transformer_layer_cls_to_wrap names {missing}, which this model does not have. "
                          f"Fix: name its decoder layer class ({own}), or leave the setting out (then the "
                          f"model's _no_split_modules are used).")
    return tuple(found[n] for n in wanted)


def shard_model(model: torch.nn.Module) -> list[Any]:
    """``fully_shard`` every decoder layer, then the root, with the plugin's settings; every unit sums
    gradients over ranks (no division). Returns the FSDP units, root last. In place."""
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    plugin = _plugin()
    kwargs = {"reshard_after_forward": plugin.reshard_after_forward,
              "mp_policy": plugin.mixed_precision_policy or MixedPrecisionPolicy()}
    classes = layer_classes(model, plugin.transformer_cls_names_to_wrap)
    for module in list(model.modules())[1:]:
        if classes and isinstance(module, classes) and not isinstance(module, FSDPModule):
            fully_shard(module, **kwargs)
    fully_shard(model, mp_policy=kwargs["mp_policy"])
    units = units_of(model)
    model._grouprl_reshard_after_forward = bool(kwargs["reshard_after_forward"])  # restored by unsharded()
    for unit in units:
        unit.set_gradient_divide_factor(1.0)  # the loss is normalised globally: SUM, never the mean
        unit.set_force_sum_reduction_for_comms(True)  # a plain SUM reduce-scatter (gloo: no PREMUL_SUM)
    return units


def units_of(model: Any) -> list[Any]:
    """The FSDP units of ``model`` (empty when it is not sharded), root last."""
    from torch.distributed.fsdp import FSDPModule

    return [m for m in reversed(list(model.modules())) if isinstance(m, FSDPModule)] if model is not None else []


def is_sharded(model: Any) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


@contextmanager
def unsharded(model: Any) -> Iterator[None]:
    """The whole model unsharded on every rank for the block (call it on every rank): each parameter is
    a plain full tensor (the lean sampler reads them directly), forwards neither gather nor reshard,
    and ``generate`` does not sync ranks -- so ranks may run different numbers of forwards inside.
    On exit, back to shards (no communication)."""
    units = units_of(model)
    if not units:
        yield
        return
    managed = model.__dict__.get("_is_fsdp_managed_module")
    for unit in units:
        unit.unshard()
        unit.set_reshard_after_forward(False, recurse=False)
    model._is_fsdp_managed_module = False  # transformers' generate: no synced_gpus all-reduce per token
    try:
        yield
    finally:
        if managed is None:
            model.__dict__.pop("_is_fsdp_managed_module", None)
        else:
            model._is_fsdp_managed_module = managed
        layers = bool(getattr(model, "_grouprl_reshard_after_forward", True))
        for unit in units:
            unit.reshard()
            unit.set_reshard_after_forward(layers if unit is not model else False, recurse=False)  # root: as FSDP


def gather_state_dict(model: Any) -> dict[str, torch.Tensor] | None:
    """The full (unsharded) state dict on rank 0, on the CPU; ``{}`` on the other ranks (every rank must
    call it: it gathers). ``None`` for a model that is not sharded."""
    if not is_sharded(model):
        return None
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def save_sharded(folder: Path, model: Any, optimizer: Any) -> None:
    """Every rank writes its shards of the model and the optimizer into ``folder`` (DCP; collective)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.save({"model": model_sd, "optimizer": optim_sd}, checkpoint_id=str(folder))


def load_shards(folder: Path, model: Any, optimizer: Any) -> None:
    """Model and optimizer from a DCP ``folder`` written by any number of ranks, into ``model`` /
    ``optimizer`` as they are sharded now (FSDP on any number of ranks, or one plain process)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optimizer": optim_sd}
    dcp.load(state, checkpoint_id=str(folder))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])


def save_full(model: Any, path: Path, state_dict: dict[str, torch.Tensor] | None) -> None:
    """``save_pretrained`` of the gathered ``state_dict`` (rank 0), naming the model's own class in
    ``config.json`` (``FSDPQwen2ForCausalLM`` is FSDP's wrapper class; it is no model class to load)."""
    import json

    if state_dict is None:
        raise ConfigError(f"this model is sharded with FSDP over the ranks: one rank cannot save it alone (to "
                          f"{str(path)!r}). Fix: use <output_dir>/final, which the trainer gathers and saves, or "
                          f"gather on every rank with dist.current().sharding.full_state_dict(model) and pass it to "
                          f"save_final(..., state_dict=...) on rank 0.")

    before = getattr(model.config, "architectures", None)
    model.save_pretrained(path, state_dict=state_dict)
    model.config.architectures = before  # as it was, whatever save_pretrained set on the live config
    config = Path(path) / "config.json"
    data = json.loads(config.read_text())
    data["architectures"] = [name.removeprefix("FSDP") for name in data.get("architectures") or []] or None
    config.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def load_full(model: Any, optimizer: Any, weights: dict[str, torch.Tensor], optimizer_state: dict) -> None:
    """A checkpoint saved without FSDP (full ``weights``; ``optimizer_state`` = ``optimizer.state_dict()``,
    keyed by parameter index) into a sharded ``model`` / ``optimizer``: the indices are the trainable
    parameters in ``named_parameters`` order, as ``build_optimizer`` listed them; every rank keeps its shard."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    names = [n for n, p in model.named_parameters() if p.requires_grad]
    groups = optimizer_state["param_groups"]
    index = [i for g in groups for i in g["params"]]
    if len(index) != len(names):
        raise ConfigError(f"the checkpoint's optimizer holds {len(index)} parameters, this model trains "
                          f"{len(names)}: it was saved for another model or LoRA setting.")
    name = dict(zip(index, names))
    optim = {"state": {name[i]: v for i, v in optimizer_state["state"].items()},
             "param_groups": [{**g, "params": [name[i] for i in g["params"]]} for g in groups]}
    set_state_dict(model, optimizer, model_state_dict=weights, optim_state_dict=optim,
                   options=StateDictOptions(full_state_dict=True, strict=False))


class FSDP2(Strategy):
    """The FSDP2 sharding strategy of a :class:`~grouprl.train.parallel.ranks.Ranks` (held by composition as
    ``ranks.sharding``; chosen by ``Ranks.shard`` when accelerate's environment asks for FSDP and several
    processes run)."""

    engine = None  # a DeepSpeed engine: none here

    def __init__(self, ranks: Any) -> None:
        self.ranks = ranks
        self.sharded = False  # set by shard()

    def shard(self, model: Any, reference: Any = None) -> bool:
        """Shard ``model`` (and the reference copy, if it has its own) with FSDP2; returns True."""
        self.ranks.check()
        with self.ranks.failures():
            shard_model(model)
            if reference is not None and not getattr(reference, "shared", True):
                shard_model(reference.model)
        self.sharded = True
        if self.ranks.is_main:
            print(f"grouprl: FSDP2: {len(units_of(model))} units (decoder layers + root) sharded over "
                  f"{self.ranks.world} processes{' (and the reference model)' if reference is not None and not reference.shared else ''}; "
                  f"gradients summed over ranks", file=sys.stderr, flush=True)
        return True

    def full_weights(self, model: Any) -> Any:
        """A context in which a sharded model is whole on every rank (generation, evaluation); every rank
        enters it. A no-op without FSDP."""
        if not self.sharded:
            return nullcontext()
        self.ranks.check()
        return unsharded(model)

    def zero_init(self, model: Any, optimizer: Any, cfg: Any) -> bool:
        return False  # FSDP2 shards without a DeepSpeed engine

    def load_zero(self, folder: Path) -> None:
        from grouprl.train.parallel.deepspeed import load_without_engine

        load_without_engine(folder)

    def full_state_dict(self, model: Any) -> dict | None:
        """A sharded model's full weights on rank 0 (``{}`` elsewhere; every rank calls it); ``None`` without FSDP."""
        if not self.sharded:
            return None
        self.ranks.check()
        with self.ranks.failures():
            return gather_state_dict(model)

    def save_shards(self, output_dir: Any, step: int, model: Any, optimizer: Any) -> bool:
        """FSDP: every rank writes its model and optimizer shards into the checkpoint being written
        (``.tmp-checkpoint-<step>/distcp``, torch.distributed.checkpoint); rank 0 then adds the rest. Returns
        whether it did (False without FSDP)."""
        import shutil

        from grouprl.train.checkpoint import layout as checkpoint

        if not self.sharded:
            return False
        tmp = checkpoint.tmp_checkpoint(output_dir, step)
        self.ranks.on_main(lambda: shutil.rmtree(tmp) if tmp.exists() else None)  # a leftover of a killed save
        self.ranks.check()
        with self.ranks.failures():
            save_sharded(tmp / SHARDS, model, optimizer)
        return True
