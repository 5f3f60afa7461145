"""The tool-use warm start: demonstrations tokenized as the rollout builds them (tool replies masked),
a tiny build that loads and drives a multi-turn rollout, and unchanged cache keys of the older specs."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from grouprl.builtin.agent_demos import CALCULATOR_TOOLS, conversation_ids, tool_conversation, tool_examples
from grouprl.builtin.sft import batch as _batch
from grouprl.builtin.tiny import build_tokenizer
from grouprl.builtin.warmstart import INFO_FILE, WARMSTARTS, builtin_model_path
from grouprl.rollout.chat import assistant_turn_ids, prompt_ids, tool_turn_ids

ROW = {"prompt": [{"role": "user", "content": "What is 4817 * 36 + 529?"}], "answer": "173941",
       "work": "4817 * 36 + 529"}
TINY = dict(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, vocab_size=300, sft_rows=64, sft_steps=3,
            batch_size=8, warmup_steps=1)


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def test_demonstration_ids_are_the_rollouts_and_mask_the_tool_reply(tok):
    messages = tool_conversation(ROW, call=True)
    ids, mask = conversation_ids(tok, messages, CALCULATOR_TOOLS)
    # what MultiTurnRollout concatenates: prompt, sampled call, tool turn, sampled answer
    p = prompt_ids(tok, messages[:1], CALCULATOR_TOOLS)
    call = assistant_turn_ids(tok, messages[:1], messages[1], CALCULATOR_TOOLS)
    turn = tool_turn_ids(tok, messages[:2], messages[2:3], CALCULATOR_TOOLS)
    answer = assistant_turn_ids(tok, messages[:3], messages[3], CALCULATOR_TOOLS)
    assert ids == p + call + turn + answer
    assert mask == [0] * len(p) + [1] * len(call) + [0] * len(turn) + [1] * len(answer)
    assert tok.decode([i for i, m in zip(ids, mask) if m]) == (
        '<tool_call>calculator(expression="4817 * 36 + 529")</tool_call><|im_end|>Answer: 173941<|im_end|>')
    assert tok.decode(turn) == "\n<|im_start|>tool\n173941<|im_end|>\n<|im_start|>assistant\n"
    # the SFT labels: -100 on the prompt and the tool turn, the token ids on the assistant turns
    _, _, labels = _batch([(ids, mask)], [0], pad_id=tok.pad_token_id)
    assert labels[0].tolist() == [i if m else -100 for i, m in zip(ids, mask)]


def test_direct_answer_and_mistyped_call(tok):
    direct = tool_conversation(ROW, call=False)
    assert [m["role"] for m in direct] == ["user", "assistant"] and direct[1]["content"] == "Answer: 173941"
    ids, mask = conversation_ids(tok, direct)  # no tools listed: plain ChatML
    assert tok.decode(ids).startswith("<|im_start|>user\n") and sum(mask) == len(tok.encode("Answer: 173941")) + 1
    typo = tool_conversation(ROW, call=True, typo=("4817 * 36 + 729", "174141"))
    assert typo[1]["content"] == '<tool_call>calculator(expression="4817 * 36 + 729")</tool_call>'
    assert typo[2]["content"] == "174141" and typo[3]["content"] == "Answer: 174141"


def test_example_mix_follows_the_spec():
    spec = replace(WARMSTARTS["calculator"], sft_rows=2000)
    examples, accuracy = tool_examples(spec)
    calls = [m for m, _ in examples if len(m) == 4]
    no_tools = [m for m, tools in examples if tools is None]
    assert abs(len(calls) / 2000 - spec.tool_fraction) < 0.03
    assert all(len(m) == 2 for m in no_tools)  # only direct answers are shown without tools
    assert abs(len(no_tools) / (2000 - len(calls)) - spec.no_tools_fraction) < 0.04
    wrong = sum(m[1]["content"].split('"')[1] != m[0]["content"][8:-1] for m in calls)
    assert abs(wrong / len(calls) - spec.noise) < 0.04
    assert accuracy == pytest.approx(1 - wrong / 2000)  # direct answers are right, mistyped calls wrong


def test_older_specs_keep_their_cache_keys():
    # fields added for tool demonstrations enter the hash only when set
    assert WARMSTARTS["arithmetic"].digest() == "dbefbc085491"
    assert WARMSTARTS["countdown"].digest() == "a55b654de697"
    assert WARMSTARTS["calculator"].digest() != replace(WARMSTARTS["calculator"], tool_fraction=0.25).digest()


def test_tiny_tool_warmstart_builds_loads_and_rolls_out(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grouprl.envs.calculator import CalculatorEnv
    from grouprl.rollout.base import SamplingParams
    from grouprl.rollout.chat import check_prefix_preserving
    from grouprl.rollout.multiturn import MultiTurnParams, MultiTurnRollout, hf_generate_fn

    path = builtin_model_path("calculator", cache_dir=tmp_path, **TINY)
    info = json.loads((Path(path) / INFO_FILE).read_text())
    assert info["settings"]["environment"] == "calculator" and info["sft_loss_last"] < info["sft_loss_first"]
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    assert check_prefix_preserving(tok).ok
    assert len(tok.encode("tool")) == 1 and len(tok.encode("calculator")) == 1  # the template's words are tokens
    rollout = MultiTurnRollout(tok, hf_generate_fn(model, tok), MultiTurnParams(max_turns=2, max_new_tokens=24),
                               env_factory=CalculatorEnv)
    (traj,) = rollout.run([ROW], params=SamplingParams(max_new_tokens=24, temperature=0.0))
    assert traj.end_reason in ("answered", "max_tokens", "max_turns") and 0 < len(traj.completion_ids) <= 24
    assert tok.decode(traj.prompt_ids).startswith("<|im_start|>system\nTools: calculator(expression)<|im_end|>")


def test_masked_direct_answer_trains_the_format_not_the_digits(tok):
    direct = tool_conversation(ROW, call=False, mask_digits=True)
    assert direct[1]["mask_digits"] is True and direct[1]["content"] == "Answer: 173941"
    ids, mask = conversation_ids(tok, direct, CALCULATOR_TOOLS)
    trained = tok.decode([i for i, m in zip(ids, mask) if m])
    assert trained == "Answer: <|im_end|>"  # the six digits carry no loss, the format and end of turn do
    plain_ids, plain_mask = conversation_ids(tok, tool_conversation(ROW, call=False), CALCULATOR_TOOLS)
    assert plain_ids == ids and sum(plain_mask) - sum(mask) == 6
    # a tool call's copied reply stays trained
    call_ids, call_mask = conversation_ids(tok, tool_conversation(ROW, call=True, mask_digits=True), CALCULATOR_TOOLS)
    assert tok.decode([i for i, m in zip(call_ids, call_mask) if m]).endswith("Answer: 173941<|im_end|>")


def test_masked_decision_trains_the_call_but_not_the_choice_to_call(tok):
    call = tool_conversation(ROW, call=True, mask_decision=True)
    assert call[1]["mask_first"] is True
    ids, mask = conversation_ids(tok, call, CALCULATOR_TOOLS)
    full_ids, full_mask = conversation_ids(tok, tool_conversation(ROW, call=True), CALCULATOR_TOOLS)
    assert ids == full_ids and sum(full_mask) - sum(mask) == 1
    first = full_mask.index(1)  # the first sampled token: <tool_call>, the choice to call
    assert tok.decode([ids[first]]) == "<tool_call>" and mask[first] == 0 and mask[first + 1:] == full_mask[first + 1:]


def test_decision_fraction_sets_how_often_the_choice_to_call_is_trained():
    spec = replace(WARMSTARTS["calculator"], sft_rows=4000, tool_fraction=0.9, no_tools_fraction=0.5, noise=0.0,
                   decision_fraction=0.025)
    examples, accuracy = tool_examples(spec)
    calls = [m for m, _ in examples if len(m) == 4]
    decided = [m for m in calls if not m[1].get("mask_first")]
    assert abs(len(calls) / 4000 - 0.9) < 0.02 and abs(len(decided) / len(calls) - 0.025) < 0.01
    assert accuracy == 1.0  # no mistyped calls, direct answers right
