"""Shared pieces of the DPO tests (imported by name, and by recipes as ``dpo_helpers:...``)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

PAIRS = [{"prompt": f"What is {i} + 1?", "chosen": f"Answer: {i + 1}", "rejected": f"Answer: {i + 2}"}
         for i in range(8)]
HELD_OUT = [{"prompt": f"What is {i} + 2?", "answer": str(i + 2)} for i in range(3)]


def write_pairs(folder: Path, pairs=PAIRS, held_out=HELD_OUT) -> Path:
    """A dataset folder with ``train.jsonl`` (pairs) and ``test.jsonl`` (held-out prompts with answers)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in pairs))
    (folder / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in held_out))
    return folder


def dpo_config(tmp_path, **overrides):
    from grouprl import GRPOConfig

    base = dict(algorithm="dpo", output_dir=str(tmp_path / "out"), per_device_train_batch_size=2,
                gradient_accumulation_steps=2, max_new_tokens=8, max_prompt_length=32, max_steps=3,
                learning_rate=1e-3, progress_bar=False, save_strategy="no", seed=0, eval_split=None,
                lr_scheduler_type="constant")
    return GRPOConfig(**{**base, **overrides})


WARM = dict(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, vocab_size=300, sft_rows=256,
            sft_steps=150, batch_size=16, lr=5e-3)
"""A tiny arithmetic warm start (~20 s to build): it ends its answers and gets a few right, so its own
samples make some pairs under the accuracy reward."""


def load_tiny(path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32), AutoTokenizer.from_pretrained(str(path))


class ForwardCounter:
    """Wraps the decoder's ``forward`` (``model.model``): counts calls made without gradient (reference /
    evaluation) and with it. Not ``model.forward``: an instance-level forward on the model makes the log-prob
    passes take the logits path instead of the chunked LM head (``step.lm_head_parts``), so the counted run
    would compute other (rounding-different) numbers than the uncounted one."""

    def __init__(self, model):
        self.no_grad = self.grad = 0
        model = getattr(model, "model", model)
        inner = model.forward

        def forward(*args, **kwargs):
            if torch.is_grad_enabled():
                self.grad += 1
            else:
                self.no_grad += 1
            return inner(*args, **kwargs)

        model.forward = forward


class OracleBackend:
    """A sampler that knows each arithmetic answer: sample j of a prompt is ``Answer: <right>`` or
    ``Answer: <right + 1 + j>`` by a coin from torch's RNG (so the builder's seeding decides the samples);
    prompts with "Kim" are always right (no pair), the last sample of prompts with "Leo" is cut off."""

    def __init__(self, model, tokenizer, **kwargs):
        from grouprl.data.tasks import generate_rows

        self.tok = tokenizer
        self.answers = {r["prompt"]: int(r["answer"]) for r in generate_rows("arithmetic", "train", n=40)}

    def sync_weights(self, model):
        pass

    def generate(self, prompts, n, params):
        from grouprl.rollout.base import Rollout

        texts, cut = [], []
        for p in prompts:
            right = self.answers[p]
            for j in range(n):
                wrong = "Kim" not in p and bool(torch.randint(0, 2, ()).item())
                texts.append(f"Answer: {right + 1 + j if wrong else right}")
                cut.append("Leo" in p and j == n - 1)
        ids = [self.tok(t, add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id] for t in texts]
        T = max(map(len, ids))
        cids = torch.tensor([x + [0] * (T - len(x)) for x in ids])
        cmask = torch.tensor([[1] * len(x) + [0] * (T - len(x)) for x in ids])
        pids = torch.zeros((len(texts), 1), dtype=torch.long)
        return Rollout(pids, torch.ones_like(pids), cids, cmask, torch.tensor(cut), texts,
                       [p for p in prompts for _ in range(n)])
