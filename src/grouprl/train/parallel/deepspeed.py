"""DeepSpeed ZeRO-2 and ZeRO-3 (arXiv:1910.02054), as configured through accelerate.

``accelerate launch --config_file zero2.yaml`` (``distributed_type: DEEPSPEED``, ``deepspeed_config:
zero_stage: 2``) sets ``ACCELERATE_USE_DEEPSPEED=true`` and ``ACCELERATE_DEEPSPEED_*`` variables (or
``ACCELERATE_DEEPSPEED_CONFIG_FILE``, a DeepSpeed JSON) in every rank's environment. accelerate builds a
DeepSpeed engine only on GPUs (on CPU it prepares plain DDP and ignores DeepSpeed), and it wants a
dataloader to size the batch, so grouprl reads the same settings through accelerate's ``DeepSpeedPlugin``
and calls ``deepspeed.initialize`` itself, on GPUs and CPUs alike (``DS_ACCELERATOR=cpu`` without CUDA).
The batch fields come from grouprl's own config -- ``train_micro_batch_size_per_gpu`` =
``per_device_train_batch_size``, ``gradient_accumulation_steps``, ``train_batch_size`` = their product x
processes, ``gradient_clipping`` = ``max_grad_norm`` -- and a DeepSpeed config that sets one of them to
something else is refused, naming both fields.

Exact gradients. grouprl normalises every micro-batch loss by the counts of the whole global step, so the
global gradient is the SUM of the ranks' gradients; ZeRO's reduction averages over the ``N`` ranks, so
every backward here is of ``N x loss`` (exact for N a power of two). ZeRO-2 and ZeRO-3 reduce inside
every backward (and a ZeRO-3 forward gathers parameters, a collective too), so every rank runs as many
forward/backward passes as the rank with the most micro-batches: the missing ones re-run the rank's first
micro-batch with weight 0 (zero gradient). The last backward is the accumulation boundary; then the
engine's ZeRO optimizer clips by the global norm (``gradient_clipping``) and steps grouprl's optimizer
(AdamW of ``build_optimizer``, on the ZeRO partitions), and grouprl's schedule steps unless the step was
skipped. A non-finite loss on any rank makes the boundary backward NaN, so ZeRO's overflow check skips
the step exactly as ``train.engine.step.optimizer_step`` does (no optimizer or schedule move). The micro-batch
forwards go through the engine (its backward hooks need it), so the chunked LM-head log-softmax is not
used; grouprl's bf16 autocast is kept inside it through DeepSpeed's ``torch_autocast`` (fp32 reductions).

Generation and evaluation (ZeRO-3): inside :meth:`ZeroSharding.full_weights` every parameter is gathered
(``deepspeed.zero.GatheredParameters``) and ZeRO-3's module hooks are removed, so the lean sampler reads
whole tensors and ranks may run different numbers of forwards; the hooks come back on exit. Memory: the
full policy on every rank while generating. The reference model (``kl_coef > 0``) is a plain replicated
copy on every rank (``ref_dtype``), never partitioned. ZeRO-2 keeps whole parameters on every rank.

Checkpoints: DeepSpeed's own ``engine.save_checkpoint`` into ``<checkpoint>/deepspeed`` (every rank writes
its optimizer partitions; ZeRO-3 its parameter partitions too), read back by ``engine.load_checkpoint``: on
the same number of ranks as saved; a ZeRO-2 checkpoint also on another number, through DeepSpeed's
universal checkpoint (``ds_to_universal``, converted once by rank 0 into ``<checkpoint>/deepspeed/universal``).
Another ZeRO stage, ZeRO-3 on another rank count, or a run without DeepSpeed is refused with the fix
(``zero_to_fp32.py``). ``final/`` is a plain ``save_pretrained`` folder of the full weights gathered on rank 0.
"""

from __future__ import annotations

import copy
import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from grouprl.errors import ConfigError, GroupRLError
from grouprl.train.parallel.strategy import Strategy

ENV = "ACCELERATE_USE_DEEPSPEED"
FOLDER = "deepspeed"  # DeepSpeed's checkpoint inside a grouprl checkpoint
TAG = "zero"
UNIVERSAL = "universal"  # the tag of its universal conversion (another rank count / stage)
INSTALL = "pip install 'grouprl[deepspeed]'"


def _flag(name: str) -> bool:
    return os.environ.get(name, "").lower() in ("1", "true", "yes")


def requested() -> bool:
    """Whether accelerate's environment asks for DeepSpeed (``ACCELERATE_USE_DEEPSPEED=true``)."""
    return _flag(ENV)


def plugin_config() -> dict[str, Any]:
    """The DeepSpeed config accelerate's ``DeepSpeedPlugin`` builds from the environment (``auto`` unfilled)."""
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    try:
        import deepspeed  # noqa: F401
    except ImportError as e:
        raise ConfigError(f"accelerate is configured for DeepSpeed ({ENV}=true) but deepspeed is not installed "
                          f"({e}). Fix: {INSTALL}, or launch with FSDP2 / data parallel instead.") from None
    from accelerate.utils import DeepSpeedPlugin

    config = copy.deepcopy(DeepSpeedPlugin().deepspeed_config)
    path = os.environ.get("ACCELERATE_DEEPSPEED_CONFIG_FILE", "none")
    if path != "none" and "gradient_accumulation_steps" not in json.loads(Path(path).read_text()):
        config["gradient_accumulation_steps"] = "auto"  # accelerate writes 1 where the file says nothing
    return config


def check_env() -> None:
    """Refuse what grouprl does not run with DeepSpeed: ZeRO stages other than 2 and 3, offloading,
    DeepSpeed's fp16 / bf16 (grouprl autocasts itself: ``bf16: true``)."""
    config = plugin_config()
    zero = config.get("zero_optimization") or {}
    stage = zero.get("stage", 0)
    if stage not in (2, 3):
        raise ConfigError(f"accelerate is configured for DeepSpeed ZeRO stage {stage} (zero_stage: {stage}); grouprl "
                          f"runs ZeRO-2 and ZeRO-3. Fix: zero_stage: 2 or 3 (examples/accelerate/zero2.yaml, "
                          f"zero3.yaml), or launch data parallel (--multi_gpu).")
    for part in ("offload_optimizer", "offload_param"):
        device = str((zero.get(part) or {}).get("device", "none")).lower()
        if device not in ("none", "null", ""):
            raise ConfigError(f"accelerate is configured for DeepSpeed with {part} on {device!r} "
                              f"({part}_device: {device}), which grouprl does not support. Fix: "
                              f"{part}_device: none.")
    mixed = os.environ.get("ACCELERATE_MIXED_PRECISION", "no")
    half = [k for k in ("fp16", "bf16") if (config.get(k) or {}).get("enabled") not in (None, False, "auto")]
    if mixed in ("fp16", "bf16") or half:
        raise ConfigError(f"DeepSpeed is configured for {half or mixed} mixed precision (mixed_precision: {mixed}); "
                          f"grouprl keeps fp32 master weights and autocasts itself. Fix: mixed_precision: 'no' "
                          f"(no fp16 / bf16 section in the DeepSpeed config) and grouprl's bf16: true.")


# the DeepSpeed batch fields and the grouprl fields they must equal
BATCH_FIELDS = {"train_micro_batch_size_per_gpu": "per_device_train_batch_size",
                "gradient_accumulation_steps": "gradient_accumulation_steps",
                "train_batch_size": "per_device_train_batch_size x gradient_accumulation_steps x processes",
                "gradient_clipping": "max_grad_norm"}


def engine_config(cfg: Any, world: int, config: dict[str, Any] | None = None, *,
                  bf16_autocast: bool = False) -> dict[str, Any]:
    """accelerate's DeepSpeed config with the batch fields and clipping taken from grouprl's ``cfg``;
    a field the user set to another value is refused (``auto`` or absent is filled). ``bf16_autocast``
    (grouprl's ``bf16: true`` on a GPU): the engine's forward keeps grouprl's bf16 autocast (DeepSpeed
    switches an outer autocast off unless its ``torch_autocast`` is on), every gradient still reduced in fp32."""
    config = plugin_config() if config is None else copy.deepcopy(config)
    if bf16_autocast:
        config["torch_autocast"] = {"enabled": True, "dtype": "bfloat16", "lower_precision_safe_modules": []}
    per, ga = cfg.per_device_train_batch_size, cfg.gradient_accumulation_steps
    ours = {"train_micro_batch_size_per_gpu": per, "gradient_accumulation_steps": ga,
            "train_batch_size": per * ga * world, "gradient_clipping": float(max(cfg.max_grad_norm, 0.0))}
    for key, value in ours.items():
        theirs = config.get(key, "auto")
        if theirs not in ("auto", None) and float(theirs) != float(value):
            raise ConfigError(f"the DeepSpeed config sets {key}={theirs}, but grouprl's {BATCH_FIELDS[key]} gives "
                              f"{value}. Fix: leave {key} out of the DeepSpeed config (or 'auto'): grouprl fills it "
                              f"from its own config.")
        config[key] = value
    zero = config.setdefault("zero_optimization", {})
    for key in [k for k, v in zero.items() if v == "auto"]:
        del zero[key]  # DeepSpeed's default
    config.setdefault("zero_allow_untested_optimizer", True)  # grouprl's AdamW is torch's; tests use SGD
    config["steps_per_print"] = 1 << 30  # no DeepSpeed progress lines between grouprl's own
    config.setdefault("wall_clock_breakdown", False)
    return config


def check_config(cfg: Any, world: int) -> None:
    """What DeepSpeed on ``world`` processes cannot run, named before any model loads."""
    from grouprl.config.algorithms import supports_of

    if not supports_of(cfg.algorithm).deepspeed:
        raise ConfigError(f"algorithm={cfg.algorithm!r} with DeepSpeed on {world} processes is not supported (its loop "
                          f"takes its own optimizer steps). Fix: launch it data parallel (--multi_gpu).")
    if cfg.use_peft:
        raise ConfigError(f"use_peft=true with DeepSpeed on {world} processes is not supported. Fix: launch data "
                          f"parallel (--multi_gpu; LoRA's optimizer state is small), or use_peft=false.")
    if cfg.dynamic_sampling in ("drop", "resample"):
        raise ConfigError(f"dynamic_sampling={cfg.dynamic_sampling!r} with DeepSpeed on {world} processes: a rank "
                          f"may be left without a micro-batch, and every ZeRO backward is a collective. Fix: "
                          f"dynamic_sampling=none, or launch data parallel (--multi_gpu).")
    if cfg.rollout_backend == "vllm":
        raise ConfigError(f"rollout_backend='vllm' with DeepSpeed on {world} processes is not supported. Fix: "
                          f"rollout_backend=transformers, or launch data parallel (--multi_gpu).")
    engine_config(cfg, world)  # contradicting batch sizes


def zero_step(ranks: Any, ctx: Any, mbs: list, loss_of: Callable, combine: Callable, scheduler: Any,
              timers: Any) -> tuple[dict, float, bool, bool, float]:
    """One optimizer step through the ZeRO engine ``ranks.engine``: ``(metric sums, grad norm, finite
    loss, skipped, lr)``. ``loss_of(model, mb)`` is ``(loss, sums)`` of a micro-batch normalised by the
    global step's totals; see the module docstring for the exact gradient and the skip."""
    engine = ranks.engine
    counts = ranks.all_gather(len(mbs))
    if min(counts) == 0:
        raise GroupRLError(f"a DeepSpeed step with micro-batches per rank {counts}: every rank needs one.")
    acc: dict[str, torch.Tensor] = {}
    finite: Any = True
    with timers("policy_fwd_bwd"):
        for i in range(max(counts)):
            real = i < len(mbs)
            with ctx.autocast():
                loss, sums = loss_of(engine, mbs[i] if real else mbs[0])
            weight = float(ranks.world) if real else 0.0
            if real:
                finite = torch.isfinite(loss.detach()) & finite
                combine(acc, sums)
            last = i == max(counts) - 1
            if last:  # one host sync: a non-finite loss on any rank poisons the boundary -> ZeRO skips
                finite = ranks.all_gather(bool(finite)) == [True] * ranks.world
                weight = weight if finite else float("nan")
            engine.set_gradient_accumulation_boundary(last)
            engine.backward(loss * weight, scale_wrt_gas=False)
    with timers("optimizer"):
        lr = scheduler.get_last_lr()[0]
        engine.step()
        skipped = bool(getattr(engine.optimizer, "overflow", False))
        norm = engine.get_global_grad_norm()
        grad_norm = float("inf") if skipped or norm is None else float(norm)
        if not skipped:
            scheduler.step()
    return acc, grad_norm, bool(finite), skipped, lr


def checkpoint_ranks(folder: Path) -> int:
    """How many ranks wrote the DeepSpeed checkpoint in ``folder`` (its optimizer partition files)."""
    return len(list((folder / TAG).glob("*optim_states.pt")))


def checkpoint_stage(folder: Path) -> int:
    """The ZeRO stage of the DeepSpeed checkpoint in ``folder``: ZeRO-3 writes a model-states file per rank."""
    return 3 if list((folder / TAG).glob("zero_pp_rank_*_model_states.pt")) else 2


@contextmanager
def gathered(engine: Any) -> Iterator[None]:
    """ZeRO-3: every parameter whole on every rank and the module hooks off for the block (no collective
    inside: ranks may run different numbers of forwards); hooks back and parameters partitioned on exit."""
    import deepspeed

    offload = getattr(engine.optimizer, "parameter_offload", None)
    if offload is None:  # ZeRO-2: parameters are whole already
        yield
        return
    root = offload.module
    with deepspeed.zero.GatheredParameters(list(root.parameters())):
        for p in root.parameters():
            p.ds_active_sub_modules.clear()
        start = root._forward_pre_hooks[offload.fwd_pre_hook.id]  # its step reset syncs the ranks
        for hook in [offload.fwd_pre_hook, *offload.forward_hooks, *offload.backward_hooks]:
            hook.remove()
        offload.forward_hooks, offload.backward_hooks = [], []
        try:
            yield
        finally:  # as DeepSpeed set them up: the step reset first, then every module's hooks (same ids)
            offload.fwd_pre_hook = root.register_forward_pre_hook(start)
            offload._register_deepspeed_module(root, count=[0])


STALE_LOCK_S = 600.0
"""A JIT build lock older than this is left by a killed build: DeepSpeed's CPU ops (``deepspeed_shm_comm``)
are compiled by torch's cpp_extension, which waits on an existing ``lock`` file with no deadline."""


def check_build_locks(root: str | None = None, now: float | None = None) -> None:
    """Refuse to start when a torch extension build lock is stale (a build killed mid-way leaves it, and every
    later ZeRO run on that machine would wait forever); the error names the file and the fix."""
    import glob
    import time

    from torch.utils.cpp_extension import get_default_build_root

    root = root or os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root()
    now = time.time() if now is None else now
    for lock in sorted(glob.glob(os.path.join(root, "*", "*", "lock")) + glob.glob(os.path.join(root, "*", "lock"))):
        age = now - os.path.getmtime(lock)
        if age > STALE_LOCK_S:
            raise GroupRLError(f"DeepSpeed's op build would wait forever: {lock} is a build lock left {age / 60:.0f} "
                               f"min ago by a build that was killed. Fix: delete it (rm {lock}) if no build "
                               "of that op is running, and start again.")


class ZeRO(Strategy):
    """The DeepSpeed ZeRO-2/3 sharding strategy of a :class:`~grouprl.train.parallel.ranks.Ranks` (held by
    composition as ``ranks.sharding``; chosen by ``Ranks.zero_init`` when accelerate's environment asks for
    DeepSpeed and several processes run)."""

    sharded = False  # FSDP's flag: DeepSpeed's engine reduces the gradients itself

    def __init__(self, ranks: Any) -> None:
        self.ranks = ranks
        self.engine: Any = None  # set by zero_init()

    def shard(self, model: Any, reference: Any = None) -> bool:
        return False  # ZeRO partitions through its engine (zero_init), not fully_shard

    def zero_init(self, model: Any, optimizer: Any, cfg: Any) -> bool:
        """Wrap ``model`` and ``optimizer`` (already built) in a DeepSpeed ZeRO engine; returns whether it did."""
        import warnings

        check_build_locks()
        import deepspeed

        warnings.filterwarnings("ignore", category=FutureWarning,  # once per collective DeepSpeed calls
                                message=r"`torch\.distributed\.(reduce_scatter_tensor|all_gather_into_tensor)` is")
        device = next(model.parameters()).device
        bf16 = bool(cfg.bf16) and device.type == "cuda" and torch.cuda.is_bf16_supported()  # autocast_factory's rule
        config = engine_config(cfg, self.ranks.world, bf16_autocast=bf16)
        self.ranks.check()
        with self.ranks.failures():
            self.engine = deepspeed.initialize(model=model, optimizer=optimizer, config=config,
                                               dist_init_required=False)[0]
        if self.ranks.is_main:
            stage = config["zero_optimization"].get("stage")
            print(f"grouprl: DeepSpeed ZeRO-{stage} over {self.ranks.world} processes; gradients summed over ranks "
                  f"(each backward of {self.ranks.world} x the loss)", file=sys.stderr, flush=True)
        return True

    def full_weights(self, model: Any) -> Any:
        """A context in which ZeRO-3's partitioned parameters are whole on every rank."""
        self.ranks.check()
        return gathered(self.engine)

    def full_state_dict(self, model: Any) -> dict | None:
        """ZeRO-3: the full weights on rank 0 (``{}`` elsewhere; every rank calls it). ZeRO-2: ``None``
        (the parameters are whole on every rank)."""
        if getattr(self.engine.optimizer, "parameter_offload", None) is None:
            return None
        self.ranks.check()
        with self.ranks.failures(), gathered(self.engine):
            return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()} if self.ranks.is_main else {}

    def save_shards(self, output_dir: Any, step: int, model: Any, optimizer: Any) -> bool:
        """DeepSpeed: every rank writes its partitions into the checkpoint being written
        (``.tmp-checkpoint-<step>/deepspeed``, ``engine.save_checkpoint``); rank 0 then adds the rest."""
        import shutil

        from grouprl.train.checkpoint import layout as checkpoint

        tmp = checkpoint.tmp_checkpoint(output_dir, step)
        self.ranks.on_main(lambda: shutil.rmtree(tmp) if tmp.exists() else None)  # a leftover of a killed save
        self.ranks.check()
        with self.ranks.failures():
            self.engine.save_checkpoint(str(tmp / FOLDER), tag=TAG, client_state={"universal_checkpoint_info": {}})
        return True

    def load_zero(self, folder: Path) -> None:
        """Model and optimizer partitions from a DeepSpeed checkpoint written with the same ZeRO stage: on the
        same number of ranks as saved; ZeRO-2 also on another number, through DeepSpeed's universal checkpoint
        (converted once by rank 0, :func:`to_universal`). Anything else is refused with the fix."""
        if not folder.is_dir():
            no_plain_resume(folder.parent)
        saved, stage = checkpoint_ranks(folder), checkpoint_stage(folder)
        now = self.engine.zero_optimization_stage()
        if stage != now:
            refuse(folder, saved, stage, f"this run is configured for ZeRO-{now}")
        if saved != self.ranks.world and stage == 3:
            refuse(folder, saved, stage, f"a ZeRO-3 checkpoint resumes on as many ranks only, not {self.ranks.world}")
        tag = self.ranks.on_main(to_universal, folder) if saved != self.ranks.world else TAG  # ZeRO-2, N -> M ranks
        self.ranks.check()
        with self.ranks.failures():
            self.engine._config.load_universal_checkpoint = tag != TAG
            try:
                path, _ = self.engine.load_checkpoint(str(folder), tag=tag, load_optimizer_states=True,
                                                      load_lr_scheduler_states=False, load_module_strict=True)
            finally:
                self.engine._config.load_universal_checkpoint = False
        if path is None:
            raise ConfigError(f"DeepSpeed could not load its checkpoint from {folder} (tag {tag!r}).")


def load_without_engine(folder: Path) -> None:
    """A DeepSpeed checkpoint given to a run without DeepSpeed: refused with the fix."""
    if not folder.is_dir():
        no_plain_resume(folder.parent)
    refuse(folder, checkpoint_ranks(folder), checkpoint_stage(folder), "it resumes under DeepSpeed only")


def refuse(folder: Path, saved: int, stage: int, why: str) -> None:
    """A DeepSpeed checkpoint this run cannot resume: the error names how to resume it or take its weights."""
    raise ConfigError(f"{folder} is a DeepSpeed ZeRO-{stage} checkpoint written by {saved} ranks; {why}. Fix: resume "
                      f"with the accelerate config that wrote it (zero_stage: {stage}, e.g. "
                      f"examples/accelerate/zero{stage}.yaml) and --num_processes {saved}, or take its weights: "
                      f"python {folder / 'zero_to_fp32.py'} {folder} weights/ --tag {TAG} (then model_name_or_path="
                      f"weights/ with the checkpoint's config.json; the optimizer state is lost).")


def to_universal(folder: Path) -> str:
    """DeepSpeed's universal checkpoint of ``folder`` (``python -m deepspeed.checkpoint.ds_to_universal``),
    written once into ``folder/universal``; returns its tag. A ZeRO-2 engine loads it on any number of ranks
    (DeepSpeed 0.19.8 does not load one into ZeRO-3: it looks for per-rank ZeRO-3 model-state files)."""
    import shutil
    import subprocess

    out, tmp = folder / UNIVERSAL, folder / f".{UNIVERSAL}-tmp"
    if (out / "zero").is_dir():
        return UNIVERSAL
    shutil.rmtree(tmp, ignore_errors=True)
    cmd = [sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal", "--input_folder", str(folder / TAG),
           "--output_folder", str(tmp), "--num_extract_workers", "1", "--num_merge_workers", "1"]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    if run.returncode != 0:
        tail = (run.stderr or run.stdout).strip().splitlines()[-1:]
        refuse(folder, checkpoint_ranks(folder), 2, f"converting it to a universal checkpoint for another rank count "
                                                   f"failed ({' '.join(cmd[1:3])}: {tail})")
    tmp.rename(out)
    return UNIVERSAL


def no_plain_resume(path: Path) -> None:
    """A checkpoint saved without DeepSpeed cannot resume into ZeRO partitions (refused with the fix)."""
    raise ConfigError(f"{path} was saved without DeepSpeed; resuming it into a DeepSpeed ZeRO run is not supported. "
                      f"Fix: resume it with the launch that wrote it, or start a new run from its weights "
                      f"(model_name_or_path={path}).")

