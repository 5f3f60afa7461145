"""The chat-completions surface through the official ``openai`` client: lengths, stop, n, seed, sampling,
log-probs, streaming, models, and the messages a client sends (null content, parts, tool turns)."""

from __future__ import annotations

import math

import openai
import pytest
import torch

USER = [{"role": "user", "content": "What is 2 + 3?"}]


def greedy(client, messages=USER, **kw):
    return client.chat.completions.create(model="tiny", messages=messages, temperature=0, **kw)


def test_max_tokens_and_max_completion_tokens_cut_the_reply_with_length(client):
    for key in ("max_tokens", "max_completion_tokens"):
        r = greedy(client, **{key: 5})
        assert r.choices[0].finish_reason == "length"
        assert r.usage.completion_tokens == 5 and r.usage.prompt_tokens > 0
        assert r.usage.total_tokens == r.usage.prompt_tokens + 5
        assert r.model == "tiny" and r.object == "chat.completion"


def test_stop_ends_the_reply_before_the_stop_string(client):
    full = greedy(client, max_tokens=24).choices[0].message.content
    word = next(c for c in full[1:] if c != "\ufffd")  # a character the greedy reply writes after its first
    r = greedy(client, max_tokens=24, stop=[word, "never-written"])
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].message.content == full[:full.index(word)]


def test_n_choices_and_the_same_seed_gives_the_same_replies(client):
    kw = {"model": "tiny", "messages": USER, "temperature": 1.0, "max_tokens": 12, "n": 3}
    a = client.chat.completions.create(seed=7, **kw)
    b = client.chat.completions.create(seed=7, **kw)
    c = client.chat.completions.create(seed=8, **kw)
    texts = [ch.message.content for ch in a.choices]
    assert [ch.index for ch in a.choices] == [0, 1, 2]
    assert texts == [ch.message.content for ch in b.choices]
    assert texts != [ch.message.content for ch in c.choices]
    assert len(set(texts)) > 1  # each choice draws with its own generator
    lengths = [ch.finish_reason == "length" for ch in a.choices]
    assert a.usage.completion_tokens == 36 if all(lengths) else a.usage.completion_tokens < 36
    one = client.chat.completions.create(**{**kw, "n": 1}, seed=7)
    assert one.choices[0].message.content == texts[0]


def test_a_tiny_top_p_keeps_only_the_most_likely_token(client):
    sampled = client.chat.completions.create(model="tiny", messages=USER, temperature=2.0, top_p=1e-6, max_tokens=12,
                                             seed=1)
    assert sampled.choices[0].message.content == greedy(client, max_tokens=12).choices[0].message.content


def test_logprobs_are_the_models_own(client, tiny):
    """The first token's log-prob and top-3 equal a direct forward pass over the same prompt ids."""
    model, tokenizer = tiny
    r = greedy(client, max_tokens=4, logprobs=True, top_logprobs=3)
    entries = r.choices[0].logprobs.content
    assert len(entries) == r.usage.completion_tokens == 4
    from grouprl.rollout.chat import prompt_ids

    ids = prompt_ids(tokenizer, USER)
    with torch.no_grad():
        lp = torch.log_softmax(model(torch.tensor([ids])).logits[0, -1].float(), -1)
    values, top = torch.topk(lp, 3)
    assert math.isclose(entries[0].logprob, float(values[0]), abs_tol=1e-4)  # greedy took the argmax
    assert [t.logprob for t in entries[0].top_logprobs] == pytest.approx(values.tolist(), abs=1e-4)
    assert entries[0].token == tokenizer.decode([int(top[0])])
    assert all(e.logprob <= 0 and len(e.top_logprobs) == 3 for e in entries)


def test_streaming_sends_the_same_reply_in_chunks_then_usage(client):
    whole = greedy(client, max_tokens=10)
    chunks = list(greedy(client, max_tokens=10, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 10
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 1  # really streamed


def test_streaming_n_choices_and_logprobs(client):
    chunks = list(client.chat.completions.create(model="tiny", messages=USER, max_tokens=6, n=2, seed=3, stream=True,
                                                 temperature=1.0, logprobs=True))
    plain = client.chat.completions.create(model="tiny", messages=USER, max_tokens=6, n=2, seed=3, temperature=1.0)
    for k in range(2):
        mine = [c.choices[0] for c in chunks if c.choices and c.choices[0].index == k]
        assert "".join(ch.delta.content or "" for ch in mine) == plain.choices[k].message.content
        assert sum(len(ch.logprobs.content) for ch in mine if ch.logprobs) == 6


def test_the_stream_ends_with_done(served):
    import httpx2

    body = {"model": "tiny", "messages": USER, "max_tokens": 3, "stream": True}
    with httpx2.stream("POST", f"{served[1]}/chat/completions", json=body, timeout=60) as r:
        assert r.headers["content-type"] == "text/event-stream"
        lines = [line for line in r.iter_lines() if line]
    assert lines[-1] == "data: [DONE]" and all(line.startswith("data: ") for line in lines)


def test_models_list_retrieve_and_an_unknown_model(client):
    assert [m.id for m in client.models.list()] == ["tiny"]
    assert client.models.retrieve("tiny").id == "tiny"
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-9", messages=USER)
    assert e.value.code == "model_not_found" and "tiny" in e.value.message
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-9")


def test_content_parts_null_content_and_tool_turns_in_the_history(client):
    parts = [{"role": "user", "content": [{"type": "text", "text": "What is "}, {"type": "text", "text": "2 + 3?"}]}]
    assert greedy(client, parts, max_tokens=6).choices[0].message.content == \
        greedy(client, max_tokens=6).choices[0].message.content
    history = USER + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "calculator", "arguments": '{"expression": "2+3"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "5"},
        {"role": "assistant", "content": "Answer: 5"},
        {"role": "user", "content": "And 2 + 4?"}]
    assert greedy(client, history, max_tokens=3).choices[0].finish_reason == "length"
    assert greedy(client, [{"role": "system", "content": "Be brief."}, {"role": "developer", "content": "x"}, *USER],
                  max_tokens=2).usage.completion_tokens == 2


@pytest.mark.parametrize("messages, param", [
    ([{"role": "wizard", "content": "hi"}], "messages[0].role"),
    ([{"role": "user"}], "messages[0].content"),
    ([{"role": "user", "content": None}], "messages[0].content"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}],
     "messages[0].content[0].type"),
    ([{"role": "tool", "tool_call_id": "call_x", "content": "5"}], "messages[0].tool_call_id"),
    ([{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{not json"}}]}],
     "messages[0].tool_calls[0].function.arguments"),
    ([], "messages"),
])
def test_bad_messages_are_refused_naming_the_field(client, messages, param):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=messages)
    assert e.value.param == param, e.value.message


@pytest.mark.parametrize("kw, param", [
    ({"frequency_penalty": 0.5}, "frequency_penalty"),
    ({"presence_penalty": 1.0}, "presence_penalty"),
    ({"logit_bias": {"5": 10}}, "logit_bias"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"temperature": 3.0}, "temperature"),
    ({"top_p": 0.0}, "top_p"),
    ({"n": 0}, "n"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": 4, "max_completion_tokens": 5}, "max_completion_tokens"),
    ({"extra_body": {"top_k": 5}}, "top_k"),
    ({"functions": [{"name": "f"}]}, "functions"),
    ({"response_format": {"type": "grammar"}}, "response_format"),
    ({"tool_choice": "required"}, "tool_choice"),
])
def test_unsupported_or_invalid_fields_are_refused_not_ignored(client, kw, param):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=USER, **kw)
    assert e.value.param == param, e.value.message


def test_response_format_through_the_client(client):
    schema = {"type": "object", "properties": {"score": {"type": "integer", "minimum": 0, "maximum": 9}},
              "required": ["score"], "additionalProperties": False}
    r = client.chat.completions.create(model="tiny", messages=USER, temperature=0, response_format={
        "type": "json_schema", "json_schema": {"name": "s", "schema": schema}})
    import json

    assert 0 <= json.loads(r.choices[0].message.content)["score"] <= 9


def test_streaming_with_stop_never_sends_the_stop_string(client):
    full = greedy(client, max_tokens=24).choices[0].message.content
    word = next(c for c in full[1:] if c != "\ufffd") + "zz"  # a stop string the reply starts but never completes
    stop = [full[full.index(word[0]):full.index(word[0]) + 1], word]
    plain = greedy(client, max_tokens=24, stop=stop).choices[0]
    chunks = list(greedy(client, max_tokens=24, stop=stop, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == plain.message.content
    assert chunks[-1].choices[0].finish_reason == plain.finish_reason == "stop"
