"""The lean sampler computes what ``model.generate`` computes: same greedy tokens, same EOS/padding
behaviour, same sampling distribution; and it declines what it does not cover."""

from __future__ import annotations

import pytest
import torch

from grouprl.rollout.lean import _draw, _warp, lean_sample, unsupported_reason

PROMPTS = ["What is 10 + 2000?", "Hi", "The quick brown fox jumps over"]  # different lengths: left padding


def _load(path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(path).eval()
    tok = AutoTokenizer.from_pretrained(path)
    enc = tok(PROMPTS, return_tensors="pt", padding=True, add_special_tokens=False)
    return model, tok, enc["input_ids"], enc["attention_mask"]


def _hf(model, ids, mask, n, **gen):
    from transformers import GenerationConfig

    cfg = GenerationConfig(pad_token_id=0, **gen)
    out = model.generate(input_ids=ids.repeat_interleave(n, 0), attention_mask=mask.repeat_interleave(n, 0),
                         generation_config=cfg)
    return out[:, ids.shape[1]:]


@pytest.mark.parametrize("fixture", ["tiny_model_dir", "tiny_llama_dir"])
def test_greedy_tokens_equal_generate(fixture, request):
    model, tok, ids, mask = _load(request.getfixturevalue(fixture))
    assert unsupported_reason(model) is None
    ref = _hf(model, ids, mask, 2, max_new_tokens=24, do_sample=False, eos_token_id=tok.eos_token_id)
    got = lean_sample(model, ids, mask, 2, max_new_tokens=24, temperature=0,
                      eos_token_ids=[tok.eos_token_id], pad_token_id=0)
    assert torch.equal(got, ref)


def test_eos_padding_and_early_stop_equal_generate(tiny_model_dir):
    model, tok, ids, mask = _load(tiny_model_dir)
    free = _hf(model, ids, mask, 1, max_new_tokens=12, do_sample=False, eos_token_id=tok.eos_token_id)
    # make tokens that greedy decoding actually emits act as EOS (a random tiny model repeats one token
    # per row, so rows 0 and 1 stop at their first token unless min_new_tokens masks it)
    eos = sorted({int(free[0, 3]), int(free[1, 6])})
    for min_new in (0, 5):
        ref = _hf(model, ids, mask, 1, max_new_tokens=12, min_new_tokens=min_new, do_sample=False,
                  eos_token_id=eos)
        got = lean_sample(model, ids, mask, 1, max_new_tokens=12, min_new_tokens=min_new, temperature=0,
                          eos_token_ids=eos, pad_token_id=0)
        assert torch.equal(got, ref), (min_new, got, ref)
        assert not torch.isin(got[:, :min_new], torch.tensor(eos)).any()  # EOS masked before min_new_tokens
        if min_new == 0:  # rows 0 and 1 emit an EOS id at once: they stop and are padded, row 2 runs on
            assert got[:2, 0].tolist() == eos and (got[:2, 1:] == 0).all() and (got[2] != 0).all()


@pytest.mark.parametrize("top_k, top_p", [(0, 1.0), (20, 1.0), (0, 0.5)])
def test_first_token_distribution_matches_generates_warpers(tiny_model_dir, top_k, top_p):
    from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    model, tok, ids, mask = _load(tiny_model_dir)
    temperature, n = 0.7, 4000
    with torch.no_grad():
        logits = model(input_ids=ids[:1], attention_mask=mask[:1]).logits[:, -1].float()
    warped = TemperatureLogitsWarper(temperature)(ids[:1], logits)
    if top_k:
        warped = TopKLogitsWarper(top_k)(ids[:1], warped)
    if top_p < 1:
        warped = TopPLogitsWarper(top_p)(ids[:1], warped)
    probs = torch.softmax(warped[0], -1)  # what generate samples from
    torch.testing.assert_close(torch.softmax(_warp(logits, temperature, top_k, top_p)[0], -1), probs)
    gen = torch.Generator().manual_seed(0)
    first = lean_sample(model, ids[:1], mask[:1], n, max_new_tokens=1, temperature=temperature, top_k=top_k,
                        top_p=top_p, eos_token_ids=[], generator=gen)[:, 0]
    assert probs[first].min() > 0  # nothing outside the top-k / nucleus is ever drawn
    freq = torch.bincount(first, minlength=probs.numel()).float() / n
    # total variation distance of 4000 draws over ~370 tokens: ~0.1 expected; a wrong
    # temperature or an off-by-one index gives far more
    tv = 0.5 * (freq - probs).abs().sum()
    assert tv < 0.15, float(tv)
    assert abs(float((first == int(probs.argmax())).float().mean()) - float(probs.max())) < 0.03


def test_draw_inverts_the_cdf_and_never_picks_zero_probability():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2, 0.0]])).repeat(20000, 1)
    gen = torch.Generator().manual_seed(1)
    tokens = _draw(logits, 1.0, gen)
    freq = torch.bincount(tokens, minlength=4).float() / tokens.numel()
    assert freq[3] == 0
    assert torch.allclose(freq[:3], torch.tensor([0.5, 0.3, 0.2]), atol=0.015)
    assert torch.equal(_draw(logits[:3], 0.0, gen), torch.zeros(3, dtype=torch.long))


def test_declines_what_it_does_not_cover(tiny_model_dir):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, GPT2Config

    model, *_ = _load(tiny_model_dir)
    gpt2 = AutoModelForCausalLM.from_config(GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=16))
    assert "architecture" in unsupported_reason(gpt2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert unsupported_reason(model) == "autocast is active"
    lora = get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj"]))
    assert unsupported_reason(lora.base_model.model) is not None
