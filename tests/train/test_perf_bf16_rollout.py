"""``rollout_dtype: bfloat16``: the lean sampler on a bf16 copy of the weights (made once per round), its own
log-probs as ``rollout_logp``, and the truncated-IS correction on by default for it."""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch
from test_perf_lean_sampler import PROMPTS, _load  # the same tiny model and left-padded prompts

from grouprl.config import GRPOConfig
from grouprl.errors import ConfigError
from grouprl.rollout.base import SamplingParams
from grouprl.rollout.lean import _decode, _prefill, copy_weights, lean_sample
from grouprl.train.engine.step import MicroBatch, batched_logps, mismatch_correction


def test_bf16_copy_is_a_copy_in_bf16_and_the_model_is_untouched(tiny_model_dir):
    model, *_ = _load(tiny_model_dir)
    w = copy_weights(model, torch.bfloat16)
    assert w.embed.dtype == w.head_w.dtype == w.layers[0][1].dtype == torch.bfloat16
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert w.embed.data_ptr() != model.model.embed_tokens.weight.data_ptr()


def test_greedy_bf16_tokens_match_fp32_in_most_positions(tiny_model_dir):
    model, tok, ids, mask = _load(tiny_model_dir)
    kw = dict(max_new_tokens=24, temperature=0, eos_token_ids=[], pad_token_id=0)
    fp32 = lean_sample(model, ids, mask, 2, **kw)
    bf16, logp = lean_sample(model, ids, mask, 2, weights=copy_weights(model, torch.bfloat16), return_logp=True, **kw)
    assert bf16.shape == fp32.shape == (6, 24) and logp.dtype == torch.float32
    assert (bf16 == fp32).float().mean() >= 0.75  # a few near-tied argmaxes may flip under bf16 rounding


@pytest.mark.parametrize("temperature, min_new", [(0.7, 0), (1.0, 3)])
def test_rollout_logp_are_the_samplers_own_logprobs(tiny_model_dir, temperature, min_new):
    model, tok, ids, mask = _load(tiny_model_dir)
    w = copy_weights(model, torch.bfloat16)
    kw = dict(max_new_tokens=10, min_new_tokens=min_new, temperature=temperature, pad_token_id=0)
    free = lean_sample(model, ids, mask, 3, weights=w, generator=torch.Generator().manual_seed(0), **kw)
    eos = [int(free[0, 4])]  # a token this sampler draws: row 0 ends early, others run on
    kw["eos_token_ids"] = eos
    out, logp = lean_sample(model, ids, mask, 3, weights=w, return_logp=True,
                            generator=torch.Generator().manual_seed(0), **kw)
    # replay: the same bf16 kernels fed the drawn tokens; log_softmax(logits / T) of each, read by hand
    with torch.inference_mode():
        state = _prefill(w, ids, mask, 3, 10)
        first_logits = state["logits"].clone()
        _, replay = _decode(w, state, 10, min_new, temperature, 0, 1.0, eos, 0, None, want_logp=True, forced=out)
    assert torch.equal(replay, logp)
    is_eos = torch.isin(out, torch.tensor(eos)).int()
    done = is_eos.cumsum(1) - is_eos > 0  # positions after a row's EOS
    assert done.any() and (logp[done] == 0).all() and (logp[~done] < 0).all()
    # the first token's log-prob, from the prefill logits by hand (no EOS mask: the trainer's softmax)
    first = torch.log_softmax(first_logits / temperature, -1).gather(1, out[:, :1]).squeeze(1)
    assert torch.allclose(logp[:, 0], first, atol=1e-6, rtol=0)
    # a plain transformers forward of a bf16 copy of the model scores them within bf16 rounding (other
    # kernel shapes round differently: ~3e-3 here, so not to 1e-6), and the fp32 trainer differs by ~1e-3
    T = out.shape[1]
    cmask = (~done).long()
    mb = MicroBatch(ids.repeat_interleave(3, 0), mask.repeat_interleave(3, 0), out, cmask, cmask, torch.zeros(9))
    (hf16,) = batched_logps(copy.deepcopy(model).to(torch.bfloat16), [mb], temperature, contextlib.nullcontext)
    (fp32,) = batched_logps(model, [mb], temperature, contextlib.nullcontext)
    real = cmask.bool()
    assert logp.shape == (9, T)
    assert float((hf16 - logp)[real].abs().max()) < 0.01
    assert 0 < float((fp32 - logp)[real].abs().mean()) < 0.01


def test_backend_copies_once_per_round_and_returns_rollout_logp(tiny_model_dir):
    from grouprl.rollout import make_backend

    model, tok, *_ = _load(tiny_model_dir)
    backend = make_backend("transformers", model, tok, rollout_dtype="bfloat16")
    params = SamplingParams(6, 1.0, 1.0, 0, 64)
    r1 = backend.generate(PROMPTS, 2, params)
    backend.generate(PROMPTS, 2, params)  # a resample in the same round reuses the copy
    assert backend.copies_made == 1
    assert r1.rollout_logp.shape == r1.completion_ids.shape and r1.rollout_logp.dtype == torch.float32
    assert (r1.rollout_logp[r1.completion_mask == 0] == 0).all() and (r1.rollout_logp[r1.completion_mask == 1] < 0).all()
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(2.0)  # "an optimizer step"
    backend.sync_weights(model)
    backend.generate(PROMPTS, 2, params)
    assert backend.copies_made == 2
    assert torch.equal(backend._copy.embed, model.model.embed_tokens.weight.detach().to(torch.bfloat16))
    fp32 = make_backend("transformers", model, tok)  # the default samples with the trainer's weights
    assert fp32.generate(PROMPTS, 2, params).rollout_logp is None and fp32.copies_made == 0


def test_correction_is_tis_by_default_and_the_identity_when_logps_agree():
    cfg = GRPOConfig(rollout_dtype="bfloat16")
    cfg.validate()
    fn = mismatch_correction(cfg)["correction"]
    assert fn is not None and fn.func.__name__ == "tis" and fn.keywords == {"cap": 2.0}
    old = torch.tensor([[-1.0, -2.0, -0.5], [-3.0, -0.1, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    weight, metrics = fn(old, old.clone(), mask)
    assert torch.equal(weight * mask, mask.float())
    assert float(metrics["logp_abs_diff"]) == 0.0 and float(metrics["is_weight_max"]) == 1.0
    # an explicit tis is accepted with the bf16 sampler (rejected with the fp32 transformers sampler)
    GRPOConfig(rollout_dtype="bfloat16", rollout_correction="tis").validate()
    with pytest.raises(ConfigError, match="rollout_correction"):
        GRPOConfig(rollout_correction="tis").validate()


@pytest.mark.parametrize("overrides, needle", [
    ({"rollout_dtype": "bf16"}, "rollout_dtype"),
    ({"rollout_dtype": "bfloat16", "lean_sampler": False}, "rollout_dtype"),
    ({"rollout_dtype": "bfloat16", "rollout_backend": "vllm"}, "rollout_dtype"),
    ({"rollout_dtype": "bfloat16", "environment": "calculator"}, "rollout_dtype"),
    ({"rollout_dtype": "bfloat16", "algorithm": "ppo"}, "rollout_dtype"),
])
def test_validation_names_the_field(overrides, needle):
    with pytest.raises(ConfigError, match=needle):
        GRPOConfig(**overrides).validate()


def test_training_logs_mismatch_metrics(fast_config, tiny_model_dir, train_rows):
    from train_helpers import char_reward, read_metrics

    from grouprl.train.algorithms.grpo import train

    cfg = fast_config(model=str(tiny_model_dir), rollout_dtype="bfloat16", steps_per_generation=4)
    model, tok, *_ = _load(tiny_model_dir)
    train(cfg, model.train(), tok, train_rows, [], [char_reward])
    rows = [r for r in read_metrics(cfg.output_dir) if "mismatch/logp_abs_diff" in r]
    assert len(rows) == 2
    for r in rows:
        assert 0 < r["mismatch/logp_abs_diff"] < 0.1 and 0.5 < r["mismatch/is_weight_mean"] < 1.5
