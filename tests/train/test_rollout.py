"""The transformers backend: one batched generate for B*G rows, EOS handling and completion masks."""

from __future__ import annotations

import pytest
import torch

from grouprl.errors import ConfigError
from grouprl.rollout import SamplingParams, make_backend
from grouprl.rollout.hf import completion_mask_from_ids


def test_mask_stops_after_the_first_eos_and_flags_truncation():
    ids = torch.tensor([[5, 6, 9, 0, 0], [5, 9, 6, 9, 0], [5, 6, 7, 8, 4]])
    mask, truncated = completion_mask_from_ids(ids, eos_ids=[9])
    assert mask.tolist() == [[1, 1, 1, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 1]]
    assert truncated.tolist() == [False, False, True]
    mask, truncated = completion_mask_from_ids(torch.tensor([[3, 3, 9]]), eos_ids=[2, 9])
    assert mask.tolist() == [[1, 1, 1]] and truncated.tolist() == [False]  # EOS on the last allowed token


def test_generate_groups_rows_and_masks(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    backend = make_backend("transformers", model, tok, lean=False)  # generate itself (lean: test_perf_*)
    calls = []
    original = model.generate
    model.generate = lambda **kw: calls.append(kw["input_ids"].shape) or original(**kw)
    torch.manual_seed(0)
    out = backend.generate(["short", "a much longer prompt here"], 3, SamplingParams(max_new_tokens=6))
    assert calls == [torch.Size([6, out.prompt_ids.shape[1]])]  # B*G rows in one call
    assert out.prompts == ["short"] * 3 + ["a much longer prompt here"] * 3
    assert out.completion_ids.shape[0] == 6 and out.completion_ids.shape[1] <= 6
    assert (out.prompt_mask[:3, 0] == 0).all()  # left padding of the shorter prompt
    assert ((out.completion_mask == 0) <= (out.completion_ids == tok.pad_token_id)).all()  # pads after EOS
    lengths = out.completion_mask.sum(dim=1)
    assert (out.truncated == (lengths == 6) & ~torch.isin(out.completion_ids[:, -1], torch.tensor(backend.eos_ids))).all()
    torch.manual_seed(0)
    greedy = backend.generate(["short"], 2, SamplingParams(max_new_tokens=6, temperature=0.0))
    assert greedy.completions[0] == greedy.completions[1]


def test_unknown_backend_names_the_plugin_form():
    with pytest.raises(ConfigError, match="'package.module:Class'"):
        make_backend("sglang", None, None)
    with pytest.raises(ConfigError, match="cannot be loaded"):
        make_backend("no_such_module_xyz:Engine", None, None)


def test_min_new_tokens_forces_the_length(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    backend = make_backend("transformers", AutoModelForCausalLM.from_pretrained(tiny_model_dir), tok)
    out = backend.generate(["hi"], 4, SamplingParams(max_new_tokens=5, min_new_tokens=5))
    assert out.completion_mask.sum(dim=1).tolist() == [5, 5, 5, 5]


def test_sampling_uses_the_full_softmax_the_loss_uses(tiny_model_dir):
    """No hidden top-k (transformers' default is 50): sampled tokens' log-probs equal the trainer's."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grouprl.rollout.hf import generation_config
    from grouprl.train.engine.step import completion_logps

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    backend = make_backend("transformers", model, tok)
    cfg = generation_config(SamplingParams(max_new_tokens=5, temperature=0.8), tok.pad_token_id, backend.eos_ids)
    cfg.return_dict_in_generate, cfg.output_scores = True, True
    ids, mask = backend.tokenize_prompts(["What is 1 + 1?", "2"], None)
    torch.manual_seed(0)
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, generation_config=cfg)
        scores = torch.stack(out.scores, dim=1)  # processed logits: logits / T, nothing filtered
        assert torch.isfinite(scores).all()
        completion = out.sequences[:, ids.shape[1]:]
        cmask, _ = completion_mask_from_ids(completion, backend.eos_ids)
        logp, _ = completion_logps(model, ids, mask, completion, cmask, temperature=0.8)
    sampled = scores.log_softmax(-1).gather(-1, completion.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(logp * cmask, sampled * cmask, rtol=1e-4, atol=1e-4)
