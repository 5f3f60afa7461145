"""The token engine interface: the transformers engine (generate and the lean sampler) returns the ids it
sampled, the trainer's log-prob of each, and why it stopped; EngineBackend runs single-turn rounds on any
engine, carrying the engine's log-probs as rollout_logp."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from grouprl.rollout.base import SamplingParams
from grouprl.rollout.engine import Engine, EngineBackend, Generation, TransformersEngine


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval(), AutoTokenizer.from_pretrained(tiny_model_dir)


@torch.no_grad()
def logp_of(model, prompt, ids):
    logits = model(input_ids=torch.tensor([prompt + ids])).logits[0, len(prompt) - 1:-1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids)[:, None]).squeeze(-1)


@pytest.mark.parametrize("lean", [True, False])
def test_transformers_engine_reports_the_trainers_logprobs_and_finish_reasons(tiny, lean):
    model, tok = tiny
    stop = tok.convert_tokens_to_ids("<|im_end|>")
    engine = TransformersEngine(model, tok, lean=lean, stop_ids=[stop])
    prompts = [tok.encode("What is 1 + 2?"), tok.encode("Hello there, friend")]
    torch.manual_seed(0)
    gens = engine.generate(prompts, [7, 3], SamplingParams(7, temperature=1.0))
    assert [len(g.token_ids) <= b for g, b in zip(gens, [7, 3])] == [True, True]
    for prompt, g in zip(prompts, gens):
        g.check()
        assert g.finish_reason == ("stop" if g.token_ids[-1] == stop else "length")
        assert g.logprobs == pytest.approx(logp_of(model, prompt, g.token_ids).tolist(), abs=1e-4)
    assert engine.trainer_is_sampler


class Fixed(Engine):
    """Every request answers with ids 5, 6, 7 and log-prob -0.25 each."""

    def generate(self, prompt_ids, max_new_tokens, sampling):
        return [Generation([5, 6, 7], [-0.25] * 3, "length") for _ in prompt_ids]


def test_engine_backend_runs_single_turn_rounds_with_the_engines_logprobs(tiny):
    model, tok = tiny
    backend = EngineBackend(Fixed(model, tok), tok)
    r = backend.generate(["a b", "c"], 2, SamplingParams(3))
    assert r.completion_ids.tolist() == [[5, 6, 7]] * 4 and r.prompts == ["a b", "a b", "c", "c"]
    assert torch.equal(r.rollout_logp, torch.full((4, 3), -0.25)) and r.truncated.all()
    with pytest.raises(NotImplementedError, match="Engine.generate"):
        Engine().generate([[1]], 1, SamplingParams(1))
    with pytest.raises(ValueError, match="2 log-probs for 3 token ids"):
        Generation([1, 2, 3], [0.0, 0.0]).check()
