"""Tool calling through the official client: tools in the prompt, tool_choice none / auto / required / named,
the model's blocks parsed by the rollouts' parser into tool_calls, and the history rendered as trained."""

from __future__ import annotations

import json

import openai
import pytest
from serve_helpers import CALC, Scripted, serving

USER = [{"role": "user", "content": "What is 4817 * 36 + 529?"}]
WEATHER = {"type": "function", "function": {
    "name": "weather", "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}}}}


@pytest.fixture(scope="module")
def scripted(tiny):
    model, tokenizer = tiny
    script = 'Let me compute.<tool_call>calculator(expression="4817 * 36 + 529")</tool_call>'
    policy = Scripted(model, tokenizer, script)
    with serving(policy, tokenizer) as (chat, url):
        policy.prompt_len = len(chat.prompt_ids(USER, [CALC]))
        yield chat, openai.OpenAI(base_url=url, api_key="x", max_retries=0, timeout=60)


def test_auto_parses_the_models_block_into_a_tool_call(scripted):
    chat, client = scripted
    r = client.chat.completions.create(model="tiny", messages=USER, tools=[CALC], temperature=0)
    choice = choice0 = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.id.startswith("call_") and call.type == "function" and call.function.name == "calculator"
    assert json.loads(call.function.arguments) == {"expression": "4817 * 36 + 529"}
    assert choice0.message.content == "Let me compute."


def test_streamed_tool_calls_hold_the_block_back(scripted):
    chat, client = scripted
    chunks = list(client.chat.completions.create(model="tiny", messages=USER, tools=[CALC], temperature=0, stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == "Let me compute."  # the block never leaks into content
    calls = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
    assert len(calls) == 1 and calls[0].index == 0 and calls[0].function.name == "calculator"
    assert json.loads(calls[0].function.arguments) == {"expression": "4817 * 36 + 529"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_the_next_turn_renders_the_exact_tokens_the_model_sampled(scripted):
    """The tool result goes back as OpenAI messages; the prompt the server builds is the rollout's: the
    model's own block text, then the tool turn as {"role": "tool", "name": ..., "content": ...}."""
    chat, client = scripted
    r = client.chat.completions.create(model="tiny", messages=USER, tools=[CALC], temperature=0)
    message = r.choices[0].message
    history = USER + [message.model_dump(exclude_none=True),
                      {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": "173941"}]
    from grouprl.serve.protocol import parse_request

    req = parse_request({"model": "tiny", "messages": history, "tools": [CALC]}, "tiny", chat.assistant_turn, 8)
    raw = 'Let me compute.<tool_call>calculator(expression="4817 * 36 + 529")</tool_call>'
    assert req.messages[1] == {"role": "assistant", "content": raw}
    assert req.messages[2] == {"role": "tool", "name": "calculator", "content": "173941",
                               "tool_call_id": message.tool_calls[0].id}
    from grouprl.rollout.chat import prompt_ids

    training = USER + [{"role": "assistant", "content": raw}, {"role": "tool", "name": "calculator", "content": "173941"}]
    assert chat.prompt_ids(req.messages, [CALC]) == prompt_ids(chat.tokenizer, training, [CALC])
    again = client.chat.completions.create(model="tiny", messages=history, tools=[CALC], max_tokens=3, temperature=0)
    assert again.usage.prompt_tokens == len(prompt_ids(chat.tokenizer, training, [CALC]))


def test_a_call_the_server_did_not_write_is_rendered_as_a_json_block(served):
    chat, _ = served
    from grouprl.serve.protocol import parse_request

    history = USER + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_client", "type": "function", "function": {"name": "calculator", "arguments": '{"expression": "1+1"}'}}]}]
    req = parse_request({"model": "tiny", "messages": history}, "tiny", chat.assistant_turn, 8)
    assert req.messages[1]["content"] == '<tool_call>{"name": "calculator", "arguments": {"expression": "1+1"}}</tool_call>'


def test_required_and_named_choices_are_constrained_to_one_valid_call(client):
    for choice, name in (("required", None), ({"type": "function", "function": {"name": "weather"}}, "weather")):
        for seed in range(3):
            r = client.chat.completions.create(model="tiny", messages=USER, tools=[CALC, WEATHER], tool_choice=choice,
                                               temperature=1.0, seed=seed, max_tokens=64)
            assert r.choices[0].finish_reason == "tool_calls", r.choices[0].message
            (call,) = r.choices[0].message.tool_calls
            assert call.function.name in ({name} if name else {"calculator", "weather"})
            args = json.loads(call.function.arguments)
            key = "city" if call.function.name == "weather" else "expression"
            assert set(args) == {key} and isinstance(args[key], str)


def test_none_never_calls_even_a_model_that_wants_to(scripted):
    _, client = scripted
    r = client.chat.completions.create(model="tiny", messages=USER, tools=[CALC], tool_choice="none", temperature=0,
                                       max_tokens=40)
    assert r.choices[0].message.tool_calls is None and "<tool_call>" not in r.choices[0].message.content
    assert r.choices[0].message.content.startswith("Let me compute.")


def test_parallel_tool_calls_false_keeps_one_call(tiny):
    model, tokenizer = tiny
    two = '<tool_call>calculator(expression="1+1")</tool_call><tool_call>calculator(expression="2+2")</tool_call>'
    policy = Scripted(model, tokenizer, two)
    with serving(policy, tokenizer) as (chat, url):
        policy.prompt_len = len(chat.prompt_ids(USER, [CALC]))
        client = openai.OpenAI(base_url=url, api_key="x", max_retries=0, timeout=60)
        both = client.chat.completions.create(model="tiny", messages=USER, tools=[CALC], temperature=0)
        one = client.chat.completions.create(model="tiny", messages=USER, tools=[CALC], temperature=0,
                                             parallel_tool_calls=False)
    assert [json.loads(c.function.arguments)["expression"] for c in both.choices[0].message.tool_calls] == ["1+1", "2+2"]
    assert [json.loads(c.function.arguments)["expression"] for c in one.choices[0].message.tool_calls] == ["1+1"]


@pytest.mark.parametrize("text, content, calls", [
    ('<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>', None, [("f", {"x": 1})]),
    ('ok <tool_call>f(x=2)</tool_call> done', "ok  done", [("f", {"x": 2})]),
    ("Answer: 7", "Answer: 7", []),
    ("<tool_call>f(</tool_call>", "<tool_call>f(</tool_call>", []),  # malformed: the client sees the text
    ('<tool_call>{"name": "f", "arguments": {}}', '<tool_call>{"name": "f", "arguments": {}}', []),  # unclosed
])
def test_extract_calls(text, content, calls):
    from grouprl.serve.tools import extract_calls

    got_content, got = extract_calls(text)
    assert got_content == content
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in got] == calls


def test_refusals_for_tools(client):
    bad = [({"tools": [{"type": "code_interpreter"}]}, "tools[0]"),
           ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools[0].function.name"),
           ({"tools": [CALC], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
           ({"tools": [CALC], "response_format": {"type": "json_object"}}, "response_format")]
    for kw, param in bad:
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="tiny", messages=USER, **kw)
        assert e.value.param == param, e.value.message


def test_the_end_of_turn_token_finishes_with_stop(tiny):
    model, tokenizer = tiny
    policy = Scripted(model, tokenizer, "Answer: 5")
    with serving(policy, tokenizer) as (chat, url):
        policy.prompt_len = len(chat.prompt_ids(USER))
        client = openai.OpenAI(base_url=url, api_key="x", max_retries=0, timeout=60)
        r = client.chat.completions.create(model="tiny", messages=USER, temperature=0, max_tokens=30)
    assert r.choices[0].finish_reason == "stop" and r.choices[0].message.content == "Answer: 5"
    assert r.usage.completion_tokens == len(tokenizer.encode("Answer: 5", add_special_tokens=False))


def test_a_streamed_required_call_arrives_as_tool_calls_only(client):
    chunks = list(client.chat.completions.create(model="tiny", messages=USER, tools=[CALC], tool_choice="required",
                                                 temperature=0, max_tokens=64, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == ""
    (call,) = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
    assert call.function.name == "calculator" and "expression" in json.loads(call.function.arguments)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
