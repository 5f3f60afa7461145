"""ops: masked reductions, chunked selective log-softmax and entropy (values, gradients, memory)."""

from __future__ import annotations

import math

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from grouprl.algo import (
    entropy_from_logits,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
    selective_log_softmax,
)


def test_masked_sum_mean_ignore_padding_even_nan():
    x = torch.tensor([[1.0, 2.0, 3.0, float("nan")]])
    m = torch.tensor([[1, 1, 0, 0]])
    assert masked_sum(x, m).item() == 3.0  # 1 + 2
    assert masked_mean(x, m).item() == 1.5  # (1 + 2) / 2
    assert masked_mean(x, m, dim=-1).tolist() == [1.5]
    assert masked_mean(x, torch.zeros_like(m)).item() == 0.0  # empty mask -> 0, not NaN


def test_masked_var_and_whiten():
    # [1, 2, 3]: mean 2, squared deviations 1 + 0 + 1 = 2 -> population 2/3, unbiased 1
    x = torch.tensor([[1.0, 2.0, 3.0, 100.0]], dtype=torch.float64)
    m = torch.tensor([[1, 1, 1, 0]])
    assert masked_var(x, m, unbiased=False).item() == pytest.approx(2 / 3)
    assert masked_var(x, m).item() == pytest.approx(1.0)
    # whiten: (x - 2) / sqrt(1 + 1e-8) on the real tokens
    assert masked_whiten(x, m)[0, :3].tolist() == pytest.approx([-1.0, 0.0, 1.0], abs=1e-7)
    assert masked_whiten(x, m, shift_mean=False)[0, :3].tolist() == pytest.approx([1.0, 2.0, 3.0], abs=1e-7)


def test_selective_log_softmax_hand_numbers():
    # logits [0, ln 3] -> softmax [1/4, 3/4]: log p(1) = ln .75 = -.287682, log p(0) = ln .25 = -1.386294
    logits = torch.tensor([[[0.0, math.log(3.0)], [0.0, math.log(3.0)]]], dtype=torch.float64)
    out = selective_log_softmax(logits, torch.tensor([[1, 0]]))
    assert out.tolist()[0] == pytest.approx([math.log(0.75), math.log(0.25)], abs=1e-12)


@pytest.mark.parametrize("chunk_size", [1, 3, 7, 512])
def test_selective_log_softmax_matches_log_softmax_values_and_grads(chunk_size):
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 11, dtype=torch.float64, requires_grad=True)
    index = torch.randint(0, 11, (3, 5))
    ref = torch.log_softmax(logits, -1).gather(-1, index.unsqueeze(-1)).squeeze(-1)
    out = selective_log_softmax(logits, index, chunk_size=chunk_size)
    assert torch.allclose(out, ref, atol=1e-12)
    g_ref = torch.autograd.grad(ref.sum(), logits)[0]
    g_out = torch.autograd.grad(out.sum(), logits)[0]
    assert torch.allclose(g_out, g_ref, atol=1e-12)


def test_selective_log_softmax_bf16_is_upcast():
    torch.manual_seed(0)
    logits = (torch.randn(2, 4, 64) * 5).to(torch.bfloat16)
    index = torch.randint(0, 64, (2, 4))
    out = selective_log_softmax(logits, index, chunk_size=3)
    ref = torch.log_softmax(logits.double(), -1).gather(-1, index.unsqueeze(-1)).squeeze(-1)
    assert out.dtype == torch.float32
    assert torch.allclose(out.double(), ref, atol=1e-5)


def test_selective_log_softmax_gradcheck_and_bf16_gradient():
    # custom backward (onehot - softmax, chunked) against finite differences ...
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 5, dtype=torch.float64, requires_grad=True)
    index = torch.randint(0, 5, (2, 3))
    assert torch.autograd.gradcheck(lambda z: selective_log_softmax(z, index, chunk_size=2), (logits,))
    # ... and in bf16 against the fp64 reference gradient (bf16 gradient resolution ~ 1e-2 relative)
    z = (torch.randn(2, 4, 16) * 3).to(torch.bfloat16).requires_grad_(True)
    idx = torch.randint(0, 16, (2, 4))
    weights = torch.randn(2, 4)
    (g,) = torch.autograd.grad((selective_log_softmax(z, idx, chunk_size=3) * weights).sum(), z)
    z64 = z.detach().double().requires_grad_(True)
    ref = torch.log_softmax(z64, -1).gather(-1, idx.unsqueeze(-1)).squeeze(-1)
    (g_ref,) = torch.autograd.grad((ref * weights.double()).sum(), z64)
    assert g.dtype == torch.bfloat16
    assert torch.allclose(g.double(), g_ref, atol=2e-2)


def test_selective_log_softmax_saves_no_vocab_sized_copy_for_backward():
    # Every tensor autograd keeps for the backward of our op is either the logits themselves (same
    # storage) or at most one value per position; a naive log_softmax keeps a full [N, T, V] output.
    logits = torch.randn(4, 8, 1000, dtype=torch.bfloat16, requires_grad=True)
    index = torch.randint(0, 1000, (4, 8))
    saved = []

    def pack(tensor):
        saved.append(tensor)
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        out = selective_log_softmax(logits, index, chunk_size=5)
    extra = [t for t in saved if t.untyped_storage().data_ptr() != logits.untyped_storage().data_ptr()]
    assert max(t.numel() for t in extra) <= 4 * 8
    out.sum().backward()
    assert logits.grad.shape == logits.shape and torch.isfinite(logits.grad.float()).all()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        saved.clear()
        torch.log_softmax(logits, -1)
    assert max(t.numel() for t in saved) == logits.numel()  # the probe sees a naive full copy


def test_selective_log_softmax_shape_error():
    with pytest.raises(ValueError, match="must be index"):
        selective_log_softmax(torch.zeros(2, 3, 5), torch.zeros(2, 4, dtype=torch.long))


def _largest_single_allocation(fn) -> int:
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    return max((e.cpu_memory_usage for e in prof.events()), default=0)


def test_selective_log_softmax_never_allocates_full_vocab_copy():
    # A [4, 64, 4096] fp32 log-prob copy is 4 MiB. Chunks of 16 positions need 16 x 4096 x 4 = 256 KiB.
    # The profiler records each op's allocation; the naive log_softmax shows the full 4 MiB (so the probe
    # can see it), ours must stay at chunk size.
    torch.manual_seed(0)
    logits = torch.randn(4, 64, 4096)
    index = torch.randint(0, 4096, (4, 64))
    full = logits.numel() * 4
    naive = _largest_single_allocation(lambda: torch.log_softmax(logits, -1).gather(-1, index.unsqueeze(-1)))
    ours = _largest_single_allocation(lambda: selective_log_softmax(logits, index, chunk_size=16))
    assert naive >= full
    assert ours <= 16 * 4096 * 4


def test_entropy_hand_numbers_and_chunks():
    # softmax [1/4, 3/4]: H = .25 ln 4 + .75 ln(4/3) = .346574 + .215762 = .562335; uniform over 8: ln 8
    logits = torch.tensor([[[0.0, math.log(3.0)]]], dtype=torch.float64)
    assert entropy_from_logits(logits).item() == pytest.approx(0.562335, abs=1e-6)
    assert entropy_from_logits(torch.zeros(1, 1, 8)).item() == pytest.approx(math.log(8), abs=1e-6)
    torch.manual_seed(1)
    z = torch.randn(2, 5, 9, dtype=torch.float64)
    p = torch.softmax(z, -1)
    ref = -(p * torch.log_softmax(z, -1)).sum(-1)
    for chunk in (1, 4, 100):
        assert torch.allclose(entropy_from_logits(z, chunk_size=chunk), ref, atol=1e-12)
