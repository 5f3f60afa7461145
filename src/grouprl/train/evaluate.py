"""Held-out evaluation: accuracy = mean of the eval reward on the eval split, plus pass@k when sampling."""

from __future__ import annotations

import math
from typing import Any

from grouprl.data.load import render_prompt, reward_columns
from grouprl.rollout.base import SamplingParams
from grouprl.train.score import RewardScorer


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct (Chen et al. 2021, arXiv 2107.03374, Eq. 1):
    1 - C(n-c, k) / C(n, k)."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples per prompt, got {n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def evaluate(backend: Any, tokenizer: Any, rows: list[dict], reward_fn: Any, *, prompt_column: str,
             system_prompt: str | None, max_new_tokens: int, max_prompt_length: int | None,
             temperature: float = 0.0, num_samples: int = 1, top_p: float = 1.0, batch_size: int = 32,
             threshold: float = 1.0, ks: tuple[int, ...] = (1,)) -> dict[str, Any]:
    """Decode ``num_samples`` completions per row (greedy when temperature == 0) and score them.

    A completion counts as correct for pass@k when its reward >= ``threshold``; ``None`` rewards (no
    opinion) are left out of the accuracy mean and of pass@k (a prompt counts for pass@k when at least k of
    its samples were scored). Returns accuracy, pass@k for each k <= num_samples,
    mean completion length and the number of scored samples.
    """
    scorer = RewardScorer([reward_fn])
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                            max_prompt_length=max_prompt_length)
    values: list[float] = []
    per_prompt_correct: list[int] = []
    lengths: list[int] = []
    samples: list[dict] = []
    for start in range(0, len(rows), batch_size):
        chunk = rows[start:start + batch_size]
        texts = [render_prompt(r[prompt_column], tokenizer, system_prompt) for r in chunk]
        out = backend.generate(texts, num_samples, params)
        expanded = [r for r in chunk for _ in range(num_samples)]
        columns = reward_columns(expanded, prompt_column)
        prompts = [r[prompt_column] for r in expanded]
        completions = completions_for_rewards(out.completions, prompts)
        totals, _ = scorer.score(prompts, completions, columns)
        lengths.extend(out.completion_mask.sum(dim=1).tolist())
        for i in range(len(chunk)):
            group = totals[i * num_samples:(i + 1) * num_samples]
            values.extend(v for v in group if not math.isnan(v))
            scored = [v for v in group if not math.isnan(v)]
            per_prompt_correct.append((len(scored), sum(1 for v in scored if v >= threshold)))
        if len(samples) < 4:
            samples.append({"prompt": texts[0], "completion": out.completions[0], "reward": totals[0]})
    result: dict[str, Any] = {
        "accuracy": sum(values) / len(values) if values else float("nan"),
        "num_scored": len(values),
        "num_prompts": len(rows),
        "completion_length": sum(lengths) / len(lengths) if lengths else 0.0,
        "samples": samples,
    }
    for k in ks:  # like accuracy, "no opinion" samples are left out: pass@k over each prompt's scored samples
        if k <= num_samples:
            judged = [pass_at_k(n, c, k) for n, c in per_prompt_correct if n >= k]
            result[f"pass@{k}"] = sum(judged) / len(judged) if judged else float("nan")
    return result


def completions_for_rewards(texts: list[str], prompts: list[Any]) -> list[Any]:
    """TRL's convention: chat prompts get chat completions ``[{"role": "assistant", "content": ...}]``."""
    return [[{"role": "assistant", "content": t}] if isinstance(p, list) else t for t, p in zip(texts, prompts)]
