"""Model, tokenizer, device and precision: everything that touches weights before the loop starts."""

from __future__ import annotations

import contextlib
import copy
import logging
from pathlib import Path
from typing import Any

import torch

from grouprl.errors import ConfigError
from grouprl.train.engine.precision import autocast_factory as autocast_factory  # re-exported: loop, dpo, ppo
from grouprl.train.engine.precision import bf16_autocast_device

log = logging.getLogger("grouprl")


def upcast_trainable(model: Any) -> torch.dtype | None:
    """Cast trainable half-precision parameters to fp32 (fp32 master weights); returns the old dtype or None.

    AdamW on bf16 weights rounds every update below ~0.4% of the weight away (bf16 has 8 mantissa bits), so
    a model passed in as an object in bf16 / fp16 would silently not learn at typical learning rates. The
    compute dtype is then chosen by ``bf16`` (autocast), as for a model loaded by name. Frozen parameters
    (a LoRA base) keep their dtype.
    """
    half = [p for p in model.parameters() if p.requires_grad and p.dtype in (torch.bfloat16, torch.float16)]
    if not half:
        return None
    dtype = half[0].dtype
    for p in half:
        p.data = p.data.float()
    log.warning("grouprl: %d trainable parameter tensors were %s; upcast to float32 (fp32 master weights, "
                "compute in bf16 under autocast when bf16=true on a GPU or a bf16 CPU). Load with dtype=torch.float32 to "
                "skip this.", len(half), str(dtype).replace("torch.", ""))
    return dtype


def is_peft(model: Any) -> bool:
    return hasattr(model, "disable_adapter") and hasattr(model, "peft_config")


def apply_peft(model: Any, cfg: Any, peft_config: Any = None):
    """Wrap in a LoRA adapter when ``use_peft`` (or a ``peft_config`` is given); else unchanged."""
    if not (cfg.use_peft or peft_config is not None) or is_peft(model):
        return model
    from peft import LoraConfig, get_peft_model

    if peft_config is None:
        peft_config = LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                                 target_modules=cfg.lora_target_modules, task_type="CAUSAL_LM")
    try:
        return get_peft_model(model, peft_config)
    except ValueError as e:  # peft: "Target modules {...} not found in the base model"
        if "not found" not in str(e) and "target" not in str(e).lower():
            raise
        names = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)})
        raise ConfigError(f"lora_target_modules={peft_config.target_modules!r} matches no module of this model. "
                          f"Fix: use all-linear or names among its linear layers: {', '.join(names)}.") from None


def reference_dtype(name: str, device: torch.device, bf16: bool = False) -> torch.dtype:
    """``ref_dtype`` -> a torch dtype. ``auto`` follows the compute dtype: bfloat16 when bf16 autocast is in
    effect (``bf16`` on a CUDA device with bf16 support, or on a CPU with AVX512-BF16 / AMX-BF16:
    :func:`grouprl.train.engine.precision.bf16_autocast_device`; the reference's matmuls would run in bf16 anyway,
    and bf16 storage skips the per-call weight casts), else float32. With ``bf16: false`` a CPU keeps an
    fp32 reference: bf16 storage is faster there (benchmarks/bf16_cpu.py) but moves the log-probs by up to
    ~1e-2, so the KL of the first step is no longer exactly 0; ask for it by name."""
    if name == "auto":
        return torch.bfloat16 if bf16_autocast_device(bf16, device) else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[name]


class Reference:
    """pi_ref for the KL term. With PEFT it is the same weights with the adapter disabled (no copy).

    For full fine-tuning it is a frozen copy stored in ``dtype`` (``ref_dtype``: a bf16 copy takes half the
    memory of an fp32 one); its log-probs are returned in fp32 whatever the dtype (``train.engine.step``).
    """

    def __init__(self, model: Any, dtype: str = "float32", *, bf16: bool = False) -> None:
        self.shared = is_peft(model)
        if self.shared:
            self.model = model
        else:
            self.model = _frozen_copy(model)
            want = reference_dtype(dtype, next(model.parameters()).device, bf16)
            if any(p.is_floating_point() and p.dtype != want for p in self.model.parameters()):
                self.model.to(want)

    def context(self):
        return self.model.disable_adapter() if self.shared else contextlib.nullcontext()


def _frozen_copy(model: Any):
    ref = copy.deepcopy(model)
    ref.eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref


def build_optimizer(model: Any, cfg: Any, total_steps: int):
    """AdamW over trainable parameters; linear warm-up then cosine / linear decay / constant."""
    from transformers import get_scheduler

    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ConfigError("the model has no trainable parameters (all requires_grad=False).")
    hp = dict(lr=cfg.learning_rate, betas=(cfg.adam_beta1, cfg.adam_beta2), eps=cfg.adam_epsilon,
              weight_decay=cfg.weight_decay)
    try:  # one fused kernel instead of a loop over tensors: same update (test_perf_fused_adamw)
        optimizer = torch.optim.AdamW(params, fused=True, **hp)
    except RuntimeError:  # devices / dtypes without a fused kernel (e.g. mps)
        optimizer = torch.optim.AdamW(params, **hp)
    warmup = cfg.warmup_steps if cfg.warmup_steps > 0 else int(round(cfg.warmup_ratio * total_steps))
    name = {"constant": "constant_with_warmup"}.get(cfg.lr_scheduler_type, cfg.lr_scheduler_type)
    scheduler = get_scheduler(name, optimizer, num_warmup_steps=warmup, num_training_steps=total_steps)
    return optimizer, scheduler


def apply_torch_threads(cfg: Any) -> int | None:
    """``torch.set_num_threads(cfg.torch_num_threads)`` when set (call before the model loads); returns it."""
    if cfg.torch_num_threads is None:
        return None
    torch.set_num_threads(cfg.torch_num_threads)
    return cfg.torch_num_threads


def enable_checkpointing(model: Any) -> None:
    """Recompute activations in backward; non-reentrant, so frozen inputs (LoRA) need no extra hooks."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x name
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def save_final(model: Any, tokenizer: Any, path: Any, state_dict: dict | None = None):
    """The trained model in plain HF format. A LoRA run is saved merged (loads in transformers and vLLM
    without peft) with the adapter itself in ``<path>/adapter``. ``state_dict``: the full weights of a
    sharded (FSDP) model, gathered on rank 0 (``grouprl.train.parallel.fsdp.gather_state_dict``)."""

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    if is_peft(model):
        model.save_pretrained(path / "adapter")
        copy.deepcopy(model).merge_and_unload().save_pretrained(path)
    else:
        from grouprl.train.parallel.fsdp import is_sharded, save_full

        if state_dict is not None or is_sharded(model):
            save_full(model, path, state_dict)
        else:
            model.save_pretrained(path)
    if tokenizer is not None:
        tokenizer.save_pretrained(path)
    return path
