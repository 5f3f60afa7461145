"""Padding-free (packed) log-prob passes give the padded path's numbers (issue 17, "padding").

Packed path: each sequence's real prompt and completion tokens laid end to end in rows no wider than the
longest sequence, position ids restarting per sequence, ``attention_mask=None`` (transformers builds the
block-diagonal causal mask from the position ids). Checked against the padded chunked-head path and the
plain path (full padded batch, full logits) on tiny Llama and Qwen2 models with sdpa and eager attention,
ragged prompts and completions: log-probs, entropy and every parameter's gradient (fp32 to 1e-5, fp64 to
1e-10), the reference pass, a whole GRPO optimizer step with a KL term, the fallback where a model does
not honour packed position ids, and the config field.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from grouprl.config import GRPOConfig
from grouprl.errors import ConfigError
from grouprl.train.engine import packing
from grouprl.train.engine.packing import first_fit_decreasing, pack, packing_supported
from grouprl.train.engine.step import MicroBatch, batched_logps, completion_logps, lm_head_parts

V = 512


def _model(kind: str = "qwen2", attn: str = "sdpa", dtype=torch.float32):
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(kind, vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                               tie_word_embeddings=kind == "qwen2")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation=attn)
    with torch.no_grad():  # spread the logits so the softmax is not near-uniform
        model.get_output_embeddings().weight.mul_(8.0)
    return model.eval()


def _batch(seed: int = 1, n: int = 8, P: int = 9, T: int = 12):
    """n rows, prompts of 1..P real tokens (left padding), completions of 0..T (right padding; one empty)."""
    g = torch.Generator().manual_seed(seed)
    p_len = torch.randint(1, P + 1, (n,), generator=g)
    c_len = torch.randint(1, T + 1, (n,), generator=g)
    c_len[n // 2] = 0  # a row with no completion token
    c_len[0] = T  # one full-length completion: the trimmed batch keeps all T columns
    cols_p, cols_c = torch.arange(P)[None], torch.arange(T)[None]
    p_mask = (cols_p >= P - p_len[:, None]).long()
    c_mask = (cols_c < c_len[:, None]).long()
    return (torch.randint(3, V, (n, P), generator=g) * p_mask, p_mask,
            torch.randint(3, V, (n, T), generator=g) * c_mask, c_mask)


def _decoder_calls(model):
    """Records, for each decoder call, whether it got an attention mask and its input shape (after the
    model's packing probe, which runs once per model)."""
    packing_supported(model.model, model, V, torch.device("cpu"))
    calls = []
    handle = model.model.register_forward_pre_hook(
        lambda mod, args, kwargs: calls.append((kwargs.get("attention_mask") is None, tuple(kwargs["input_ids"].shape))),
        with_kwargs=True)
    return calls, handle


def _run(model, batch, weights, **kw):
    model.zero_grad(set_to_none=True)
    logp, entropy = completion_logps(model, *batch, 0.7, with_entropy=True, chunk_size=5, **kw)
    (logp * weights * batch[3]).sum().backward()
    return logp.detach(), entropy, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _assert_grads_close(got, want, rel):
    assert set(got) == set(want)
    for name, grad in want.items():
        torch.testing.assert_close(got[name], grad, rtol=0, atol=rel * max(1.0, float(grad.abs().max())), msg=name)


# ---- the layout -----------------------------------------------------------------------------------------
def test_first_fit_decreasing_by_hand():
    # longest first: 5 -> bin 0; 4 -> bin 1 (0 has 1 left); 3 -> bin 2; 2 -> bin 1 (4+2 = 6); 1 -> bin 0
    assert first_fit_decreasing([2, 5, 3, 4, 1], 6) == [[1, 4], [3, 0], [2]]
    assert first_fit_decreasing([3, 3, 3], 3) == [[0], [1], [2]]  # equal lengths at capacity: one per row


def test_pack_index_maps_by_hand():
    """Sequences of 5, 1 + 1, 2 + 1 tokens and one without completion, capacity 5 (the longest):
    row 0 = sequence 0; row 1 = sequence 2 then sequence 1; sequence 3 is left out."""
    prompt_ids = torch.tensor([[11, 12, 13], [0, 0, 14], [0, 15, 16], [0, 17, 18]])
    prompt_mask = (prompt_ids > 0).long()
    completion_ids = torch.tensor([[21, 22, 0], [23, 0, 0], [24, 0, 0], [0, 0, 0]])
    completion_mask = (completion_ids > 0).long()
    p = pack(prompt_ids, prompt_mask, completion_ids, completion_mask)
    assert p.rows_of == [[0], [2, 1]] and p.slots == 10
    assert p.input_ids.tolist() == [[11, 12, 13, 21, 22], [15, 16, 24, 14, 23]]
    assert p.position_ids.tolist() == [[0, 1, 2, 3, 4], [0, 1, 2, 0, 1]]
    # completion tokens in row-major mask order: 21, 22 (seq 0), 23 (seq 1), 24 (seq 2); each predicted by the
    # token before it in its own sequence: 13, 21, 14, 16 at flat packed indices 2, 3, 8, 6
    assert p.predict_index.tolist() == [2, 3, 8, 6]
    assert p.input_ids.reshape(-1)[p.predict_index].tolist() == [13, 21, 14, 16]


def test_pack_pads_a_short_row_as_its_own_sequence():
    """Capacity 5, sequences of 5 and 2 tokens: row 1 holds 2 real tokens, its tail restarts at 0 (so the
    mask keeps it apart) and holds token 0."""
    p = pack(torch.tensor([[11, 12, 13], [0, 0, 14]]), torch.tensor([[1, 1, 1], [0, 0, 1]]),
             torch.tensor([[21, 22], [23, 0]]), torch.tensor([[1, 1], [1, 0]]))
    assert p.input_ids.tolist() == [[11, 12, 13, 21, 22], [14, 23, 0, 0, 0]]
    assert p.position_ids.tolist() == [[0, 1, 2, 3, 4], [0, 1, 0, 1, 2]]
    assert p.predict_index.tolist() == [2, 3, 5]
    wide = pack(torch.tensor([[11, 12, 13], [0, 0, 14]]), torch.tensor([[1, 1, 1], [0, 0, 1]]),
                torch.tensor([[21, 22], [23, 0]]), torch.tensor([[1, 1], [1, 0]]), capacity=8)
    assert wide.rows_of == [[0, 1]] and wide.position_ids.tolist() == [[0, 1, 2, 3, 4, 0, 1]]


def test_row_width_is_chosen_by_the_cost_estimate():
    """Sequences of 10, 3, 3, 3, 3 tokens. Rows of 10 (1x): [10], [3 3 3], [3] = 3 rows x 10. Rows of 15
    (1.5x): [10 3], [3 3 3] = 2 rows x 13. Rows of 20 (2x): [10 3 3 3], [3] = 2 rows x 19.
    row_cost = rows * W * (1 + W / (8 H)): with H = 1000 attention is cheap, 1.5x wins (26.04 < 30.04 <
    38.09); with H = 1 it is dear, 1x wins (67.5 < 68.25 < 128.25)."""
    assert packing.row_cost(3, 10, 1000) == pytest.approx(30.0375)
    assert packing.row_cost(2, 13, 1) == pytest.approx(68.25) and packing.row_cost(2, 13, None) == 26
    c_len = torch.tensor([9, 2, 2, 2, 2])
    c_mask = (torch.arange(9)[None] < c_len[:, None]).long()
    args = (torch.full((5, 1), 7), torch.ones(5, 1, dtype=torch.long), 8 * c_mask, c_mask)
    cheap = pack(*args, hidden_size=1000)
    assert cheap.rows_of == [[0, 1], [2, 3, 4]] and cheap.input_ids.shape == (2, 13)
    assert cheap.cost == pytest.approx(26 * (1 + 13 / 8000))
    assert pack(*args, hidden_size=1).rows_of == [[0], [1, 2, 3], [4]]
    assert pack(*args).rows_of == [[0], [1, 2, 3], [4]]  # no hidden size: rows of the longest sequence


def test_pack_refuses_what_it_cannot_lay_out():
    ids, ones = torch.tensor([[5, 6]]), torch.ones(1, 2, dtype=torch.long)
    assert pack(ids, torch.tensor([[1, 0]]), ids, ones) is None  # prompt mask is not left padding
    assert pack(ids, ones, ids, torch.tensor([[0, 1]])) is None  # completion mask with a hole
    assert pack(ids, torch.zeros(1, 2, dtype=torch.long), ids, ones) is None  # a completion without prompt
    assert pack(ids, ones, ids, torch.zeros(1, 2, dtype=torch.long)) is None  # no completion token at all


# ---- the numbers ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["qwen2", "llama"])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_equals_padded_and_plain_paths_fp32(kind, attn):
    model = _model(kind, attn)
    batch = _batch()
    weights = torch.randn(batch[2].shape, generator=torch.Generator().manual_seed(3))
    calls, handle = _decoder_calls(model)
    packed = _run(model, batch, weights, padding_free=True)
    handle.remove()
    assert calls == [(True, calls[0][1])] and calls[0][1][0] < 7  # one packed forward, fewer rows than sequences
    padded = _run(model, batch, weights, padding_free=False)
    plain = _run(model, batch, weights, plain=True)
    mask = batch[3].bool()
    assert packed[0].shape == packed[1].shape == (8, 12)
    assert plain[0][mask].std() > 1.0  # log-probs spread: the comparison is not between near-constants
    for want in (padded, plain):
        torch.testing.assert_close(packed[0][mask], want[0][mask], rtol=0, atol=1e-5)
        torch.testing.assert_close(packed[1][mask], want[1][mask], rtol=0, atol=1e-5)
        _assert_grads_close(packed[2], want[2], 1e-5)
    assert torch.equal(packed[0][~mask], padded[0][~mask]) and packed[0][~mask].abs().max() == 0  # zeros at padding
    assert set(packed[2]) == {n for n, _ in model.named_parameters()}  # every parameter gets its gradient


@pytest.mark.parametrize("kind", ["qwen2", "llama"])
def test_packed_equals_padded_in_fp64(kind):
    """In fp64 the two paths agree to 1e-10: what differs in fp32 is summation order only."""
    model = _model(kind, dtype=torch.float64)
    batch = _batch(seed=4)
    weights = torch.randn(batch[2].shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    packed = _run(model, batch, weights, padding_free=True)
    padded = _run(model, batch, weights, padding_free=False)
    mask = batch[3].bool()
    torch.testing.assert_close(packed[0], padded[0], rtol=0, atol=1e-10)
    torch.testing.assert_close(packed[1][mask], padded[1][mask], rtol=0, atol=1e-10)
    _assert_grads_close(packed[2], padded[2], 1e-10)


def test_packed_with_lora_and_activation_checkpointing_equals_padded():
    """A LoRA adapter (the LoRA reference pass runs the same model with it off) and activation checkpointing
    (the decoder layers recomputed in the backward with the packed position ids)."""
    from peft import LoraConfig, get_peft_model

    from grouprl.train.engine.model import enable_checkpointing

    batch = _batch(seed=13)
    weights = torch.randn(batch[2].shape, generator=torch.Generator().manual_seed(3))
    lora = get_peft_model(_model("qwen2"), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear",
                                                      init_lora_weights=False))
    checkpointed = _model("llama")
    enable_checkpointing(checkpointed)
    checkpointed.train()
    for model in (lora, checkpointed):
        decoder = lm_head_parts(model)[0]
        packing_supported(decoder, model, V, torch.device("cpu"))
        calls = []
        handle = decoder.register_forward_pre_hook(
            lambda mod, args, kwargs, calls=calls: calls.append(kwargs.get("attention_mask") is None),
            with_kwargs=True)
        packed = _run(model, batch, weights, padding_free=True)
        handle.remove()
        padded = _run(model, batch, weights, padding_free=False)
        assert calls[0] is True  # the packed forward ran (a checkpointed backward may call it again)
        torch.testing.assert_close(packed[0], padded[0], rtol=0, atol=1e-5)
        _assert_grads_close(packed[2], padded[2], 1e-5)
        assert model is not lora or any("lora" in n for n in packed[2])
    with lora.disable_adapter():  # the LoRA reference: the base weights
        ref = batched_logps(lora, [MicroBatch(*batch, batch[3], torch.zeros(8))], 0.7, contextlib.nullcontext,
                            chunk_size=5, padding_free=True)[0]
        want = batched_logps(lora, [MicroBatch(*batch, batch[3], torch.zeros(8))], 0.7, contextlib.nullcontext,
                             chunk_size=5, padding_free=False)[0]
    torch.testing.assert_close(ref, want, rtol=0, atol=1e-5)


def test_packed_under_bf16_autocast_and_with_bf16_weights():
    """bf16 (autocast, as ``bf16: true`` runs, or a bf16 reference's weights): packed rows still give the
    padded path's log-probs (fp32) within bf16 rounding."""
    batch = _batch(seed=8)
    mask = batch[3].bool()
    model = _model("qwen2")
    calls, handle = _decoder_calls(model)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        packed, _ = completion_logps(model, *batch, chunk_size=8, padding_free=True)
        padded, _ = completion_logps(model, *batch, chunk_size=8, padding_free=False)
    handle.remove()
    assert calls[0][0] is True and packed.dtype == torch.float32
    torch.testing.assert_close(packed[mask], padded[mask], rtol=0, atol=2e-2)
    bf16 = _model("llama", dtype=torch.bfloat16)
    assert packing_supported(bf16.model, bf16, V, torch.device("cpu"))
    packed, _ = completion_logps(bf16, *batch, chunk_size=8, padding_free=True)
    padded, _ = completion_logps(bf16, *batch, chunk_size=8, padding_free=False)
    torch.testing.assert_close(packed[mask], padded[mask], rtol=0, atol=2e-2)


def test_reference_pass_packs_and_equals_the_padded_pass():
    model = _model("llama").train()
    mbs = [MicroBatch(*_batch(seed=s), _batch(seed=s)[3], torch.zeros(8)) for s in (6, 7)]
    calls, handle = _decoder_calls(model)
    packed = batched_logps(model, mbs, 0.7, contextlib.nullcontext, chunk_size=4, padding_free=True)
    handle.remove()
    padded = batched_logps(model, mbs, 0.7, contextlib.nullcontext, chunk_size=4, padding_free=False)
    assert model.training  # back in the mode it was in
    assert [c[0] for c in calls] == [True, True]
    for got, want, mb in zip(packed, padded, mbs):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
        assert got[~mb.completion_mask.bool()].abs().max() == 0


def test_whole_grpo_optimizer_step_is_the_same_packed_or_padded():
    """A GRPO step with a k3 KL to a frozen reference (reference pass + policy forward/backward + update):
    the logged loss, KL, entropy, gradient norm and the updated weights agree."""
    from grouprl.builtins import load_builtins
    from grouprl.registry import AGGREGATIONS, KL_ESTIMATORS, POLICY_LOSSES
    from grouprl.rollout.base import Rollout
    from grouprl.train.algorithms.rounds import RoundBatch, RunContext, micro_batches
    from grouprl.train.engine.model import Reference
    from grouprl.train.engine.step import LossSpec, optimizer_step
    from grouprl.train.metrics import Timers

    load_builtins()
    p_ids, p_mask, c_ids, c_mask = _batch(seed=9)
    rollout = Rollout(p_ids, p_mask, c_ids, c_mask, c_mask.sum(1) == 12, [""] * 8, [""] * 8)
    adv = torch.linspace(-1, 1, 8)
    results = {}
    for mode in (True, False):
        model = _model("qwen2").train()
        reference = Reference(model)
        with torch.no_grad():  # the policy has moved away from the reference: KL > 0
            for p in model.parameters():
                p.add_(0.01 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
        cfg = GRPOConfig(num_generations=4, per_device_train_batch_size=4, gradient_accumulation_steps=2,
                         max_new_tokens=12, kl_coef=0.05, padding_free=mode)
        ctx = RunContext(cfg, model, None, None, None, None, reference, contextlib.nullcontext, None)
        mbs = micro_batches(ctx, RoundBatch(rollout, adv), Timers())
        spec = LossSpec(POLICY_LOSSES.get("grpo"), {"eps_low": 0.2, "eps_high": 0.28},
                        AGGREGATIONS.get("token_mean"), KL_ESTIMATORS.get("k3"), 0.05, 1.0, padding_free=mode)
        # SGD: the updated weights show the gradients. (AdamW divides each gradient by its own size, which
        # turns the rounding noise of gradients that are 0 in exact arithmetic -- k_proj.bias: softmax does
        # not depend on a key bias -- into full-size steps on either path.)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
        out = optimizer_step(ctx, mbs, spec, opt, sched, Timers())
        results[mode] = (out, [mb.ref_logp for mb in mbs], {k: v.clone() for k, v in model.state_dict().items()})
    (got, got_ref, got_w), (want, want_ref, want_w) = results[True], results[False]
    for a, b in zip(got_ref, want_ref):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    assert want["kl"] > 1e-6
    for key in ("loss/total", "loss/policy", "kl", "entropy", "grad_norm"):
        assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-8), key
    for name, w in want_w.items():
        torch.testing.assert_close(got_w[name], w, rtol=0, atol=1e-6, msg=name)


# ---- when packing is not used ---------------------------------------------------------------------------
def test_auto_packs_ragged_batches_only():
    model = _model("qwen2")
    calls, handle = _decoder_calls(model)
    completion_logps(model, *_batch(), chunk_size=8, padding_free="auto")  # ragged: packed
    ones = torch.ones(4, 6, dtype=torch.long)
    ids = torch.randint(3, V, (4, 6), generator=torch.Generator().manual_seed(0))
    completion_logps(model, ids, ones, ids, ones, chunk_size=8, padding_free="auto")  # no padding: padded path
    completion_logps(model, *_batch(), chunk_size=8, padding_free=False)
    completion_logps(model, *_batch(), chunk_size=0, padding_free=True)  # no chunked head: the model's forward
    handle.remove()
    assert [c[0] for c in calls] == [True, False, False, False]


def test_a_model_that_ignores_packed_position_ids_falls_back(monkeypatch):
    """Transformers before 4.54 (no ``find_packed_sequence_indices``) let packed sequences see each other;
    simulated here. The probe detects it and the padded path gives the right numbers."""
    import transformers.masking_utils as mu

    model = _model("llama")
    batch = _batch(seed=2)
    want, _ = completion_logps(model, *batch, chunk_size=8, padding_free=False)
    monkeypatch.setattr(mu, "find_packed_sequence_indices", lambda position_ids: None)
    fresh = _model("llama")  # not probed yet
    assert not packing_supported(fresh.model, fresh, V, torch.device("cpu"))
    calls, handle = _decoder_calls(fresh)
    got, _ = completion_logps(fresh, *batch, chunk_size=8, padding_free=True)
    handle.remove()
    assert [c[0] for c in calls] == [False]  # the padded path, with its attention mask
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    monkeypatch.undo()
    assert packing_supported(model.model, model, V, torch.device("cpu"))


def test_probe_refuses_a_decoder_without_position_ids():
    model = _model("qwen2")

    def decoder(input_ids, attention_mask=None, use_cache=False):  # no position_ids argument
        return model.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=use_cache)

    assert packing.packing_supported(decoder, torch.nn.Linear(1, 1), V, torch.device("cpu")) is False


# ---- the config field -----------------------------------------------------------------------------------
def test_padding_free_config_field(tmp_path):
    from grouprl.run.resume_config import SAFE

    assert GRPOConfig().padding_free == "auto"
    assert GRPOConfig(padding_free=False).padding_free is False
    path = tmp_path / "c.yaml"
    path.write_text("padding_free: true\n")
    assert GRPOConfig.from_yaml(path).padding_free is True
    for bad in ("yes", "on", 1, None):
        with pytest.raises(ConfigError, match=f"padding_free={bad!r} must be auto, true or false"):
            GRPOConfig(padding_free=bad)
    assert "padding_free" in SAFE  # the same numbers: may change on resume
