"""Log-probs (and entropy) through the LM head, chunk by chunk: the ``[R, V]`` logits never exist at once.

For a causal LM the log-prob of token ``y`` at a position with last hidden state ``h`` is
``log softmax(W h / tau)[y]``. Computed plainly, ``W h`` for every position is an ``[N, T, V]`` tensor
(16 x 257 x 32768 fp32 = 540 MB for a 25M-parameter model with a 32k vocabulary; 5 GB for V = 151,936, T =
1,024, N = 8), and autograd keeps it, its fp32 copy and the gradient of the same size for the backward.
Here the rows (positions) go through the head ``chunk_size`` at a time, in the forward AND the backward.
The backward needs each chunk's softmax: the forward keeps it for the first chunks, up to ``keep_bytes``
(:data:`KEEP_SOFTMAX_BYTES`, 512 MiB, by default: all of a 25M-parameter model's 8 x 256 x 32k micro-batch),
and the backward recomputes the logits of the others (one more ``[chunk_size, H] x [H, V]`` matmul each, a
third more head arithmetic). With ``keep_bytes=0`` the extra memory is a few ``[chunk_size, V]`` fp32
temporaries.

The gradient is written by hand (a fused linear + log-softmax, as Liger-Kernel's fused linear
cross-entropy does on GPUs): with ``z = W h / tau`` and ``p = softmax(z)``,
``d logp / d h = (onehot(y) - p) W / tau`` and ``d logp / d W = (onehot(y) - p)^T h / tau``.
Hand-written because no CPU implementation exists in a maintained library (Liger's is Triton-only).

Shapes: ``R`` rows (positions), ``H`` hidden size, ``V`` vocabulary.
"""

from __future__ import annotations

import torch

__all__ = ["KEEP_SOFTMAX_BYTES", "linear_log_softmax"]

# Softmax bytes per call kept from the forward for the backward (see linear_log_softmax's ``keep_bytes``).
KEEP_SOFTMAX_BYTES = 512 * 2**20


def _chunk_logits(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, temperature: float,
                  buf: torch.Tensor | None = None):
    """``(h W^T + b) / temperature`` in fp32 (fp64 for fp64); into ``buf`` (a reused ``[chunk_size, V]``
    buffer of the compute dtype, fp32/fp64 only) when given: a fresh vocabulary-sized tensor per chunk costs
    its page faults again (about as much as an elementwise pass over it on a CPU)."""
    z = h @ weight.t() if buf is None else torch.mm(h, weight.t(), out=buf[: h.shape[0]])
    if bias is not None:
        z += bias
    # fp32 (fp64 for fp64 inputs) before the division: a bf16 division rounds every logit. z is a fresh
    # [rows, V] tensor (or the buffer), so it is divided in place (one vocabulary-sized temporary, not two).
    return z.to(torch.promote_types(z.dtype, torch.float32)).div_(temperature)


def _logits_buffer(rows: int, weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | None:
    """A ``[rows, V]`` buffer for :func:`_chunk_logits` where the matmul is already fp32/fp64, else None."""
    if torch.promote_types(dtype, torch.float32) != dtype:
        return None
    return torch.empty(rows, weight.shape[0], dtype=dtype, device=weight.device)


def _softmax_stats(z: torch.Tensor, index: torch.Tensor, keep: bool, with_entropy: bool, pbuf):
    """``(max, sum of exp(z - max), logit of index, softmax or None, entropy or None)`` of the rows of ``z``
    (overwritten); the softmax is ``exp(z - max) / sum``, as the backward recomputes it, bit for bit,
    with no vocabulary-sized temporary beyond the softmax itself: fresh when ``keep`` (it outlives the
    chunk), in ``pbuf`` when only the entropy needs it. Entropy ``H = -sum p log p`` (no cancellation, unlike
    ``logsumexp(z) - sum p z``)."""
    z_y = z.gather(-1, index[:, None])[:, 0]
    m = z.amax(dim=-1, keepdim=True)
    shifted = z.sub_(m)
    if keep:
        p = torch.exp(shifted)
    elif with_entropy:
        p = torch.exp(shifted, out=pbuf[: z.shape[0]])
    else:
        p = shifted.exp_()  # only its sum is needed
    s = p.sum(dim=-1, keepdim=True)
    if not (keep or with_entropy):
        return m[:, 0], s[:, 0], z_y, None, None
    p.div_(s)
    entropy = -shifted.sub_(s.log()).mul_(p).sum(dim=-1) if with_entropy else None  # shifted - log s = log p
    return m[:, 0], s[:, 0], z_y, (p if keep else None), entropy


class _LinearLogSoftmax(torch.autograd.Function):
    """Forward saves ``h``, ``W``, the index, the fp32 max and sum of ``exp(z - max)`` per row and, within
    ``keep_bytes``, the softmax of the first chunks; backward recomputes the softmax of the other chunks."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, index, temperature, chunk_size, compute_dtype, with_entropy, keep_bytes):
        rows = hidden.shape[0]
        dev = hidden.device
        w = weight.to(compute_dtype)
        b = None if bias is None else bias.to(compute_dtype)
        out = torch.promote_types(compute_dtype, torch.float32)
        shift, norm = torch.empty(rows, dtype=out, device=dev), torch.empty(rows, dtype=out, device=dev)
        logp = torch.empty(rows, dtype=out, device=dev)
        entropy = torch.empty(rows if with_entropy else 0, dtype=out, device=dev)
        kept, budget = [], keep_bytes
        buf = _logits_buffer(min(rows, chunk_size), weight, compute_dtype)
        pbuf = None  # the entropy's softmax of a chunk not kept, allocated on first use
        for start in range(0, rows, chunk_size):
            sl = slice(start, start + chunk_size)
            z = _chunk_logits(hidden[sl].to(compute_dtype), w, b, temperature, buf)
            keep = z.numel() * z.element_size() <= budget
            if with_entropy and not keep and pbuf is None:
                pbuf = torch.empty_like(z)
            shift[sl], norm[sl], z_y, p, ent = _softmax_stats(z, index[sl], keep, with_entropy, pbuf)
            logp[sl] = z_y - shift[sl] - norm[sl].log()
            if with_entropy:
                entropy[sl] = ent
            # the backward's softmax, for the first chunks while they fit: one [rows, V] matmul less each
            kept.append(p)
            budget = budget - p.numel() * p.element_size() if keep else 0
        ctx.save_for_backward(hidden, weight, bias, index, shift, norm)
        ctx.temperature, ctx.chunk_size, ctx.compute_dtype, ctx.kept = temperature, chunk_size, compute_dtype, kept
        ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_logp, _grad_entropy):
        hidden, weight, bias, index, shift, norm = ctx.saved_tensors
        cd, tau = ctx.compute_dtype, ctx.temperature
        w = weight.to(cd)
        b = None if bias is None else bias.to(cd)
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        grad_h = torch.zeros_like(hidden) if need_h else None
        acc = shift.dtype  # fp32 accumulation across chunks (fp64 for fp64 inputs)
        grad_w = torch.zeros(weight.shape, dtype=acc, device=weight.device) if need_w else None
        grad_b = torch.zeros(weight.shape[0], dtype=acc, device=weight.device) if need_b else None
        recompute = sum(p is None for p in ctx.kept) + max(0, -(-hidden.shape[0] // ctx.chunk_size) - len(ctx.kept))
        buf = _logits_buffer(min(hidden.shape[0], ctx.chunk_size), weight, cd) if recompute > 1 else None
        for i, start in enumerate(range(0, hidden.shape[0], ctx.chunk_size)):
            sl = slice(start, start + ctx.chunk_size)
            h = hidden[sl].to(cd)
            g_out = grad_logp[sl, None].to(acc)
            # d logp / d z = onehot - softmax(z); times 1/tau for the raw logits W h (+ b)
            if i < len(ctx.kept) and ctx.kept[i] is not None:  # the forward's softmax, freed as it is used
                g, ctx.kept[i] = ctx.kept[i], None
            else:  # not kept (or a second backward with retain_graph): recompute
                g = _chunk_logits(h, w, b, tau, buf).sub_(shift[sl, None]).exp_().div_(norm[sl, None])
            g.mul_(-g_out / tau).scatter_add_(-1, index[sl, None], g_out / tau)
            if need_h:
                grad_h[sl] = (g.to(cd) @ w).to(hidden.dtype)
            if need_w and cd == acc:
                grad_w.addmm_(g.t(), h)  # in place: no [V, H] temporary per chunk
            elif need_w:
                grad_w += (g.t().to(cd) @ h).to(acc)
            if need_b:
                grad_b += g.sum(dim=0)
        grad_w = None if grad_w is None else grad_w.to(weight.dtype)
        grad_b = None if grad_b is None else grad_b.to(bias.dtype)
        return grad_h, grad_w, grad_b, None, None, None, None, None, None


def _keep(keep_bytes: int | None) -> int:
    keep = KEEP_SOFTMAX_BYTES if keep_bytes is None else keep_bytes
    if keep < 0:
        raise ValueError(f"linear_log_softmax: keep_bytes={keep} must be >= 0 (0 keeps nothing)")
    return int(keep)


def linear_log_softmax(hidden: torch.Tensor, weight: torch.Tensor, index: torch.Tensor, *,
                       bias: torch.Tensor | None = None, temperature: float = 1.0, chunk_size: int = 1024,
                       compute_dtype: torch.dtype | None = None, with_entropy: bool = False,
                       keep_bytes: int | None = None):
    """``log softmax((hidden @ weight.T + bias) / temperature)[index]`` without the full logits.

    Shapes: ``hidden [..., H]``, ``weight [V, H]`` (an LM head / tied embedding), ``bias [V]`` or None,
    ``index [...]`` (long) -> ``(logp [...], entropy [...] or None)``, both fp32 for half inputs (fp64 for fp64).
    ``chunk_size`` rows at a time go through the head, in the forward and the backward. The matmul runs in
    ``compute_dtype`` (default: the weight's), the softmax in fp32 after dividing by ``temperature``.
    Differentiable (once) with respect to ``hidden``, ``weight`` and ``bias``; the entropy
    ``H = -sum softmax(z) log softmax(z)`` is a metric (no gradient).

    ``keep_bytes`` trades memory for time: the fp32 softmax of whole chunks, up to that many bytes in all, is
    kept from the forward (where the log-probs and the entropy already compute it) for the backward, which
    then skips that chunk's ``[chunk_size, V]`` recomputing matmul, a quarter of the head's arithmetic; the
    other chunks are recomputed. Each kept chunk is freed as the backward uses it. ``0`` keeps nothing (the
    least memory: a few ``[chunk_size, V]`` temporaries); None (default) is :data:`KEEP_SOFTMAX_BYTES`
    (512 MiB); nothing is kept without autograd (``no_grad``, or no input requiring a gradient).
    """
    if hidden.shape[:-1] != index.shape or hidden.shape[-1] != weight.shape[-1]:
        raise ValueError(f"linear_log_softmax: hidden {tuple(hidden.shape)} must be index {tuple(index.shape)} "
                         f"+ [H] with H = weight {tuple(weight.shape)}[1]")
    if temperature <= 0:
        raise ValueError(f"linear_log_softmax: temperature={temperature} must be > 0")
    flat_h = hidden.reshape(-1, hidden.shape[-1])
    flat_i = index.reshape(-1).to(torch.long)
    cd = weight.dtype if compute_dtype is None else compute_dtype
    grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (hidden, weight, bias))
    logp, entropy = _LinearLogSoftmax.apply(flat_h, weight, bias, flat_i, float(temperature),
                                            max(1, int(chunk_size)), cd, bool(with_entropy),
                                            _keep(keep_bytes) if grad else 0)
    return logp.reshape(index.shape), entropy.reshape(index.shape) if with_entropy else None
