"""``bf16: true``: where bf16 autocast runs, and what it covers.

bf16 mixed precision (Micikevicius et al., arXiv 1710.03740; bf16: Kalamkar et al., arXiv 1905.12322) keeps
fp32 master weights, optimizer state and gradients, runs the matmuls in bf16 under ``torch.autocast``,
and keeps the log-softmax, log-probs, advantages and loss in fp32 (``train.engine.step`` / ``algo.lmhead``).

Where it runs:

- a CUDA device with bf16 support: autocast for every model pass, generation included;
- a CPU with native bf16 matmul instructions (x86 AVX512-BF16 or AMX-BF16, :func:`cpu_has_fast_bf16`):
  autocast for the training pass, the old-log-prob pass and the reference pass, **not for generation**
  (``generation``): autocast would switch off the lean sampler (``rollout/lean.py``) for ``model.generate``,
  whose decode steps autocast casts op by op (0.56x-1.32x of fp32 ``generate`` from hidden 64 to 512);
  the sampler instead decodes from a bf16 copy of the weights (``rollout_dtype: auto``,
  :func:`resolve_rollout_dtype`): 2.3-2.7x less CPU than TRL's autocast ``generate`` for the same tokens
  at the small / medium benchmark sizes;
- anywhere else (a CPU without those instructions, where bf16 is emulated and slower than fp32; MPS; an
  old GPU): fp32, with one warning.

Measured on an AVX512-BF16 CPU without AMX, one thread (benchmarks/README.md, "bf16 on both sides"): the
policy forward+backward 1.59x faster at hidden 256 / 512 (4M / 25M parameters), 1.26x at hidden 128, and
0.61x -- slower, the casts cost more than the matmuls save -- at hidden 64; log-probs within ~1e-2 of fp32.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from pathlib import Path
from typing import Any

import torch

from grouprl.config.algorithms import supports_of

__all__ = ["BF16_CPU_FLAGS", "Autocast", "autocast_factory", "cpu_flags", "cpu_has_fast_bf16",
           "generation_context", "resolve_rollout_dtype"]

# /proc/cpuinfo flags of x86 CPUs that execute bf16 dot products natively (oneDNN's bf16 kernels use them).
# Without them PyTorch still runs bf16 on AVX512 by converting to fp32, which is slower than plain fp32.
BF16_CPU_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


def cpu_flags(path: str | Path = "/proc/cpuinfo") -> frozenset[str]:
    """The feature flags of the first CPU in ``path`` (Linux ``/proc/cpuinfo``); empty when unreadable."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


@functools.cache
def cpu_has_fast_bf16() -> bool:
    """Whether this machine's CPU runs bf16 matmuls natively (AVX512-BF16 or AMX-BF16) and torch's oneDNN
    backend, which uses them, is available. Other CPUs (including ARM, not measured here) answer False."""
    mkldnn = getattr(torch.backends, "mkldnn", None)
    if mkldnn is None or not mkldnn.is_available():
        return False
    return bool(BF16_CPU_FLAGS & cpu_flags())


class Autocast:
    """A zero-argument context factory: ``autocast()`` -> bf16 autocast on ``device_type``;
    ``autocast.generation()`` -> the same on CUDA, no autocast on a CPU (the lean sampler, fp32 or on its own
    bf16 weight copy, instead of ``model.generate`` under autocast: see the module docstring)."""

    def __init__(self, device_type: str, *, for_generation: bool) -> None:
        self.device_type, self.for_generation = device_type, for_generation

    def __call__(self):
        return torch.autocast(self.device_type, dtype=torch.bfloat16)

    def generation(self):
        return self() if self.for_generation else contextlib.nullcontext()

    def __repr__(self) -> str:
        return f"Autocast({self.device_type!r}, bfloat16, for_generation={self.for_generation})"


def generation_context(autocast: Any):
    """The context for sampling with the policy: ``autocast.generation()`` when the factory has one
    (:class:`Autocast`), else ``autocast()`` (any zero-argument context factory)."""
    generation = getattr(autocast, "generation", None)
    return generation() if generation is not None else autocast()


def bf16_autocast_device(bf16: bool, device: torch.device) -> str | None:
    """The device type bf16 autocast runs on for this run (``cuda`` / ``cpu``), or None (fp32)."""
    if not bf16:
        return None
    if device.type == "cuda" and torch.cuda.is_available() and torch.cuda.is_bf16_supported():
        return "cuda"
    if device.type == "cpu" and cpu_has_fast_bf16():
        return "cpu"
    return None


def autocast_factory(bf16: bool, device: torch.device):
    """A zero-argument context factory: bf16 autocast where ``bf16`` and the device supports it (see the
    module docstring), else ``contextlib.nullcontext``. Asking for bf16 where it is not supported (a CPU
    without AVX512-BF16 / AMX, MPS, an old GPU) trains in fp32 and warns once."""
    if not bf16:
        return contextlib.nullcontext
    kind = bf16_autocast_device(bf16, device)
    if kind is not None:
        return Autocast(kind, for_generation=kind == "cuda")
    what = "a CPU without AVX512-BF16 or AMX-BF16" if device.type == "cpu" else f"device '{device.type}'"
    warnings.warn(f"bf16=True but {what} has no fast bf16 support: training in fp32 instead. Fix: bf16: false "
                  f"to silence this.", stacklevel=2)
    return contextlib.nullcontext


def resolve_rollout_dtype(cfg: Any, model: Any) -> str:
    """``rollout_dtype`` as the sampler should run it: a name is kept; ``auto`` -> ``bfloat16`` where bf16
    autocast runs on a CPU (``bf16: true``, :func:`cpu_has_fast_bf16`) and the lean sampler can take a bf16
    copy of ``model`` (transformers backend, ``lean_sampler`` not false, a GRPO-family algorithm, no tools or
    environment, a Llama / Qwen2 layout without LoRA); ``float32`` otherwise (on CUDA generation runs under
    autocast instead)."""
    name = getattr(cfg, "rollout_dtype", "auto")
    if name != "auto":
        return name
    device = next(model.parameters()).device
    if bf16_autocast_device(bool(getattr(cfg, "bf16", False)), device) != "cpu":
        return "float32"
    agent = bool(getattr(cfg, "tools", None) or getattr(cfg, "environment", None))
    if (cfg.rollout_backend != "transformers" or cfg.lean_sampler is False or agent
            or not supports_of(cfg.algorithm).lean_bf16_rollout):
        return "float32"
    from grouprl.rollout.lean import unsupported_reason

    return "bfloat16" if unsupported_reason(model, torch.bfloat16) is None else "float32"
