"""The short supervised fine-tuning of the built-in warm starts (:mod:`grouprl.builtin.warmstart`): token ids
with a loss mask on the completion, right-padded batches, and AdamW with a warm-up and cosine decay that can
stop at a quality gate. Hand-written because it is ~60 lines where a ``transformers.Trainer`` would bring
its own data collation, logging and checkpointing into a build that must be bit-reproducible and quiet."""

from __future__ import annotations

import contextlib
import sys
import time
from typing import Any


def encode(tok, examples: list[tuple[str, str]]) -> list[tuple[list[int], list[int]]]:
    """Token ids of prompt + completion + EOS, and the loss mask (1 on the completion and its EOS)."""
    out = []
    for prompt, completion in examples:
        p = tok(prompt, add_special_tokens=False)["input_ids"]
        c = tok(completion, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        out.append((p + c, [0] * len(p) + [1] * len(c)))
    return out


def batch(encoded, idx, pad_id):
    """Right-padded input ids, attention mask and labels (-100 where the loss mask is 0)."""
    import torch

    width = max(len(encoded[i][0]) for i in idx)
    ids = torch.full((len(idx), width), pad_id, dtype=torch.long)
    labels = torch.full((len(idx), width), -100, dtype=torch.long)
    attn = torch.zeros((len(idx), width), dtype=torch.long)
    for r, i in enumerate(idx):
        seq, mask = encoded[i]
        ids[r, : len(seq)] = torch.tensor(seq)
        attn[r, : len(seq)] = 1
        labels[r, : len(seq)] = torch.where(torch.tensor(mask, dtype=torch.bool), torch.tensor(seq), -100)
    return ids, attn, labels


def plateaued(checks: list[list[float]], spec: Any) -> bool:
    """The restart rule of a gated SFT: the last ``[step, score]`` check is the one at ``spec.gate_restart_after``
    and its score is still below ``spec.gate_restart_below`` (the copy is learned in a sudden transition, so a
    score that has not left ~0 by then marks a plateau, not a slow climb). ``gate_restart_after`` 0: never."""
    return bool(spec.gate_restart_after and checks and checks[-1][0] == spec.gate_restart_after
                and checks[-1][1] < spec.gate_restart_below)


def sft(model, encoded, spec: Any, *, pad_id: int, gate=None) -> tuple[list[float], list[list[float]]]:
    """AdamW on the completion tokens, linear warm-up then cosine decay; returns the loss per step and the
    ``[step, score]`` of each gate check (``gate``: ``score(model)``, stop once ``>= spec.copy_gate``, or
    once :func:`plateaued`: the caller then restarts from a new initialisation)."""
    import math

    import torch

    torch.manual_seed(spec.seed)
    gen = torch.Generator().manual_seed(spec.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=spec.lr, weight_decay=0.0, betas=(0.9, 0.98))

    def lr_at(step: int) -> float:
        if step < spec.warmup_steps:
            return (step + 1) / spec.warmup_steps
        frac = (step - spec.warmup_steps) / max(1, spec.sft_steps - spec.warmup_steps)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    model.train()
    order: list[int] = []
    losses, checks = [], []
    start, every = time.perf_counter(), max(1, spec.sft_steps // 10)
    for step in range(spec.sft_steps):
        if gate is not None and step and step % spec.gate_every == 0:
            checks.append([step, round(gate(model), 4)])
            print(f"grouprl:   SFT step {step} (cap {spec.sft_steps}), loss {losses[-1]:.3f}, copy gate "
                  f"{checks[-1][1]:.2f} (stops at {spec.copy_gate:.2f}), {time.perf_counter() - start:.0f} s",
                  file=sys.stderr, flush=True)
            if checks[-1][1] >= spec.copy_gate or plateaued(checks, spec):
                return losses, checks
        elif gate is None and step and step % every == 0:  # the build takes minutes on a CPU: say how far it is
            left = (time.perf_counter() - start) / step * (spec.sft_steps - step)
            print(f"grouprl:   SFT step {step}/{spec.sft_steps}, loss {losses[-1]:.3f}, about {left:.0f} s left",
                  file=sys.stderr, flush=True)
        if len(order) < spec.batch_size:
            order += torch.randperm(len(encoded), generator=gen).tolist()
        idx, order = order[: spec.batch_size], order[spec.batch_size :]
        ids, attn, labels = batch(encoded, idx, pad_id)
        loss = model(input_ids=ids, attention_mask=attn, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
    if gate is not None:
        checks.append([spec.sft_steps, round(gate(model), 4)])
        if checks[-1][1] < spec.copy_gate:
            print(f"grouprl: warning: the warm start reached its cap of {spec.sft_steps} SFT steps with copy gate "
                  f"{checks[-1][1]:.2f} < {spec.copy_gate:.2f}; RL may have little signal (raise sft_steps)",
                  file=sys.stderr, flush=True)
    return losses, checks


@contextlib.contextmanager
def deterministic_torch(threads: int):
    """Fixed thread count and deterministic kernels for the duration of the block, then restored."""
    import torch

    old_threads, old_det = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.set_num_threads(old_threads)
        torch.use_deterministic_algorithms(old_det)
