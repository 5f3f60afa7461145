"""Held-out evaluation: accuracy = mean of the eval reward on the eval split, plus pass@k when sampling.

``evaluate_model`` is the one path of the in-training evaluation, ``GRPOTrainer.evaluate`` and
``grouprl eval``: same decoding plan, same ``top_p``, same autocast, and sampling seeded with ``cfg.seed``
(in a forked RNG, so training's random stream is untouched), so a logged ``eval/accuracy`` is reproduced
by ``grouprl eval`` on the saved model.
"""

from __future__ import annotations

import math
from typing import Any

from grouprl.data.load import render_prompt, reward_columns
from grouprl.rollout.base import SamplingParams
from grouprl.train.agent import agent_metrics, agent_rollout, build_agent, reward_inputs, trajectory_record
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
             threshold: float = 1.0, ks: tuple[int, ...] = (1,), agent: Any = None,
             model: Any = None, chat_template: str = "auto") -> dict[str, Any]:
    """Decode ``num_samples`` completions per row (greedy when temperature == 0) and score them.

    With ``agent`` (``grouprl.train.agent.Agent``) the rollouts are multi-turn on ``model``, as in training:
    the reward sees the trajectory (final answer, tool calls, ...), lengths count model tokens only, and the
    result adds the tool-use statistics (``tools/calls_per_traj``, ``turns/mean``, ``end_reason/*``, ...).

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
    trajectories: list = []
    for start in range(0, len(rows), batch_size):
        chunk = rows[start:start + batch_size]
        expanded = [r for r in chunk for _ in range(num_samples)]
        columns = reward_columns(expanded, prompt_column)
        prompts = [r[prompt_column] for r in expanded]
        if agent is None:
            texts = [render_prompt(r[prompt_column], tokenizer, system_prompt, chat_template) for r in chunk]
            out = backend.generate(texts, num_samples, params)
            completions = completions_for_rewards(out.completions, prompts)
        else:
            out = agent_rollout(agent, model, tokenizer, chunk, num_samples, params, prompt_column=prompt_column,
                                system_prompt=system_prompt, backend=backend)
            texts = out.prompts[::num_samples]
            completions, traj_columns = reward_inputs(out.trajectories, prompts)
            columns.update(traj_columns)
            trajectories.extend(out.trajectories)
        ids = out.token_lists() if hasattr(out, "token_lists") else None
        totals, _ = scorer.score(prompts, completions, columns, completion_ids=ids)
        mask = out.completion_mask if getattr(out, "loss_mask", None) is None else out.loss_mask
        lengths.extend(mask.sum(dim=1).tolist())
        for i in range(len(chunk)):
            group = totals[i * num_samples:(i + 1) * num_samples]
            values.extend(v for v in group if not math.isnan(v))
            scored = [v for v in group if not math.isnan(v)]
            per_prompt_correct.append((len(scored), sum(1 for v in scored if v >= threshold)))
        if len(samples) < 4:
            sample = {"prompt": texts[0], "completion": out.completions[0], "reward": totals[0]}
            if agent is not None:
                sample.update(trajectory_record(out.trajectories[0], tokenizer))
            samples.append(sample)
    return _result(values, per_prompt_correct, lengths, samples, len(rows), ks, num_samples, trajectories)


def _result(values: list[float], per_prompt_correct: list, lengths: list[int], samples: list[dict], num_rows: int,
            ks: tuple[int, ...], num_samples: int, trajectories: list) -> dict[str, Any]:
    """Accuracy, pass@k, mean completion length, counts, a few samples (and tool use, for an agent)."""
    result: dict[str, Any] = {
        "accuracy": sum(values) / len(values) if values else float("nan"),
        "num_scored": len(values),
        "num_prompts": num_rows,
        "completion_length": sum(lengths) / len(lengths) if lengths else 0.0,
        "samples": samples,
    }
    for k in ks:  # like accuracy, "no opinion" samples are left out: pass@k over each prompt's scored samples
        if k <= num_samples:
            judged = [pass_at_k(n, c, k) for n, c in per_prompt_correct if n >= k]
            result[f"pass@{k}"] = sum(judged) / len(judged) if judged else float("nan")
    if trajectories:
        result.update(agent_metrics(trajectories))
    return result


def evaluate_model(cfg: Any, model: Any, tokenizer: Any, rows: list[dict], reward_fn: Any, *,
                   backend: Any = None, temperature: float | None = None, num_samples: int | None = None,
                   ks: Any = None, agent: Any = None) -> dict[str, Any]:
    """Evaluate ``model`` on ``rows`` as the config says (``None`` = the recipe's eval settings). An agent
    run (``agent``, or the config's ``tools`` / ``environment``) is evaluated with multi-turn rollouts."""
    import torch

    from grouprl.rollout import make_backend
    from grouprl.rollout.vllm_backend import options_from as vllm_options
    from grouprl.train.engine.model import autocast_factory
    from grouprl.train.engine.precision import generation_context

    temperature, num_samples, ks = decoding_plan(cfg, temperature, num_samples, ks)
    if agent is None:
        agent = build_agent(cfg)
    if backend is None:
        backend = make_backend(cfg.rollout_backend, model, tokenizer, lean_sampler=cfg.lean_sampler,
                               vllm_options=vllm_options(cfg))
    device = next(model.parameters()).device
    autocast = autocast_factory(cfg.bf16, device)
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), generation_context(autocast):
        torch.manual_seed(cfg.seed)
        return evaluate(backend, tokenizer, rows, reward_fn, prompt_column=cfg.prompt_column,
                        system_prompt=cfg.system_prompt, max_new_tokens=cfg.eval_max_new_tokens or cfg.max_new_tokens,
                        max_prompt_length=cfg.max_prompt_length, temperature=temperature, num_samples=num_samples,
                        top_p=cfg.top_p, batch_size=cfg.eval_batch_size, ks=ks, agent=agent, model=model,
                        chat_template=cfg.apply_chat_template)


def decoding_plan(cfg: Any, temperature: float | None, num_samples: int | None,
                  k: Any) -> tuple[float, int, tuple[int, ...]]:
    """(temperature, samples per prompt, pass@k values) from explicit choices, falling back on the recipe.

    Greedy decoding (temperature 0) gives one answer per prompt, so a recipe's eval_num_samples > 1 (meant for
    its sampled evaluation) becomes 1 under ``--temperature 0``; an explicit ``-n`` > 1 or ``--k`` > 1 with
    greedy decoding is an error."""
    from grouprl.errors import ConfigError

    temperature = cfg.eval_temperature if temperature is None else temperature
    if temperature < 0:
        raise ConfigError(f"--temperature {temperature} must be >= 0 (0 = greedy).")
    if num_samples is not None and num_samples < 1:
        raise ConfigError(f"--num-samples {num_samples} must be >= 1.")
    if temperature == 0:
        if num_samples is not None and num_samples > 1:
            raise ConfigError(f"--num-samples {num_samples} with greedy decoding (--temperature 0) gives "
                              f"{num_samples} identical samples, so pass@k would be meaningless. Fix: drop -n "
                              f"for greedy accuracy, or add --temperature 0.7 (or similar) for pass@k.")
        if k and max(k) > 1:
            raise ConfigError(f"--k {' '.join(map(str, k))} with greedy decoding: pass@k needs several sampled "
                              f"completions per prompt. Fix: drop --k, or add --temperature 0.7 and -n.")
        return temperature, 1, (1,)
    n = num_samples or cfg.eval_num_samples
    return temperature, n, tuple(k) if k else tuple(sorted({1, n}))


def completions_for_rewards(texts: list[str], prompts: list[Any]) -> list[Any]:
    """TRL's convention: chat prompts get chat completions ``[{"role": "assistant", "content": ...}]``."""
    return [[{"role": "assistant", "content": t}] if isinstance(p, list) else t for t, p in zip(texts, prompts)]
