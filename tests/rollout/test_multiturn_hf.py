"""``hf_generate_fn`` on a tiny random Qwen2: left padding, per-row budgets, stop tokens, a 2-turn trajectory."""

from __future__ import annotations

import pytest
import torch
from rollout_helpers import FakeEnv

from grouprl.rollout.base import SamplingParams
from grouprl.rollout.chat import stop_token_ids, tool_turn_ids
from grouprl.rollout.multiturn import MultiTurnParams, MultiTurnRollout, hf_generate_fn

GREEDY = SamplingParams(max_new_tokens=8, temperature=0.0)


@pytest.fixture(scope="module")
def model_and_tok(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir), AutoTokenizer.from_pretrained(tiny_model_dir)


def test_left_padded_batch_matches_single_prompts_and_respects_budgets(model_and_tok):
    model, tok = model_and_tok
    gen = hf_generate_fn(model, tok, stop_ids=[tok.pad_token_id])  # a stop id greedy decoding never reaches here
    prompts = [tok.encode("What is 1 + 2?"), tok.encode("Hi")]
    batched = gen(prompts, [6, 3], GREEDY)
    assert [len(r) for r in batched] == [6, 3]
    for prompt, budget, row in zip(prompts, [6, 3], batched):
        assert gen([prompt], budget, GREEDY)[0] == row  # padding does not change greedy tokens


def test_rows_end_after_their_first_stop_token(model_and_tok):
    model, tok = model_and_tok
    prompt = tok.encode("What is 1 + 2?")
    free = hf_generate_fn(model, tok, stop_ids=[tok.pad_token_id])([prompt], 8, GREEDY)[0]
    stop = free[2]
    cut = hf_generate_fn(model, tok, stop_ids=[stop])([prompt], 8, GREEDY)[0]
    assert cut == free[: free.index(stop) + 1]
    model.train()  # generate switches to eval mode and restores the mode it found
    hf_generate_fn(model, tok)([prompt], 2, SamplingParams(max_new_tokens=2, temperature=1.0, top_k=5, top_p=0.9))
    assert model.training
    model.eval()


def test_two_turn_trajectory_end_to_end(model_and_tok):
    model, tok = model_and_tok
    hf = hf_generate_fn(model, tok)
    seen = []
    first = tok.encode("<tool_call>f()</tool_call><|im_end|>")

    def generate(prompts, budgets, params):  # turn 1 is a scripted tool call, turn 2 the model itself
        seen.append([list(p) for p in prompts])
        return [first] * len(prompts) if len(seen) == 1 else hf(prompts, budgets, params)

    rollout = MultiTurnRollout(tok, generate, MultiTurnParams(max_turns=2, max_new_tokens=60), env_factory=FakeEnv)
    trajs = rollout.run([{"prompt": "What is 1 + 2?"}, {"prompt": "Hi"}], group_size=2,
                        params=SamplingParams(max_new_tokens=60, temperature=1.0))
    for t, prompt in zip(trajs, seen[1]):
        turn = tool_turn_ids(tok, t.messages[:2], t.messages[2:3], FakeEnv.tools)
        assert prompt == t.prompt_ids + first + turn  # token in: the sampled ids, then the tool turn
        second = t.completion_ids[len(first) + len(turn):]
        assert t.loss_mask == [1] * len(first) + [0] * len(turn) + [1] * len(second)
        assert 1 <= len(second) <= 60 - len(first) - len(turn) and t.num_turns == 2
        ended_by_stop = second[-1] in stop_token_ids(tok)  # <|im_end|> or <|endoftext|>
        assert t.end_reason in (("answered", "max_turns") if ended_by_stop else ("max_tokens",))
        assert t.tool_calls == [{"name": "f", "arguments": {}, "result": "7", "error": None}]


def test_the_lean_sampler_gives_the_tokens_generate_gives(model_and_tok, monkeypatch):
    model, tok = model_and_tok
    prompts = [tok.encode("What is 1 + 2?"), tok.encode("Hi"), tok.encode("<|im_start|>user\n7 * 8?")]
    plain = hf_generate_fn(model, tok, lean=False)(prompts, [8, 5, 7], GREEDY)
    monkeypatch.setattr(model, "generate", lambda **kw: pytest.fail("lean=True must not call generate"))
    lean = hf_generate_fn(model, tok, lean=True)(prompts, [8, 5, 7], GREEDY)
    assert lean == plain and all(len(r) <= b for r, b in zip(lean, [8, 5, 7]))
