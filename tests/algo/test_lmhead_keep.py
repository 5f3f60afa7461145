"""The chunked LM head keeps the forward's softmax for the backward (``keep_bytes``) with the same numbers.

``grouprl.algo.lmhead.linear_log_softmax`` either keeps each chunk's fp32 softmax from the forward (within
``keep_bytes``) or recomputes the chunk's logits in the backward. Both must give the log-probs, entropy and
gradients of the plain ``log_softmax`` over full logits: within 1e-5 (relative to each tensor's largest
entry) in fp32 and 1e-10 in fp64, whatever part of the chunks is kept. The entropy is
``-sum p log p``, exact where ``logsumexp(z) - sum p z`` cancels (one dominant logit far from 0).
"""

from __future__ import annotations

import pytest
import torch

from grouprl.algo import lmhead
from grouprl.algo.lmhead import linear_log_softmax

R, H, V, CHUNK = 10, 6, 50, 4  # chunks of 4, 4 and 2 rows
CHUNK_BYTES = CHUNK * V * 4  # one full fp32 chunk's softmax


def _inputs(dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = (torch.randn(2, R // 2, H, generator=g, dtype=torch.float64) * 2).to(dtype).requires_grad_()
    w = (torch.randn(V, H, generator=g, dtype=torch.float64) * 2).to(dtype).requires_grad_()
    b = torch.randn(V, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
    idx = torch.randint(0, V, (2, R // 2), generator=g)
    weights = torch.randn(2, R // 2, generator=g, dtype=torch.float64).to(dtype)
    return h, w, b, idx, weights


def _run(fn, h, w, b, idx, weights):
    for t in (h, w, b):
        t.grad = None
    logp, entropy = fn(h, w, b, idx)
    (logp * weights).sum().backward()
    return logp.detach(), entropy.detach(), h.grad.clone(), w.grad.clone(), b.grad.clone()


def _plain(h, w, b, idx):
    logq = torch.log_softmax((h @ w.t() + b) / 0.7, dim=-1)
    return logq.gather(-1, idx[..., None])[..., 0], -(logq.exp() * logq).sum(-1)


def _close(got, want, tol):
    for a, e in zip(got, want, strict=True):
        torch.testing.assert_close(a, e, rtol=0, atol=tol * max(1.0, float(e.abs().max())))


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.float64, 1e-10)])
@pytest.mark.parametrize("keep_bytes", [0, CHUNK_BYTES, 2 * CHUNK_BYTES + 1, 10**9])
def test_kept_and_recomputed_softmax_equal_the_plain_log_softmax(dtype, tol, keep_bytes):
    inputs = _inputs(dtype)
    want = _run(_plain, *inputs)
    got = _run(lambda h, w, b, idx: linear_log_softmax(h, w, idx, bias=b, temperature=0.7, chunk_size=CHUNK,
                                                       with_entropy=True, keep_bytes=keep_bytes), *inputs)
    _close(got, want, tol)


@pytest.mark.parametrize("keep_bytes, recomputed", [(0, 3), (CHUNK_BYTES, 2), (2 * CHUNK_BYTES, 1),
                                                    (2 * CHUNK_BYTES + 2 * V * 4, 0), (None, 0)])
def test_backward_recomputes_only_the_chunks_not_kept(monkeypatch, keep_bytes, recomputed):
    """10 rows in chunks of 4, 4, 2 (800, 800, 400 bytes of fp32 softmax): whole chunks are kept, first
    to last, while they fit; the backward recomputes the logits (one matmul) of the rest only."""
    calls = []
    real = lmhead._chunk_logits
    monkeypatch.setattr(lmhead, "_chunk_logits", lambda h, *a: calls.append(h.shape[0]) or real(h, *a))
    h, w, b, idx, weights = _inputs(torch.float32)
    logp, _ = linear_log_softmax(h, w, idx, bias=b, chunk_size=CHUNK, keep_bytes=keep_bytes)
    assert calls == [4, 4, 2]
    (logp * weights).sum().backward()
    assert len(calls) == 3 + recomputed
    assert all(p is None for p in logp.grad_fn.next_functions[0][0].kept)  # every kept chunk freed by the backward


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_second_backward_with_retain_graph_recomputes_and_gives_the_same_gradients(dtype):
    """The first backward uses the kept softmax ``exp(z - max) / sum``, the second recomputes it the same
    way from the saved max and sum: bit for bit the same gradients."""
    h, w, b, idx, weights = _inputs(dtype)
    logp, _ = linear_log_softmax(h, w, idx, bias=b, chunk_size=CHUNK, keep_bytes=10**9)
    (logp * weights).sum().backward(retain_graph=True)
    first = h.grad.clone(), w.grad.clone(), b.grad.clone()
    for t in (h, w, b):
        t.grad = None
    (logp * weights).sum().backward()
    for got, want in zip((h.grad, w.grad, b.grad), first, strict=True):
        assert torch.equal(got, want)


def test_nothing_is_kept_without_autograd(monkeypatch):
    monkeypatch.setattr(lmhead, "KEEP_SOFTMAX_BYTES", 10**9)
    h, w, b, idx, _ = _inputs(torch.float32)
    with torch.no_grad():
        seen = []
        real = lmhead._LinearLogSoftmax.forward
        monkeypatch.setattr(lmhead._LinearLogSoftmax, "forward",
                            staticmethod(lambda ctx, *a: seen.append(a[-1]) or real(ctx, *a)))
        linear_log_softmax(h, w, idx, bias=b, chunk_size=CHUNK)
    assert seen == [0]


def test_entropy_of_a_near_deterministic_row_has_no_cancellation():
    """Logits [1000, 980, 980] (h = 1, W = [[1000], [980], [980]]): p = (1, e^-20, e^-20) / (1 + 2 e^-20),
    H = 2 * 20 e^-20 / (1 + 2 e^-20) + log(1 + 2 e^-20) = 8.658e-8. ``logsumexp - sum p z`` is 1000 - 1000 in
    fp32 (0, or a rounding error of 6e-5); ``-sum p log p`` is off by the log(1 + 2 e^-20) = 4e-9 that the
    fp32 logsumexp rounds away, no more."""
    e = torch.exp(torch.tensor(-20.0, dtype=torch.float64))
    want = 2 * 20 * e / (1 + 2 * e) + torch.log1p(2 * e)
    for keep_bytes in (0, None):
        _, entropy = linear_log_softmax(torch.tensor([[1.0]]), torch.tensor([[1000.0], [980.0], [980.0]]),
                                        torch.tensor([0]), with_entropy=True, keep_bytes=keep_bytes)
        torch.testing.assert_close(entropy.double(), want.reshape(1), rtol=0, atol=5e-9)


def test_negative_keep_bytes_is_an_error():
    h, w, b, idx, _ = _inputs(torch.float32)
    with pytest.raises(ValueError, match="keep_bytes=-1"):
        linear_log_softmax(h, w, idx, keep_bytes=-1)
