"""An advantage estimator plug-in: centred ranks within each group.

Formula, for the n non-NaN rewards of a group (ties share their average rank, 1..n):

    A_i = (2 * rank_i - (n + 1)) / (n - 1)        in [-1, 1], sum_i A_i = 0

It is the centred-rank fitness shaping of evolution strategies (Salimans et al. 2017, arXiv 1703.03864;
Wierstra et al. 2014, arXiv 1106.4487): only the order of the rewards matters, so one outlier reward
cannot dominate the update the way it does a z-score.
"""

from __future__ import annotations

import torch

from grouprl.registry import ADVANTAGES


@ADVANTAGES.register("rank")
def rank_advantages(rewards):
    """Centred ranks: A_i = (2 rank_i - (n+1)) / (n-1) within each group (arXiv 1703.03864).

    NaN rewards ("no opinion") are left out of the ranking and get 0; a group with fewer than two
    non-NaN rewards, or with all rewards equal, gets 0 everywhere.
    Example: ``[1, 3, 2, 6]`` has ranks ``[1, 3, 2, 4]``, so A = ``[-1, 1/3, -1/3, 1]``.

    Shapes: rewards [B, G] -> adv [B, G].
    """
    r = torch.as_tensor(rewards)
    r = r if r.is_floating_point() else r.float()
    valid = ~torch.isnan(r)
    x, y = r.unsqueeze(-1), r.unsqueeze(-2)  # [B, G, 1] against [B, 1, G]
    pair = valid.unsqueeze(-1) & valid.unsqueeze(-2)
    below = ((y < x) & pair).sum(-1).to(r.dtype)
    ties = ((y == x) & pair).sum(-1).to(r.dtype)  # includes i itself
    rank = below + (ties + 1) / 2
    n = valid.sum(-1, keepdim=True).to(r.dtype)
    adv = (2 * rank - (n + 1)) / (n - 1).clamp(min=1)
    return torch.where(valid & (n >= 2), adv, torch.zeros_like(r))
