"""Padding-free log-prob passes: a micro-batch's sequences packed into fewer rows, little padding computed.

A micro-batch carries left-padded prompts ``[N, P]`` and right-padded completions ``[N, T]``; even trimmed
(``step.trim_padding``) every row is as wide as the longest prompt plus the longest completion, so a batch of
ragged completions spends much of its compute on padding. Here each sequence's real tokens (its prompt's,
then its completion's) are laid end to end in rows of 1x, 1.5x or 2x the longest sequence's length
(first-fit decreasing bin packing), with position ids restarting at 0 for each sequence; only the tail of a
row that is not full is padding. With ``attention_mask=None`` transformers (5.x; checked with 5.24) reads
the restarts of ``position_ids`` as sequence boundaries and builds a block-diagonal causal mask
(``masking_utils.find_packed_sequence_indices``); flash-attention takes the same input as variable-length
sequences. Each token then sees exactly the tokens it sees in its own padded row, at the same positions
(the padded path's position ids also count real tokens only), so its hidden state is the same up to
summation order.

Why rows of about the longest sequence's width: on a CPU (and with sdpa's dense mask on a GPU) attention is
computed over the whole packed row, so a row of width W costs W^2 whatever its blocks are. Rows of the
micro-batch's own width keep that per-row cost and remove rows; up to twice that width lets more short
sequences share a row at a higher attention cost, so :func:`pack` picks the width by an estimate of both
(:func:`row_cost`).

:func:`packing_supported` checks a model once by a probe (two short sequences packed vs alone) instead of
trusting a list of architectures: a model or attention implementation that ignores ``position_ids`` for
masking fails it, and the caller keeps the padded path.

Shapes: N sequences, P prompt columns, T completion columns, R packed rows of width W, K real completion
tokens.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["Packed", "pack", "packing_supported"]


@dataclass
class Packed:
    """A micro-batch packed into rows; ``input_ids``, ``position_ids`` are ``[R, W]``.

    ``predict_index [K]``: for each real completion token, in the row-major order of
    ``completion_mask.bool()`` (the order ``tensor[mask]`` uses), the flat index into ``[R * W]`` of the
    packed position whose hidden state predicts it (the token just before it in its sequence).
    ``rows_of`` lists, per packed row, the micro-batch rows in it (for tests and benchmarks).
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    predict_index: torch.Tensor
    rows_of: list[list[int]]
    cost: float = 0.0  # row_cost of the layout (token positions, attention share added)

    @property
    def slots(self) -> int:
        """Token positions the forward computes: R * W."""
        return self.input_ids.numel()


def _contiguous(mask: torch.Tensor, lengths: torch.Tensor, *, left: bool) -> bool:
    cols = torch.arange(mask.shape[1], device=mask.device)[None]
    want = cols >= mask.shape[1] - lengths[:, None] if left else cols < lengths[:, None]
    return bool(torch.equal(mask.bool(), want))


def first_fit_decreasing(lengths: list[int], capacity: int) -> list[list[int]]:
    """Indices of ``lengths`` grouped into bins of total at most ``capacity`` (first fit, longest first;
    ties keep index order, so the layout is deterministic). Every length must be <= capacity."""
    bins: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda j: (-lengths[j], j)):
        for b, free in enumerate(room):
            if lengths[i] <= free:
                bins[b].append(i)
                room[b] -= lengths[i]
                break
        else:
            bins.append([i])
            room.append(capacity - lengths[i])
    return bins


# Row capacities tried, as multiples of the longest sequence, when the caller gives none (:func:`pack`).
CAPACITY_MULTIPLES = (1.0, 1.5, 2.0)
# Attention's cost per token relative to the rest of a decoder layer: W / (ATTENTION_WEIGHT * hidden) for a
# row of width W (a dense mask: every row pays W^2 whatever its blocks). From the FLOPs of a Llama / Qwen2
# layer: q.k and p.v take 4 W H per token, the projections and the MLP (intermediate 4 H, grouped KV)
# about 30 H^2. On a CPU (benchmarks/packing.py) rows twice as wide with the same positions cost ~14% more
# at hidden 256 (this predicts 7%), and no measurable amount at hidden 128.
ATTENTION_WEIGHT = 8.0


def row_cost(rows: int, width: int, hidden_size: int | None) -> float:
    """Estimated decoder cost of ``rows`` rows of ``width`` positions, in token positions: each position
    costs 1 plus its attention share ``width / (ATTENTION_WEIGHT * hidden_size)`` (0 when no hidden size)."""
    return rows * width * (1.0 + (width / (ATTENTION_WEIGHT * hidden_size) if hidden_size else 0.0))


def _choose_bins(lengths: list[int], capacity: int | None, hidden_size: int | None) -> list[list[int]]:
    longest = max(lengths)
    if capacity is not None:
        return first_fit_decreasing(lengths, max(int(capacity), longest))
    best, best_cost = None, float("inf")
    for mult in CAPACITY_MULTIPLES if hidden_size else (1.0,):
        bins = first_fit_decreasing(lengths, int(longest * mult))
        width = max(sum(lengths[i] for i in b) for b in bins)
        cost = row_cost(len(bins), width, hidden_size)
        if cost < best_cost:  # ties keep the narrower rows
            best, best_cost = bins, cost
    return best


def pack(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_ids: torch.Tensor,
         completion_mask: torch.Tensor, capacity: int | None = None, *,
         hidden_size: int | None = None) -> Packed | None:
    """Pack the real tokens of a micro-batch into rows of at most ``capacity`` tokens. Without ``capacity``
    it is the longest sequence's prompt + completion length times the multiple of
    :data:`CAPACITY_MULTIPLES` with the lowest :func:`row_cost` for the model's ``hidden_size`` (only 1x
    without one): wider rows let short sequences share a row but make attention dearer.
    Sequences without a completion token are left out (nothing of theirs is scored). Returns None where
    packing does not apply: a prompt mask that is not left padding or a completion mask that is not right
    padding (a hole would change which position predicts a token), a sequence with a completion but no
    prompt token, or no completion token at all.
    """
    p_len, c_len = prompt_mask.bool().sum(1), completion_mask.bool().sum(1)
    if not (_contiguous(prompt_mask, p_len, left=True) and _contiguous(completion_mask, c_len, left=False)):
        return None
    keep = (c_len > 0).nonzero()[:, 0].tolist()
    p_host, c_host = p_len.tolist(), c_len.tolist()
    if not keep or any(p_host[i] == 0 for i in keep):
        return None
    lengths = [p_host[i] + c_host[i] for i in keep]
    bins = [[keep[j] for j in b] for b in _choose_bins(lengths, capacity, hidden_size)]
    width = max(sum(p_host[i] + c_host[i] for i in b) for b in bins)
    P, T = prompt_ids.shape[1], completion_ids.shape[1]
    # source: a flat index into cat([prompt_ids, completion_ids], 1) of width P + T; pads read position 0
    src = torch.zeros(len(bins), width, dtype=torch.long)
    pos = torch.zeros(len(bins), width, dtype=torch.long)
    start = torch.zeros(len(prompt_ids), dtype=torch.long)  # flat packed index of each kept sequence's first token
    for r, b in enumerate(bins):
        off = 0
        for i in b:
            n_p, n = p_host[i], p_host[i] + c_host[i]
            src[r, off:off + n] = i * (P + T) + (P - n_p) + torch.arange(n)
            pos[r, off:off + n] = torch.arange(n)
            start[i] = r * width + off
            off += n
        pos[r, off:] = torch.arange(width - off)  # the tail is one more "sequence": restarts at 0, attends to itself
    dev = prompt_ids.device
    flat = torch.cat([prompt_ids, completion_ids], dim=1).reshape(-1)
    src, pos = src.to(dev), pos.to(dev)
    used = torch.zeros(len(bins), width, dtype=torch.bool, device=dev)
    for r, b in enumerate(bins):
        used[r, :sum(p_host[i] + c_host[i] for i in b)] = True
    input_ids = torch.where(used, flat[src], torch.zeros((), dtype=flat.dtype, device=dev))
    # completion token t of sequence i sits at start_i + p_i + t; its predictor one position earlier
    real = completion_mask.bool()
    rows, cols = real.nonzero(as_tuple=True)
    predict = start.to(dev)[rows] + p_len[rows] + cols - 1
    return Packed(input_ids, pos, predict, bins, row_cost(len(bins), width, hidden_size))


_PROBED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def packing_supported(forward: Any, probe_owner: Any, vocab: int, device: torch.device) -> bool:
    """Whether ``forward(input_ids=, position_ids=, attention_mask=None)`` (a decoder returning
    ``last_hidden_state``) treats restarts of ``position_ids`` as sequence boundaries. Checked once per
    ``probe_owner`` (the model) and attention implementation: two sequences of 5 and 4 random tokens packed
    in one row must give the hidden states each gives alone (in eval mode, no autocast, no gradient). An
    implementation that lets the second sequence see the first fails this by far more than rounding."""
    attn = getattr(getattr(probe_owner, "config", None), "_attn_implementation", None)
    cached = _PROBED.get(probe_owner)
    if cached is not None and cached[0] == attn:
        return cached[1]
    ok = _probe(forward, probe_owner, vocab, device)
    _PROBED[probe_owner] = (attn, ok)
    return ok


def _probe(forward: Any, owner: Any, vocab: int, device: torch.device) -> bool:
    g = torch.Generator().manual_seed(0)
    a, b = torch.randint(1, max(2, vocab), (1, 5), generator=g), torch.randint(1, max(2, vocab), (1, 4), generator=g)
    a, b = a.to(device), b.to(device)
    was_training = getattr(owner, "training", False)
    owner.eval()
    try:
        with torch.no_grad(), torch.autocast(device.type, enabled=False):
            def run(ids, positions):
                return forward(input_ids=ids, position_ids=positions, attention_mask=None,
                               use_cache=False).last_hidden_state.float()

            alone = torch.cat([run(a, torch.arange(5, device=device)[None]),
                               run(b, torch.arange(4, device=device)[None])], dim=1)
            packed = run(torch.cat([a, b], 1), torch.cat([torch.arange(5), torch.arange(4)])[None].to(device))
    except (TypeError, ValueError, RuntimeError):  # a forward without these arguments: keep the padded path
        return False
    finally:
        owner.train(was_training)
    tol = 1e-4 if _param_dtype(owner) in (torch.float32, torch.float64) else 3e-2
    return bool(torch.isfinite(packed).all()) and float((packed - alone).abs().max()) <= tol * max(
        1.0, float(alone.abs().max()))


def _param_dtype(model: Any) -> torch.dtype:
    p = next(iter(model.parameters()), None)
    return torch.float32 if p is None else p.dtype
