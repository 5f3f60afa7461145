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
    """Variance of ``x`` over all masked positions. ``unbiased`` applies Bessel's n/(n-1).

    Shapes: ``x`` and ``mask`` broadcastable (typically ``[N, T]``) -> ``[]``; 0 when the mask is empty.
    """
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


class _SelectiveLogSoftmax(torch.autograd.Function):
    """logits[index] - logsumexp(logits), forward and backward both chunked over positions.

    Saved for backward: the logits themselves (already alive for the model's own backward), the index
    and the fp32 logsumexp per position -- never a [rows, V] temporary. The backward recomputes
    softmax one chunk at a time: d logp / d z = onehot(index) - softmax(z).
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, index: torch.Tensor, chunk_size: int, out_dtype: torch.dtype):
        rows = logits.shape[0]
        lse = torch.empty(rows, dtype=out_dtype, device=logits.device)
        picked = torch.empty(rows, dtype=out_dtype, device=logits.device)
        for start in range(0, rows, chunk_size):
            chunk = logits[start : start + chunk_size].to(out_dtype)
            lse[start : start + chunk_size] = torch.logsumexp(chunk, dim=-1)
            picked[start : start + chunk_size] = chunk.gather(-1, index[start : start + chunk_size, None])[:, 0]
        ctx.save_for_backward(logits, index, lse)
        ctx.chunk_size = chunk_size
        return picked - lse

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out: torch.Tensor):
        logits, index, lse = ctx.saved_tensors
        grad = torch.empty_like(logits)
        for start in range(0, logits.shape[0], ctx.chunk_size):
            sl = slice(start, start + ctx.chunk_size)
            g_out = grad_out[sl, None].to(lse.dtype)
            g = torch.exp(logits[sl].to(lse.dtype) - lse[sl, None]) * -g_out
            g.scatter_add_(-1, index[sl, None], g_out)
            grad[sl] = g.to(logits.dtype)
        return grad, None, None, None


def selective_log_softmax(
    logits: torch.Tensor, index: torch.Tensor, chunk_size: int = DEFAULT_CHUNK
) -> torch.Tensor:
    """log softmax(logits)[index] without materialising the full log-prob tensor.

    ``log p(y) = logits[y] - logsumexp(logits)`` computed ``chunk_size`` rows (positions) at a time, in
    the forward AND the backward pass: the extra memory is one ``[chunk_size, V]`` temporary rather than
    a ``[N, T, V]`` copy, and autograd keeps only the logits (which the model keeps anyway), the index
    and one logsumexp per position. Half-precision logits are upcast per chunk (``logsumexp`` in bf16
    loses ~2 decimal digits).

    Shapes: ``logits [..., V]``, ``index [...]`` (long) -> ``logp [...]`` in fp32 for half inputs,
    else in the dtype of ``logits``. Differentiable (once) with respect to ``logits``.
    """
    if logits.shape[:-1] != index.shape:
        raise ValueError(
            f"selective_log_softmax: logits {tuple(logits.shape)} must be index {tuple(index.shape)} + [V]"
        )
    out_dtype = torch.float32 if logits.dtype in (torch.float16, torch.bfloat16) else logits.dtype
    flat_logits = _rows(logits, 1)
    flat_index = _rows(index, 0).to(torch.long)
    out = _SelectiveLogSoftmax.apply(flat_logits, flat_index, max(1, int(chunk_size)), out_dtype)
    return out.reshape(index.shape)


def entropy_from_logits(logits: torch.Tensor, chunk_size: int = DEFAULT_CHUNK) -> torch.Tensor:
    """Entropy of softmax(logits) per position: ``H = logsumexp(z) - sum softmax(z) * z``.

    Computed ``chunk_size`` positions at a time (one ``[chunk_size, V]`` fp32 temporary). Usually
    called under ``torch.no_grad()`` for a metric; if differentiated, autograd keeps each chunk's
    softmax (a full-vocabulary copy in total), so prefer it as a metric, not an entropy bonus on large V.
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
