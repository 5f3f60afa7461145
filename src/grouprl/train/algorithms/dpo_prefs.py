"""``builtin:arithmetic_prefs``: preference pairs drawn from the policy's own samples, built once and cached.

For a fair comparison with GRPO the pairs use nothing GRPO does not have: the same starting model, the same
``arithmetic`` training prompts, the same reward. For each of ``n`` training prompts the model samples
``samples_per_prompt`` completions (temperature ``temperature``, the recipe's max_new_tokens, top_p, top_k),
the recipe's ``reward_funcs`` score them, and :func:`grouprl.data.prefs.pairs_from_samples` pairs a correct
one (total reward >= ``threshold``) with a wrong one. Completions cut at max_new_tokens (no EOS) are left
out: their text, re-tokenised with an EOS, would be a different sequence from the one the model sampled.

Settings come from ``dataset_kwargs`` (``n``: 1000 prompts, ``samples_per_prompt``: 8, ``temperature``:
1.0, ``pairs_per_prompt``: 1, ``threshold``: 1.0, ``batch``: 64 prompts per generate call, and the
``arithmetic`` task's own keywords such as ``max_value``). The cache key hashes these, the recipe's
sampling and reward settings, the seed and the model's weights; the metadata (``meta.json`` next to the
pairs, and ``prefs_meta.json`` in the run's output_dir) records the sample budget: how many completions
were drawn to make the pairs.
"""

from __future__ import annotations

import hashlib
import math
import sys
import time
from typing import Any

import torch

from grouprl.data.load import render_prompt, reward_columns
from grouprl.data.prefs import (
    builtin_prefs_split,
    cache_dir_for,
    load_cached,
    pairs_from_samples,
    save_cached,
    split_kwargs,
)
from grouprl.data.tasks import load_task
from grouprl.errors import DataError
from grouprl.rollout import SamplingParams, make_backend
from grouprl.train.evaluate import completions_for_rewards
from grouprl.train.score import RewardScorer, resolve_reward_funcs


def weights_digest(model: Any) -> str:
    """SHA-256 (16 hex digits) of the model's parameters: the cache key of the model the samples came from."""
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def eval_rows(cfg: Any) -> Any:
    """The held-out ``arithmetic`` split that the GRPO recipes evaluate on (max_eval_samples applied)."""
    if cfg.eval_split is None:
        return None
    rows = builtin_prefs_split("arithmetic_prefs", cfg.eval_split, **cfg.dataset_kwargs)
    if cfg.max_eval_samples is not None:
        rows = rows.select(range(min(cfg.max_eval_samples, len(rows))))
    return rows


def arithmetic_prefs(cfg: Any, model: Any, tokenizer: Any, *, cache_dir: Any = None) -> tuple[list[dict], dict]:
    """``(pairs, metadata)`` of builtin:arithmetic_prefs for ``model``: from the cache when built before."""
    build, task = split_kwargs(cfg.dataset_kwargs)
    settings = {"name": "arithmetic_prefs", **build, "task_kwargs": task, "seed": cfg.seed,
                "model": weights_digest(model), "max_new_tokens": cfg.max_new_tokens,
                "max_prompt_length": cfg.max_prompt_length, "top_p": cfg.top_p, "top_k": cfg.top_k,
                "system_prompt": cfg.system_prompt,
                "apply_chat_template": cfg.apply_chat_template, "reward_funcs": [str(f) for f in cfg.reward_funcs],
                "reward_kwargs": cfg.reward_kwargs, "reward_weights": cfg.reward_weights,
                "rollout_backend": cfg.rollout_backend, "lean_sampler": cfg.lean_sampler}
    path = cache_dir_for("arithmetic_prefs", settings, cache_dir)
    cached = load_cached(path)
    if cached is not None:
        return cached
    print(f"grouprl: building builtin:arithmetic_prefs ({build['n']} prompts x {build['samples_per_prompt']} "
          f"samples, once; cached in {path})", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    rows = [dict(r) for r in load_task("arithmetic", "train", n=build["n"], **task)]
    samples, rewards = sample_and_score(cfg, model, tokenizer, rows, build)
    pairs = pairs_from_samples(rows, samples, rewards, seed=cfg.seed, threshold=build["threshold"],
                               pairs_per_prompt=int(build["pairs_per_prompt"]))
    if not pairs:
        raise DataError(f"builtin:arithmetic_prefs: no pair from {len(rows)} prompts x {build['samples_per_prompt']} "
                        f"samples: on every prompt the samples were all right, all wrong or cut at max_new_tokens="
                        f"{cfg.max_new_tokens}. Fix: raise dataset_kwargs.samples_per_prompt or temperature, or "
                        f"max_new_tokens, or start from a model that gets some answers right.")
    flat = [r for group in rewards for r in group]
    scored = [r for r in flat if not math.isnan(r)]
    meta = {"settings": settings, "num_prompts": len(rows), "samples_drawn": len(flat),
            "samples_truncated": len(flat) - len(scored),
            "sample_accuracy": sum(r >= build["threshold"] for r in scored) / max(1, len(scored)),
            "num_pairs": len(pairs), "prompts_with_pairs": len({p["prompt"] for p in pairs}),
            "build_seconds": round(time.perf_counter() - t0, 1), "torch": torch.__version__}
    save_cached(path, pairs, meta)
    return pairs, meta


def sample_and_score(cfg: Any, model: Any, tokenizer: Any, rows: list[dict],
                     build: dict[str, Any]) -> tuple[list[list[str]], list[list[float]]]:
    """``samples_per_prompt`` completions of each row and their total rewards (NaN: unknown or truncated).
    Sampling is seeded with ``cfg.seed`` in a forked RNG, so the same settings give the same samples."""
    k = int(build["samples_per_prompt"])
    backend = make_backend(cfg.rollout_backend, model, tokenizer, lean_sampler=cfg.lean_sampler)
    params = SamplingParams(cfg.max_new_tokens, float(build["temperature"]), cfg.top_p, cfg.top_k,
                            cfg.max_prompt_length)
    scorer = RewardScorer(resolve_reward_funcs(cfg.reward_funcs, cfg.reward_kwargs), cfg.reward_weights)
    device = next(model.parameters()).device
    samples: list[list[str]] = []
    rewards: list[list[float]] = []
    was_training = model.training
    model.eval()
    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), torch.no_grad():
            torch.manual_seed(cfg.seed)
            for start in range(0, len(rows), int(build["batch"])):
                chunk = rows[start:start + int(build["batch"])]
                out = backend.generate([render_prompt(r["prompt"], tokenizer, cfg.system_prompt, cfg.apply_chat_template) for r in chunk],
                                       k, params)
                expanded = [r for r in chunk for _ in range(k)]
                prompts = [r["prompt"] for r in expanded]
                totals, _ = scorer.score(prompts, completions_for_rewards(out.completions, prompts),
                                         reward_columns(expanded), completion_ids=out.token_lists())
                cut = out.truncated.tolist()
                totals = [math.nan if c else float(t) for t, c in zip(totals, cut)]
                for i in range(len(chunk)):
                    samples.append(out.completions[i * k:(i + 1) * k])
                    rewards.append(totals[i * k:(i + 1) * k])
    finally:
        model.train(was_training)
    return samples, rewards
