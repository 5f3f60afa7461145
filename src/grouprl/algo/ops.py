"""Masked reductions and memory-lean log-prob / entropy kernels.

Shapes: ``N`` sequences, ``T`` tokens, ``V`` vocabulary. A ``mask`` is 1 (or True) on real tokens and
0 on padding; it may be bool, int or float and is cast to the dtype of the values it weights.

The log-prob kernels work on chunks of rows so that the peak extra memory is ``chunk_size x V``
instead of ``N x T x V``: a full-vocabulary ``log_softmax`` copy of the logits is never kept. For a
1.5B model with V = 151,936, T = 1,024 and N = 8 that copy alone would be 5 GB in fp32.
"""

from __future__ import annotations

import torch

__all__ = [
    "masked_sum",
    "masked_mean",
    "masked_var",
    "masked_whiten",
    "selective_log_softmax",
    "entropy_from_logits",
]

DEFAULT_CHUNK = 512


def _as_weights(mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return mask.to(like.dtype)


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of ``x`` over the positions where ``mask`` is set.

    Shapes: ``x`` and ``mask`` broadcastable (typically ``[N, T]``); returns a 0-dim tensor when
    ``dim`` is None, else ``x`` reduced over ``dim``. Masked positions contribute exactly 0 even when
    ``x`` is NaN or inf there (``torch.where`` rather than a product).
    """
    w = _as_weights(mask, x)
    x = torch.where(w != 0, x, torch.zeros_like(x)) * w
    return x.sum() if dim is None else x.sum(dim=dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``x`` over the masked positions: ``sum(x * m) / sum(m)``; 0 where ``sum(m) == 0``.

    Shapes as :func:`masked_sum`.
    """
    num = masked_sum(x, mask, dim)
    w = _as_weights(mask, x).expand_as(x)
    den = w.sum() if dim is None else w.sum(dim=dim)
    return torch.where(den > 0, num / den.clamp(min=torch.finfo(x.dtype).tiny), torch.zeros_like(num))


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of ``x`` over all masked positions (0-dim). ``unbiased`` applies Bessel's n/(n-1)."""
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean) ** 2, mask)
    if unbiased:
        n = _as_weights(mask, x).expand_as(x).sum()
        var = torch.where(n > 1, var * n / (n - 1).clamp(min=1), var)
    return var


def masked_whiten(
    x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8
) -> torch.Tensor:
    """Whiten ``x`` with the masked mean and (unbiased) variance: ``(x - mean) / sqrt(var + eps)``.

    Used for PPO token advantages (Schulman et al. 2017, arXiv 1707.06347, implementation detail).
    With ``shift_mean=False`` the mean is added back (scale only). Shapes: ``x``, ``mask`` ``[N, T]``
    -> ``[N, T]``; masked positions are returned unchanged-scaled like the rest (callers mask them).
    """
    mean = masked_mean(x, mask)
    var = masked_var(x, mask, unbiased=True)
    white = (x - mean) * torch.rsqrt(var + eps)
    return white if shift_mean else white + mean


def _rows(t: torch.Tensor, last_dims: int) -> torch.Tensor:
    return t.reshape(-1, *t.shape[t.dim() - last_dims :]) if last_dims else t.reshape(-1)


def selective_log_softmax(
    logits: torch.Tensor, index: torch.Tensor, chunk_size: int = DEFAULT_CHUNK
) -> torch.Tensor:
    """log softmax(logits)[index] without materialising the full log-prob tensor.

    ``log p(y) = logits[y] - logsumexp(logits)`` computed ``chunk_size`` rows (positions) at a time, so
    the extra memory is one ``[chunk_size, V]`` temporary (in fp32) rather than a ``[N, T, V]`` copy.
    Half-precision logits are upcast per chunk: ``logsumexp`` in bf16 loses ~2 decimal digits.

    Shapes: ``logits [..., V]``, ``index [...]`` (long) -> ``logp [...]`` in fp32 for half inputs,
    else in the dtype of ``logits``. Differentiable with respect to ``logits``.
    """
    if logits.shape[:-1] != index.shape:
        raise ValueError(
            f"selective_log_softmax: logits {tuple(logits.shape)} must be index {tuple(index.shape)} + [V]"
        )
    out_dtype = torch.float32 if logits.dtype in (torch.float16, torch.bfloat16) else logits.dtype
    flat_logits = _rows(logits, 1)
    flat_index = _rows(index, 0)
    pieces = []
    for start in range(0, flat_logits.shape[0], max(1, chunk_size)):
        chunk = flat_logits[start : start + chunk_size].to(out_dtype)
        idx = flat_index[start : start + chunk_size]
        picked = chunk.gather(-1, idx.unsqueeze(-1)).squeeze(-1)
        pieces.append(picked - torch.logsumexp(chunk, dim=-1))
    out = torch.cat(pieces) if pieces else flat_logits.new_zeros(0, dtype=out_dtype)
    return out.reshape(index.shape)


def entropy_from_logits(logits: torch.Tensor, chunk_size: int = DEFAULT_CHUNK) -> torch.Tensor:
    """Entropy of softmax(logits) per position: ``H = logsumexp(z) - sum softmax(z) * z``.

    Computed ``chunk_size`` positions at a time (one ``[chunk_size, V]`` fp32 temporary).
    Shapes: ``logits [..., V]`` -> ``[...]`` (fp32 for half inputs). Differentiable.
    """
    out_dtype = torch.float32 if logits.dtype in (torch.float16, torch.bfloat16) else logits.dtype
    flat = _rows(logits, 1)
    pieces = []
    for start in range(0, flat.shape[0], max(1, chunk_size)):
        chunk = flat[start : start + chunk_size].to(out_dtype)
        probs = torch.softmax(chunk, dim=-1)
        pieces.append(torch.logsumexp(chunk, dim=-1) - (probs * chunk).sum(dim=-1))
    out = torch.cat(pieces) if pieces else flat.new_zeros(0, dtype=out_dtype)
    return out.reshape(logits.shape[:-1])
