"""Loss aggregations: how a per-token loss ``[N, T]`` becomes the scalar we call ``backward`` on.

Signature: ``fn(per_token [N, T], mask [N, T], *, num_tokens=None, num_seqs=None, max_len=None)``.
Every aggregation accepts all three keywords (and ignores those it does not use), so the trainer can
pass the same normalisers whatever aggregation is configured.

Micro-batching: the trainer passes the totals of the WHOLE optimizer step -- ``num_tokens`` (real
tokens), ``num_seqs`` (sequences) and ``max_len`` (the max_new_tokens budget). Each aggregation is then
a sum of per-micro-batch terms with a fixed denominator, so summing the micro-batch losses (gradient
accumulation) gives exactly the gradient of the full batch, however it is split. ``None`` means "this
batch's own count", which is right when the batch is the whole step.

``num_seqs`` counts sequences with at least one real (unmasked) token: a fully masked row (e.g. a
truncated completion under ``mask_truncated_completions``) contributes nothing and must not dilute the
mean. The default count does this itself; a caller passing ``num_seqs`` must count the same way.
"""

from __future__ import annotations

import torch

from grouprl.algo.ops import masked_sum
from grouprl.registry import AGGREGATIONS

__all__ = ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"]


def _non_empty_rows(mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Number of rows of ``mask`` with at least one real token, as a 0-dim tensor like ``like``."""
    return (mask.to(like.dtype).sum(dim=-1) > 0).to(like.dtype).sum()


def _count(value: float | int | torch.Tensor | None, default: torch.Tensor, like: torch.Tensor):
    n = default if value is None else torch.as_tensor(value, dtype=like.dtype, device=like.device)
    return n.to(like.dtype).clamp(min=1)


@AGGREGATIONS.register("token_mean")
def token_mean(
    per_token: torch.Tensor,
    mask: torch.Tensor,
    *,
    num_tokens: float | int | torch.Tensor | None = None,
    num_seqs: float | int | torch.Tensor | None = None,
    max_len: int | None = None,
) -> torch.Tensor:
    """Token-level mean over the step: sum_{i,t} m_{i,t} l_{i,t} / num_tokens (DAPO's token-level loss).

    Paper: DAPO, Yu et al. 2025, arXiv 2503.14476, Eq. (8): 1 / sum_i |o_i| * sum_i sum_t. Every token
    weighs the same, so long sequences weigh more. ``num_tokens`` = real tokens of the whole optimizer
    step (default: this batch's ``mask.sum()``); ``num_seqs`` and ``max_len`` are ignored.
    Shapes: ``[N, T], [N, T] -> []``.
    """
    total = masked_sum(per_token, mask)
    return total / _count(num_tokens, mask.to(per_token.dtype).sum(), per_token)


@AGGREGATIONS.register("seq_mean_token_mean")
def seq_mean_token_mean(
    per_token: torch.Tensor,
    mask: torch.Tensor,
    *,
    num_tokens: float | int | torch.Tensor | None = None,
    num_seqs: float | int | torch.Tensor | None = None,
    max_len: int | None = None,
) -> torch.Tensor:
    """Mean over sequences of the per-sequence token mean: (1/G) sum_i (1/|y_i|) sum_t l_{i,t}.

    Paper: GRPO, arXiv 2402.03300, Eq. (3); GSPO, arXiv 2507.18071, Eq. (5) (with the broadcast
    sequence loss this is exactly GSPO's (1/G) sum_i). |y_i| is each sequence's own real-token count
    (a sequence is never split across micro-batches); sequences without real tokens add 0 and are not
    counted. ``num_seqs`` = sequences with >= 1 real token in the whole step (default: those of this
    batch); other keywords ignored.
    Shapes: ``[N, T], [N, T] -> []``.
    """
    seq_len = mask.to(per_token.dtype).sum(dim=-1).clamp(min=1)
    seq_means = masked_sum(per_token, mask, dim=-1) / seq_len
    return seq_means.sum() / _count(num_seqs, _non_empty_rows(mask, per_token), per_token)


@AGGREGATIONS.register("seq_mean_token_sum_norm")
def seq_mean_token_sum_norm(
    per_token: torch.Tensor,
    mask: torch.Tensor,
    *,
    num_tokens: float | int | torch.Tensor | None = None,
    num_seqs: float | int | torch.Tensor | None = None,
    max_len: int | None = None,
) -> torch.Tensor:
    """Dr. GRPO: token sums divided by a CONSTANT length: sum_{i,t} m l / (num_seqs * max_len).

    Paper: Liu et al. 2025, arXiv 2503.20783, Sec. 3.2: replacing 1/|o_i| by a constant removes
    the length bias of the per-sequence mean. ``max_len`` should be the generation budget
    (max_new_tokens; default: T of this batch, which changes with padding -- pass it when
    micro-batching); ``num_seqs`` as in ``seq_mean_token_mean`` (default: the rows of this batch with
    >= 1 real token). Same normaliser as TRL's ``dr_grpo``.
    Shapes: ``[N, T], [N, T] -> []``.
    """
    seq_default = _non_empty_rows(mask, per_token)
    len_default = torch.tensor(per_token.shape[-1], dtype=per_token.dtype, device=per_token.device)
    denom = _count(num_seqs, seq_default, per_token) * _count(max_len, len_default, per_token)
    return masked_sum(per_token, mask) / denom
