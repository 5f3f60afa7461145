"""Turn-level credit assignment for multi-turn rollouts: MT-GRPO (Zeng et al. 2025, arXiv 2505.11821).

Trajectory-level GRPO gives every token of a trajectory one advantage, the z-score of its outcome
reward, so a right tool call followed by a miscopied answer is blamed exactly like a wrong call.
MT-GRPO adds a verifiable *turn* reward ``R^T_i`` (for a calculator: did the call in the first turn
return the reference value?) and gives the two parts of a trajectory different advantages::

    A^T_i = (R^T_i - mean_j R^T_j) / (std_j R^T_j + eps)       z-score over the group, as GRPO
    A^O_i = (R^O_i - mean_j R^O_j) / (std_j R^O_j + eps)       the outcome (trajectory) advantage
    first model turn:   A_{i,1} = A^T_i + turn_coef * A^O_i
    later model turns:  A_{i,2} = A^O_i

(arXiv 2505.11821v1, Sec. 4, "MT-GRPO" with lambda = ``turn_coef``; the paper's rollouts have two
model turns, call then answer; a trajectory with more model turns gives all of its later turns A^O).
A one-turn trajectory (it answered without calling) has only a first turn: A^T + turn_coef * A^O.

:func:`mt_grpo_advantages` is registered as the ``mt_grpo`` advantage. Without ``turn_rewards`` it is
the GRPO estimator (``[B, G]``, the registry contract); with them it returns ``[B, G, 2]`` (first turn,
later turns). :func:`turn_token_advantages` spreads those over the tokens: the first run of loss-mask-1
tokens of a row is its first model turn (tool replies and template glue have mask 0 and separate the
turns, :mod:`grouprl.rollout.multiturn`).
"""

from __future__ import annotations

import torch

from grouprl.algo.advantages import ZERO_STD_TOL, grpo_advantages
from grouprl.registry import ADVANTAGES

__all__ = ["mt_grpo_advantages", "turn_token_advantages"]


@ADVANTAGES.register("mt_grpo")
def mt_grpo_advantages(
    rewards: torch.Tensor,
    *,
    turn_rewards: torch.Tensor | None = None,
    turn_coef: float = 1.0,
    turn_reward: str = "tool_result_match",
    eps: float = ZERO_STD_TOL,
    std: str = "population",
) -> torch.Tensor:
    """MT-GRPO turn-level advantages (arXiv 2505.11821): first turn A^T + turn_coef * A^O, later turns A^O.

    Shapes: ``rewards [B, G]`` (outcome) and ``turn_rewards [B, G]`` (the first turn's verifiable
    reward; NaN = no opinion, advantage part 0) -> ``[B, G, 2]``: ``[..., 0]`` the first model turn's
    advantage, ``[..., 1]`` the later turns'. Without ``turn_rewards``: ``grpo`` (``[B, G]``). Each part
    is the ``grpo`` z-score (same ``eps`` and ``std``), so a flat group gives 0 for that part.
    ``turn_reward`` names how the trainer scores the first turn (``grouprl.train.turn_credit.TURN_REWARDS``:
    ``tool_result_match``, ``tool_success``); the math here does not read it.

    Example, one group: outcome ``[1, 0, 0, 0]`` -> A^O = [1.732, -0.577, -0.577, -0.577]; turn rewards
    ``[1, 1, 0, 0]`` -> A^T = [1, 1, -1, -1]; with turn_coef 1 the first turns get
    [2.732, 0.423, -1.577, -1.577] and the later turns A^O.
    """
    outcome = grpo_advantages(rewards, eps=eps, std=std)
    if turn_rewards is None:
        return outcome
    turn_rewards = torch.as_tensor(turn_rewards, dtype=outcome.dtype)
    if turn_rewards.shape != outcome.shape:
        raise ValueError(f"mt_grpo: turn_rewards must be [B, G] = {list(outcome.shape)} like the rewards, "
                         f"got {tuple(turn_rewards.shape)}")
    turn = grpo_advantages(turn_rewards, eps=eps, std=std)
    return torch.stack([turn + turn_coef * outcome, outcome], dim=-1)


mt_grpo_advantages.turn_level = True  # the trainer passes turn_rewards (grouprl.train.turn_credit)


def turn_token_advantages(loss_mask: torch.Tensor, turn_adv: torch.Tensor) -> torch.Tensor:
    """Per-token advantages ``[N, T]`` from per-turn ones ``turn_adv [N, 2]`` (first turn, later turns).

    A row's first model turn is its first run of ``loss_mask == 1`` tokens; every mask-1 token after
    that run gets the later-turn advantage; mask-0 tokens (tool replies, template glue, padding) get 0.

    >>> turn_token_advantages(torch.tensor([[1, 1, 0, 0, 1, 1, 0]]), torch.tensor([[2.0, -1.0]])).tolist()
    [[2.0, 2.0, 0.0, 0.0, -1.0, -1.0, 0.0]]
    """
    if loss_mask.dim() != 2 or turn_adv.shape != (loss_mask.shape[0], 2):
        raise ValueError(f"turn_token_advantages: loss_mask [N, T] and turn_adv [N, 2], got "
                         f"{tuple(loss_mask.shape)} and {tuple(turn_adv.shape)}")
    on = loss_mask > 0
    # a token is past the first turn once a mask-0 token has followed a mask-1 token
    started = torch.cumsum(on.long(), dim=1) > 0
    gap = started & ~on
    later = (torch.cumsum(gap.long(), dim=1) > 0) & on
    first = on & ~later
    a = turn_adv.to(torch.float32)
    return torch.where(first, a[:, :1], torch.zeros(())) + torch.where(later, a[:, 1:], torch.zeros(()))
