"""The chunked LM head and padding trimming give the numbers of the plain path (issue 17, "logits"/"padding").

Plain path: the whole padded batch through the model, full ``[N, T, V]`` logits, ``log_softmax``. Optimised
path: all-padding columns dropped, decoder to the last hidden state, the real completion tokens through
the head in chunks (``grouprl.algo.lmhead``), a hand-written backward. Checked in fp32 on tiny models
with a 32k vocabulary, rows of very different lengths and all-padding edge cases: log-probs and entropy at
the real tokens, and the gradient of every parameter, within 1e-5.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from grouprl.algo import lmhead
from grouprl.algo.lmhead import linear_log_softmax
from grouprl.train.engine.step import (
    LossSpec,
    MicroBatch,
    batched_logps,
    completion_logps,
    lm_head_parts,
    micro_batch_loss,
    step_totals,
    trim_padding,
)

V = 32768
SPREAD = 8.0  # head weights x8: log-probs from about -14 to 0, std > 1


def _model(kind: str = "qwen2", attn: str = "sdpa", **extra):
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(kind, vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                               **{"tie_word_embeddings": kind == "qwen2", **extra})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, attn_implementation=attn)
    with torch.no_grad():  # spread the logits so the softmax is not near-uniform
        model.get_output_embeddings().weight.mul_(SPREAD)
    return model.eval()


def _batch(seed: int = 1):
    """4 rows: prompts of 6, 2, 4, 6 tokens in 9 columns (left padding; column 0-2 padding in every row),
    completions of 7, 1, 0 (all padding) and 3 tokens in 10 columns (columns 7-9 padding in every row)."""
    g = torch.Generator().manual_seed(seed)
    P, T = 9, 10
    prompt_ids = torch.randint(3, V, (4, P), generator=g)
    completion_ids = torch.randint(3, V, (4, T), generator=g)
    prompt_mask = torch.zeros(4, P, dtype=torch.long)
    for row, n in enumerate((6, 2, 4, 6)):
        prompt_mask[row, P - n:] = 1
    completion_mask = torch.zeros(4, T, dtype=torch.long)
    for row, n in enumerate((7, 1, 0, 3)):
        completion_mask[row, :n] = 1
    prompt_ids = prompt_ids * prompt_mask  # pad id 0
    completion_ids = completion_ids * completion_mask
    return prompt_ids, prompt_mask, completion_ids, completion_mask


def _logps_and_grads(model, batch, weights, **kwargs):
    model.zero_grad(set_to_none=True)
    logp, entropy = completion_logps(model, *batch, 0.7, with_entropy=True, **kwargs)
    mask = batch[3].bool()
    (logp * weights * mask).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return logp.detach(), entropy, grads


def _assert_grads_close(got: dict, want: dict) -> None:
    """Each parameter's gradient within 1e-5 of the largest entry of that gradient (at least 1e-5)."""
    assert set(got) == set(want)
    for name, grad in want.items():
        scale = max(1.0, float(grad.abs().max()))
        torch.testing.assert_close(got[name], grad, rtol=0, atol=1e-5 * scale, msg=name)


@pytest.mark.parametrize("kind", ["qwen2", "llama"])
@pytest.mark.parametrize("chunk_size", [5, 1024])
@pytest.mark.parametrize("keep_bytes", [0, 4 * V * 4, 2**30])
def test_chunked_head_equals_plain_path(kind, chunk_size, keep_bytes, monkeypatch):
    """Tied (Qwen2) and untied (Llama) heads; a chunk smaller than one row's tokens and one holding all; the
    backward recomputing every chunk's softmax, only those after the first 4 rows, or none (keep_bytes)."""
    monkeypatch.setattr(lmhead, "KEEP_SOFTMAX_BYTES", keep_bytes)
    model = _model(kind)
    batch = _batch()
    weights = torch.randn(batch[2].shape, generator=torch.Generator().manual_seed(3))
    plain = _logps_and_grads(model, batch, weights, plain=True)
    fast = _logps_and_grads(model, batch, weights, chunk_size=chunk_size)
    mask = batch[3].bool()
    assert fast[0].shape == plain[0].shape == (4, 10)
    torch.testing.assert_close(fast[0][mask], plain[0][mask], rtol=0, atol=1e-5)
    torch.testing.assert_close(fast[1][mask], plain[1][mask], rtol=0, atol=1e-5)
    assert plain[0][mask].std() > 1.0  # the comparison is not between near-constant values
    assert fast[0][~mask].abs().max() == 0 and fast[1][~mask].abs().max() == 0  # padding: nothing computed
    assert set(fast[2]) == set(plain[2]) == {n for n, p in model.named_parameters()}  # every parameter
    _assert_grads_close(fast[2], plain[2])


def test_chunked_head_is_exact_in_fp64():
    """In fp64 both paths agree to rounding (1e-12): the fp32 differences above are summation order only.
    The reference is the plain forward kept in fp64 (``completion_logps(plain=True)`` casts logits to fp32)."""
    model = _model("llama").double()
    batch = _batch()
    mask = batch[3].bool()
    weights = torch.randn(batch[2].shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    ids, att = torch.cat([batch[0], batch[2]], 1), torch.cat([batch[1], batch[3]], 1)
    logits = model(input_ids=ids, attention_mask=att, position_ids=(att.cumsum(-1) - 1).clamp(min=0)).logits
    plain = torch.log_softmax(logits[:, -11:-1] / 0.7, -1).gather(-1, batch[2][..., None])[..., 0]
    (plain * weights * mask).sum().backward()
    plain_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    fast = _logps_and_grads(model, batch, weights, chunk_size=5)
    torch.testing.assert_close(fast[0][mask], plain.detach()[mask], rtol=0, atol=1e-12)
    for name, grad in plain_grads.items():
        torch.testing.assert_close(fast[2][name], grad, rtol=0, atol=1e-12, msg=name)


def test_trimming_alone_equals_plain_path():
    """chunk_size=0 (the logits_to_keep path) with trimming: same log-probs and gradients."""
    model = _model("qwen2")
    batch = _batch(seed=5)
    weights = torch.ones(batch[2].shape)
    plain = _logps_and_grads(model, batch, weights, plain=True)
    trimmed = _logps_and_grads(model, batch, weights, chunk_size=0)
    mask = batch[3].bool()
    torch.testing.assert_close(trimmed[0][mask], plain[0][mask], rtol=0, atol=1e-5)
    torch.testing.assert_close(trimmed[1][mask], plain[1][mask], rtol=0, atol=1e-5)
    _assert_grads_close(trimmed[2], plain[2])


def test_trim_padding_widths_and_edge_cases():
    p_ids, p_mask, c_ids, c_mask = _batch()
    tp, tpm, tc, tcm = trim_padding(p_ids, p_mask, c_ids, c_mask)
    assert tp.shape == (4, 6) and tc.shape == (4, 7)  # 3 all-pad prompt columns, 3 all-pad completion columns
    assert torch.equal(tpm, p_mask[:, 3:]) and torch.equal(tcm, c_mask[:, :7])
    # a batch with no prompt token and no completion token keeps one prompt column and no completion column
    tp, _, tc, _ = trim_padding(p_ids, torch.zeros_like(p_mask), c_ids, torch.zeros_like(c_mask))
    assert tp.shape == (4, 1) and tc.shape == (4, 0)


def test_all_padding_completions_give_zeros_and_zero_gradient():
    model = _model("qwen2")
    p_ids, p_mask, c_ids, c_mask = _batch()
    logp, entropy = completion_logps(model, p_ids, p_mask, c_ids, torch.zeros_like(c_mask), with_entropy=True)
    assert logp.shape == entropy.shape == (4, 10) and logp.abs().sum() == 0 and entropy.abs().sum() == 0


@pytest.mark.parametrize("keep_bytes", [0, 2**30])
def test_micro_batch_loss_and_gradients_equal_with_and_without_the_chunked_head(keep_bytes, monkeypatch):
    """The whole loss of a step (GRPO clip loss + k3 KL, token-mean over the step), optimised vs plain head;
    the chunked head's backward recomputing its softmax or using the one kept from the forward."""
    monkeypatch.setattr(lmhead, "KEEP_SOFTMAX_BYTES", keep_bytes)
    from grouprl.builtins import load_builtins
    from grouprl.registry import AGGREGATIONS, KL_ESTIMATORS, POLICY_LOSSES

    load_builtins()
    model = _model("qwen2")
    p_ids, p_mask, c_ids, c_mask = _batch(seed=7)
    mb = MicroBatch(p_ids, p_mask, c_ids, c_mask, c_mask.clone(), torch.tensor([1.0, -0.5, 0.3, -0.8]))
    with torch.no_grad():
        ref, _ = completion_logps(model, p_ids, p_mask, c_ids, c_mask, 0.7, plain=True)
    mb.ref_logp = ref + 0.05 * torch.randn(ref.shape, generator=torch.Generator().manual_seed(2))
    mb.old_logp = ref - 0.03
    totals = step_totals([mb], 10)
    out = {}
    for chunk in (0, 3):
        spec = LossSpec(POLICY_LOSSES.get("grpo"), {"eps_low": 0.2, "eps_high": 0.28},
                        AGGREGATIONS.get("token_mean"), KL_ESTIMATORS.get("k3"), 0.04, 0.7, logits_chunk_size=chunk)
        model.zero_grad(set_to_none=True)
        loss, sums = micro_batch_loss(model, mb, spec, totals)
        loss.backward()
        out[chunk] = (loss.detach(), sums, {n: p.grad.clone() for n, p in model.named_parameters()})
    torch.testing.assert_close(out[3][0], out[0][0], rtol=0, atol=1e-6)
    for key in ("kl", "entropy", "loss/policy"):
        torch.testing.assert_close(out[3][1][key], out[0][1][key], rtol=0, atol=1e-6)
    _assert_grads_close(out[3][2], out[0][2])


def test_reference_and_old_logp_passes_use_the_optimised_path():
    """batched_logps (reference / old policy) trims and chunks: equal to the plain forward at real tokens."""
    model = _model("llama")
    batch = _batch(seed=11)
    mb = MicroBatch(*batch, batch[3], torch.zeros(4))
    (fast,) = batched_logps(model, [mb], 0.7, contextlib.nullcontext, chunk_size=4)
    with torch.no_grad():
        plain, _ = completion_logps(model, *batch, 0.7, plain=True)
    mask = batch[3].bool()
    torch.testing.assert_close(fast[mask], plain[mask], rtol=0, atol=1e-5)


def test_lm_head_parts_only_for_plain_linear_heads():
    model = _model("qwen2")
    decoder, weight, bias = lm_head_parts(model)
    assert decoder is model.model and weight is model.lm_head.weight and bias is None
    # Gemma 2 soft-caps its logits (tanh): the head is not a plain linear map, so its own forward is used
    assert lm_head_parts(_model("gemma2", "eager", head_dim=8, final_logit_softcapping=30.0)) is None

    class Custom(type(model)):  # a subclass may change forward: not trusted
        def forward(self, *args, **kwargs):
            return super().forward(*args, **kwargs)

    assert lm_head_parts(Custom(model.config)) is None
    handle = model.register_forward_hook(lambda module, args, output: output)  # a hook sees the logits
    assert lm_head_parts(model) is None
    handle.remove()
    assert lm_head_parts(model) is not None
    inner = model.forward
    model.forward = lambda *a, **k: inner(*a, **k)  # a wrapper on the instance (a call counter, a tracer)
    assert lm_head_parts(model) is None


def test_lora_model_uses_the_chunked_head_and_matches_plain():
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(_model("qwen2"), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear",
                                                       init_lora_weights=False))
    assert lm_head_parts(model) is not None
    batch = _batch(seed=13)
    weights = torch.ones(batch[2].shape)
    plain = _logps_and_grads(model, batch, weights, plain=True)
    fast = _logps_and_grads(model, batch, weights, chunk_size=6)
    mask = batch[3].bool()
    torch.testing.assert_close(fast[0][mask], plain[0][mask], rtol=0, atol=1e-5)
    assert any("lora" in n for n in plain[2])
    _assert_grads_close(fast[2], plain[2])
    lora_on_head = get_peft_model(_model("qwen2", tie_word_embeddings=False),
                                  LoraConfig(r=4, target_modules=["lm_head", "q_proj"]))
    assert lm_head_parts(lora_on_head) is None  # the head is a LoRA layer: the model's own forward


def test_linear_log_softmax_gradcheck_and_hand_numbers():
    """fp64 gradcheck w.r.t. hidden, weight and bias; and log softmax([2, 0]/0.5)[0] = -log(1 + e^-4)."""
    g = torch.Generator().manual_seed(0)
    h = torch.randn(3, 4, 5, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(11, 5, dtype=torch.float64, generator=g, requires_grad=True)
    b = torch.randn(11, dtype=torch.float64, generator=g, requires_grad=True)
    idx = torch.randint(0, 11, (3, 4), generator=g)
    assert torch.autograd.gradcheck(
        lambda h, w, b: linear_log_softmax(h, w, idx, bias=b, temperature=0.7, chunk_size=5)[0], (h, w, b))
    logp, entropy = linear_log_softmax(torch.tensor([[1.0]]), torch.tensor([[2.0], [0.0]]), torch.tensor([0]),
                                       temperature=0.5, with_entropy=True)
    p = 1 / (1 + torch.exp(torch.tensor(-4.0)))
    torch.testing.assert_close(logp, torch.log(p).reshape(1))
    torch.testing.assert_close(entropy, (-(p * torch.log(p) + (1 - p) * torch.log(1 - p))).reshape(1))


def test_linear_log_softmax_bf16_inputs_give_fp32_logps_and_bf16_gradients():
    """bf16 head (a bf16 reference, or autocast): the matmul in bf16, log-softmax in fp32, gradients in the
    inputs' dtypes and close to the fp32 computation on the same bf16 values."""
    g = torch.Generator().manual_seed(0)
    h = torch.randn(6, 16, generator=g).bfloat16().requires_grad_()
    w = torch.randn(300, 16, generator=g).bfloat16().requires_grad_()
    idx = torch.randint(0, 300, (6,), generator=g)
    logp, _ = linear_log_softmax(h, w, idx, temperature=0.9, chunk_size=4)
    assert logp.dtype == torch.float32
    logp.sum().backward()
    assert h.grad.dtype == w.grad.dtype == torch.bfloat16
    h32, w32 = h.detach().float().requires_grad_(), w.detach().float().requires_grad_()
    want = torch.log_softmax((h32 @ w32.t()) / 0.9, -1).gather(-1, idx[:, None])[:, 0]
    want.sum().backward()
    torch.testing.assert_close(logp, want.detach(), rtol=0, atol=0.1)
    torch.testing.assert_close(h.grad.float(), h32.grad, rtol=0.05, atol=0.05)
    torch.testing.assert_close(w.grad.float(), w32.grad, rtol=0.05, atol=0.05)


def test_chunked_head_with_activation_checkpointing_equals_plain_path():
    from grouprl.train.engine.model import enable_checkpointing

    model = _model("qwen2")
    enable_checkpointing(model)
    model.train()  # checkpointing recomputes only in training mode; the tiny model has no dropout
    batch = _batch(seed=17)
    weights = torch.ones(batch[2].shape)
    plain = _logps_and_grads(model, batch, weights, plain=True)
    fast = _logps_and_grads(model, batch, weights, chunk_size=4)
    mask = batch[3].bool()
    torch.testing.assert_close(fast[0][mask], plain[0][mask], rtol=0, atol=1e-5)
    _assert_grads_close(fast[2], plain[2])
