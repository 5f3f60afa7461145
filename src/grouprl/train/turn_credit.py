"""Turn rewards and per-token advantages for a turn-level advantage estimator (``advantage: mt_grpo``).

The estimator (:mod:`grouprl.algo.turns`, MT-GRPO, arXiv 2505.11821) needs, besides the outcome
rewards ``[B, G]``, a verifiable reward of each trajectory's first model turn. ``TURN_REWARDS`` holds
the built-in ones, chosen by ``advantage_kwargs.turn_reward``:

- ``tool_result_match``: 1.0 when one of the trajectory's tool calls returned the reference ``answer``
  (the calculator recipe: the call was the right expression), else 0.0; NaN when the row has no answer;
- ``tool_result_digits``: partial credit, the best ``digit_match`` of a tool reply against ``answer``
  (a call with one wrong digit of six in its reply scores 5/6);
- ``tool_success``: 1.0 when the trajectory made at least one tool call and none failed, else 0.0.

Only multi-turn (tool) rollouts have turns: :func:`check_config` refuses the estimator otherwise.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from grouprl.algo.turns import turn_token_advantages
from grouprl.errors import ConfigError


def _result_match(traj: Any, answer: Any) -> float:
    if answer is None:
        return float("nan")
    want = str(answer).strip()
    return float(any(c.get("error") is None and str(c.get("result", "")).strip() == want for c in traj.tool_calls))


def _result_digits(traj: Any, answer: Any) -> float:
    from grouprl.rewards.digits import digit_match_reward

    if answer is None:
        return float("nan")
    replies = [c.get("result") for c in traj.tool_calls if c.get("error") is None]
    return max((digit_match_reward(f"Answer: {r}", answer=answer) or 0.0 for r in replies), default=0.0)


def _success(traj: Any, answer: Any) -> float:
    return float(bool(traj.tool_calls) and all(c.get("error") is None for c in traj.tool_calls))


TURN_REWARDS: dict[str, Callable[[Any, Any], float]] = {
    "tool_result_match": _result_match, "tool_result_digits": _result_digits, "tool_success": _success}


def is_turn_level(fn: Any) -> bool:
    """``fn`` (an estimator or a ``functools.partial`` of one) takes ``turn_rewards``."""
    return bool(getattr(getattr(fn, "func", fn), "turn_level", False))


def check_config(cfg: Any, fn: Any) -> None:
    """ConfigError before training when a turn-level estimator has no turns or an unknown turn reward."""
    if not is_turn_level(fn):
        return
    if not (cfg.environment or cfg.tools):
        raise ConfigError(f"advantage={cfg.advantage!r} assigns credit per model turn, but this run has no tools "
                          f"or environment (single-turn completions). Fix: set environment (docs/AGENTS.md), "
                          f"or use advantage: grpo.")
    name = getattr(fn, "keywords", {}).get("turn_reward", "tool_result_match")
    if name not in TURN_REWARDS:
        raise ConfigError(f"advantage_kwargs.turn_reward={name!r} is unknown. Known: {', '.join(TURN_REWARDS)}.")


def turn_rewards(fn: Any, scored: Any) -> torch.Tensor:
    """``[B, G]`` turn rewards of one scored part (its trajectories and ``answer`` column)."""
    score = TURN_REWARDS[getattr(fn, "keywords", {}).get("turn_reward", "tool_result_match")]
    answers = scored.columns.get("answer") or [None] * len(scored.trajectories)
    values = [score(t, a) for t, a in zip(scored.trajectories, answers)]
    return torch.tensor(values, dtype=torch.float32).view_as(scored.rewards)


def part_advantage(global_advantage: Callable, fn: Any, scored: Any, G: int) -> torch.Tensor:
    """``[B, G, 2]`` advantages (first turn, later turns) of one part; ``global_advantage(f, x)`` is the
    rank-aware call (``train.algorithms.rounds.global_advantage``), given outcome and turn rewards stacked as ``[B, G, 2]``."""
    if scored is None:
        both = torch.zeros(0, G, 2)
    else:
        both = torch.stack([scored.rewards, turn_rewards(fn, scored)], dim=-1)
    return global_advantage(lambda x: fn(x[..., 0], turn_rewards=x[..., 1]), both)


def token_advantages(loss_mask: torch.Tensor, adv: torch.Tensor) -> torch.Tensor:
    """``[N, T]`` per-token advantages from ``[N, 2]`` per-turn ones (the rows' loss masks mark the turns)."""
    return turn_token_advantages(loss_mask, adv.to(loss_mask.device))


def row_advantages(adv: torch.Tensor, loss_mask: torch.Tensor | None) -> torch.Tensor:
    """``[N]`` advantages to log: ``adv`` itself when it is per row, else each row's first trained token's
    (its first model turn's advantage; 0 for a row with no trained token)."""
    if adv.dim() == 1 or len(adv) == 0:
        return adv
    on = loss_mask[:, : adv.shape[1]].to(adv.device) > 0
    first = torch.where(on.any(dim=1), on.float().argmax(dim=1), torch.zeros_like(on[:, 0], dtype=torch.long))
    return torch.where(on.any(dim=1), adv.gather(1, first[:, None])[:, 0], torch.zeros_like(adv[:, 0]))
