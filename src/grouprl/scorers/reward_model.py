"""The torch side of the ``reward_model`` reward: load once, score in batches, normalise with running stats."""

from __future__ import annotations

import math
import threading
from typing import Any

import torch

from grouprl.errors import ConfigError
from grouprl.rewards.adapters import completion_text

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

_SCORERS: dict[tuple, RewardModelScorer] = {}
_LOCK = threading.Lock()


class RunningStats:
    """Running mean and (population) standard deviation by Welford's update."""

    def __init__(self) -> None:
        self.count, self.mean, self._m2 = 0, 0.0, 0.0

    def update(self, values: list[float]) -> None:
        for x in values:
            self.count += 1
            delta = x - self.mean
            self.mean += delta / self.count
            self._m2 += delta * (x - self.mean)

    @property
    def std(self) -> float:
        return math.sqrt(self._m2 / self.count) if self.count else 0.0


class RewardModelScorer:
    """A sequence-classification model and its tokenizer, on their own device and dtype."""

    def __init__(self, model: Any, tokenizer: Any, *, batch_size: int = 8, max_length: int = 1024,
                 label_index: int | None = None) -> None:
        num_labels = int(getattr(model.config, "num_labels", 1))
        if num_labels != 1 and label_index is None:
            raise ConfigError(f"reward_model: the model has num_labels={num_labels}; give label_index (which "
                              f"logit is the reward) or use a model with a single-logit head.")
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        if model.config.pad_token_id is None:
            model.config.pad_token_id = tokenizer.pad_token_id
        self.model, self.tokenizer = model.eval(), tokenizer
        self.batch_size, self.max_length = int(batch_size), int(max_length)
        self.label_index = 0 if label_index is None else int(label_index)
        self.stats = RunningStats()

    def text(self, prompt: Any, completion: Any) -> str:
        """``prompt + completion`` as the model was trained to read it (its chat template, if any)."""
        answer = completion_text(completion)
        messages = list(prompt) if isinstance(prompt, (list, tuple)) else [{"role": "user", "content": str(prompt or "")}]
        if getattr(self.tokenizer, "chat_template", None):
            return self.tokenizer.apply_chat_template(messages + [{"role": "assistant", "content": answer}],
                                                      tokenize=False)
        return "".join(str(m.get("content", "")) for m in messages) + answer

    @torch.no_grad()
    def score(self, prompts: list[Any], completions: list[Any]) -> list[float]:
        """Raw scores, ``batch_size`` sequences per forward pass."""
        texts = [self.text(p, c) for p, c in zip(prompts, completions)]
        device = next(self.model.parameters()).device
        out: list[float] = []
        for start in range(0, len(texts), self.batch_size):
            enc = self.tokenizer(texts[start:start + self.batch_size], return_tensors="pt", padding=True,
                                 truncation=True, max_length=self.max_length, add_special_tokens=False)
            logits = self.model(**{k: v.to(device) for k, v in enc.items()}).logits
            out.extend(logits[:, self.label_index].float().tolist())
        return out

    def reward(self, prompts: list[Any], completions: list[Any], *, normalize: bool = False,
               clip: float | None = None) -> list[float]:
        values = self.score(prompts, completions)
        if normalize:
            self.stats.update(values)
            std = self.stats.std if self.stats.std > 1e-8 else 1.0
            values = [(v - self.stats.mean) / std for v in values]
        if clip is not None:
            values = [min(float(clip), max(-float(clip), v)) for v in values]
        return values


def load_scorer(path: str, *, device: str = "cpu", dtype: str = "float32", **kw: Any) -> RewardModelScorer:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    if not path:
        raise ConfigError("reward_model: `path` is required: a directory (or hub id) holding a sequence-"
                          "classification model, e.g. reward_kwargs: {reward_model: {path: runs/rm}}.")
    if dtype not in DTYPES:
        raise ConfigError(f"reward_model: dtype={dtype!r}; use one of {', '.join(DTYPES)}.")
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForSequenceClassification.from_pretrained(path, dtype=DTYPES[dtype])
    except OSError as e:
        raise ConfigError(f"reward_model: cannot load {path!r} ({e}). Give a directory holding config.json, "
                          f"the weights and the tokenizer files.") from e
    tokenizer.padding_side = "right"
    return RewardModelScorer(model.to(torch.device(device)), tokenizer, **kw)


def get_scorer(path: str | None, **kw: Any) -> RewardModelScorer:
    """One scorer (and one set of running statistics) per distinct ``(path, options)``, loaded once."""
    key = (path, *sorted(kw.items()))
    with _LOCK:
        if key not in _SCORERS:
            _SCORERS[key] = load_scorer(path or "", **kw)
        return _SCORERS[key]
