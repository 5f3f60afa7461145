"""Structured output in ``grouprl serve``: the JSON-schema grammar, constrained decoding with a random tiny
model (every sample is schema-valid JSON), the endpoint's ``response_format``, and the judge client's
fallback for endpoints that refuse it."""

from __future__ import annotations

import json
import logging

import pytest
from fake_judge import FakeJudge

from grouprl.rewards.judge import judge_reward, parse_group, parse_pointwise, score_schema
from grouprl.serve.grammar import compile_schema, grammar_for, json_object_grammar

SCORE = score_schema(10.0)
GROUP4 = score_schema(10.0, 4)


@pytest.mark.parametrize("text, viable, complete", [
    ("", True, False),
    ('{"score": ', True, False),
    ('{"score": 1', True, False),   # 1 or 10 may follow
    ('{"score": 10', True, False),
    ('{"score": 10}', True, True),
    ('{"score": 11', False, False),  # over the maximum 10, and no digit can bring it back
    ('{"score": 01', False, False),  # no leading zeros in JSON
    ('{"score": -', False, False),   # minimum 0
    ('{"score": 7.', False, False),  # an integer schema
    ('{"score":7}', False, False),   # one canonical layout: ": " after a key
    ('{"score": 7}\n', False, False),
])
def test_pointwise_score_grammar_by_hand(text, viable, complete):
    g = compile_schema(SCORE)
    assert (g.viable(text), g.complete(text)) == (viable, complete)


def test_group_grammar_counts_items_and_bounds_numbers():
    g = compile_schema(GROUP4)
    assert g.next_chars('{"scores": [1, 2, 3') == {","}  # 30 is over 10; 4 items are due
    assert g.next_chars('{"scores": [1, 2, 1') == {"0", ","}
    assert g.next_chars('{"scores": [1, 2, 3, 4') == {"]"}
    assert not g.viable('{"scores": [1, 2]}')
    assert g.complete('{"scores": [1, 2, 3, 10]}')
    number = compile_schema({"type": "object", "properties": {"s": {"type": "number", "minimum": 0, "maximum": 1}}})
    assert number.complete('{"s": 0.75}') and number.viable('{"s": 1.') and not number.viable('{"s": 1.5')


def test_json_object_and_refusals():
    g = json_object_grammar()
    assert g.complete('{"a": [1, {"b": "x"}], "c": null}') and not g.viable('[1]')
    assert grammar_for(None) is None and grammar_for({"type": "text"}) is None
    with pytest.raises(ValueError, match="pattern"):
        compile_schema({"type": "string", "pattern": "a+"})  # never half-enforced
    with pytest.raises(ValueError, match="json_schema"):
        grammar_for({"type": "json_schema"})


@pytest.fixture(scope="module")
def chat(tiny_model_dir):
    import torch

    from grouprl.models import load_model, load_tokenizer
    from grouprl.serve.server import ChatServer

    torch.manual_seed(0)
    return ChatServer(load_model(str(tiny_model_dir), torch.device("cpu")), load_tokenizer(str(tiny_model_dir)),
                      name="tiny", max_new_tokens=64, max_time_s=30)


def _fmt(schema):
    return {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}


def test_a_random_model_always_writes_schema_valid_json(chat):
    """40 sampled replies (T=1.5, random weights: left alone it writes garbage) per schema, all parse."""
    user = [{"role": "user", "content": "Score the answers."}]
    for _ in range(40):
        text, _, n = chat.complete(user, 8, 1.5, _fmt(SCORE))
        assert parse_pointwise(text, 10.0)[0] is not None, text
        text, _, n = chat.complete(user, 8, 1.5, _fmt(GROUP4))
        scores, why = parse_group(text, 4, 10.0)
        assert None not in scores, (text, why)
        text, _, _ = chat.complete(user, 8, 1.5, {"type": "json_object"})
        assert isinstance(json.loads(text), dict), text


def test_remaining_counts_the_characters_that_close_the_json():
    g = compile_schema(GROUP4)
    assert g.remaining("") == len('{"scores": [0, 0, 0, 0]}')
    assert g.remaining('{"scores": [1, 2') == len(", 0, 0]}")
    assert g.remaining('{"scores": [1, 2, 3, 4]}') == 0 and g.remaining('{"scores": [1, 2, 3, 4]') == 1
    assert json_object_grammar().remaining('{"a": [1, "x') == len('"]}')


def test_a_tight_token_budget_still_closes_the_json(chat):
    """json_object lets a random model open strings and lists; with 12 tokens it must still finish."""
    chat_small = type(chat)(chat.model, chat.tokenizer, max_new_tokens=12)
    for _ in range(20):
        text, _, n = chat_small.complete([{"role": "user", "content": "x"}], 12, 1.5, {"type": "json_object"})
        assert isinstance(json.loads(text), dict) and n <= 12, text


def test_a_server_cap_below_the_shortest_json_is_refused(chat):
    tiny_cap = type(chat)(chat.model, chat.tokenizer, max_new_tokens=8)
    with pytest.raises(ValueError, match="--max-new-tokens"):
        tiny_cap.complete([{"role": "user", "content": "x"}], 8, 0.0, _fmt(SCORE))  # '{"score": 0}' is 12


def test_greedy_is_the_models_choice_among_allowed_tokens(chat):
    """Greedy constrained decoding = argmax over the allowed tokens at each step (checked step by step)."""
    import torch

    from grouprl.serve.constrained import TokenTexts

    user = [{"role": "user", "content": "Score it."}]
    text, _, _ = chat.complete(user, 8, 0.0, _fmt(SCORE))
    vocab, g = TokenTexts(chat.tokenizer), compile_schema(SCORE)
    ids, done = chat.prompt_ids(user), ""
    while done != text:
        with torch.no_grad():
            logits = chat.model(torch.tensor([ids])).logits[0, -1]
        allowed = [i for i, t in enumerate(vocab.texts) if t and g.viable(done + t)]
        best = max(allowed, key=lambda i: float(logits[i]))
        assert text.startswith(done + vocab.texts[best])
        done += vocab.texts[best]
        ids.append(best)


def test_the_endpoint_honours_response_format(tiny_judge_dir):
    import threading

    import httpx2
    import torch

    from grouprl.models import load_model, load_tokenizer
    from grouprl.serve.server import ChatServer, make_server

    chat = ChatServer(load_model(str(tiny_judge_dir), torch.device("cpu")), load_tokenizer(str(tiny_judge_dir)),
                      name="tiny", max_new_tokens=48, max_time_s=20)
    server = make_server(chat, "127.0.0.1", 0, socket_timeout_s=5)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    try:
        r = httpx2.post(f"{url}/chat/completions", timeout=60, json={
            "model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
            "response_format": _fmt(GROUP4)})
        assert r.status_code == 200
        assert len(json.loads(r.json()["choices"][0]["message"]["content"])["scores"]) == 4  # not cut at 2 tokens
        bad = httpx2.post(f"{url}/chat/completions", timeout=60, json={
            "model": "tiny", "messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "grammar"}})
        assert bad.status_code == 400 and "grammar" in bad.json()["error"]["message"]
        # the judge asks for its schema, so every score of a random model parses (group and pointwise)
        for mode in ("group", "pointwise"):
            out = judge_reward(["q"] * 4, ["a", "b", "c", "d"], base_url=url, model="tiny", mode=mode, timeout_s=60,
                               max_retries=0)
            assert all(s is not None and 0 <= s <= 1 for s in out), (mode, out)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_an_endpoint_that_refuses_response_format_is_asked_without_it(caplog):
    def behaviour(body):
        if "response_format" in body:
            return 400, "", 0.0, None
        return 200, '{"score": 8}', 0.0, None

    with FakeJudge(behaviour) as srv, caplog.at_level(logging.WARNING, logger="grouprl.rewards.judge"):
        first = judge_reward(["q"], ["a"], base_url=srv.base_url, model="hosted-refuses", max_retries=0)
        second = judge_reward(["q"], ["b"], base_url=srv.base_url, model="hosted-refuses", max_retries=0)
    assert first == [0.8] and second == [0.8]
    sent = ["response_format" in body for body, _ in srv.requests]
    assert sent == [True, False, False]  # refused once, then never sent again
    assert sum("refused response_format" in r.getMessage() for r in caplog.records) == 1


def test_a_prompt_past_the_context_is_no_refusal_of_response_format(caplog):
    """grouprl serve (like OpenAI) answers a prompt past the model's context with a 400 whose code is
    context_length_exceeded: that answer gets no opinion, and the schema is still asked for afterwards (one
    long answer must not switch structured output off for the rest of the run)."""
    too_long = json.dumps({"error": {"message": "This model's maximum context length is 512 tokens.",
                                     "type": "invalid_request_error", "param": "messages",
                                     "code": "context_length_exceeded"}})

    def behaviour(body):
        if "x" * 50 in body["messages"][-1]["content"]:
            return 400, too_long, 0.0, None
        return 200, '{"score": 7}', 0.0, None

    with FakeJudge(behaviour) as srv, caplog.at_level(logging.WARNING, logger="grouprl.rewards.judge"):
        long = judge_reward(["q"], ["x" * 60], base_url=srv.base_url, model="ctx", max_retries=2)
        short = judge_reward(["q"], ["b"], base_url=srv.base_url, model="ctx", max_retries=0)
    assert long == [None] and short == [0.7]
    assert ["response_format" in body for body, _ in srv.requests] == [True, True]  # not retried, not refused
    assert not any("refused response_format" in r.getMessage() for r in caplog.records)
    assert any("context_length_exceeded" in r.getMessage() for r in caplog.records)


def test_structured_false_sends_no_response_format():
    with FakeJudge(lambda body: (200, '{"score": 3}', 0.0, None)) as srv:
        assert judge_reward(["q"], ["a"], base_url=srv.base_url, model="plain", structured=False) == [0.3]
        assert judge_reward(["q"], ["a"], base_url=srv.base_url, model="plain2") == [0.3]
    (plain, _), (structured, _) = srv.requests
    assert "response_format" not in plain
    assert structured["response_format"]["json_schema"]["schema"] == SCORE
