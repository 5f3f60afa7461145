"""HTTP behaviour and concurrency: keep-alive after errors, context limits, batching, disconnects, bounds."""

from __future__ import annotations

import concurrent.futures
import json
import socket
import time

import openai
import pytest
from serve_helpers import serving

USER = [{"role": "user", "content": "What is 2 + 3?"}]


def _raw(port: int, method: str, path: str, body: dict | None = None) -> bytes:
    data = json.dumps(body).encode() if body is not None else b""
    return (f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n").encode() + data


def _read_response(f) -> tuple[int, dict]:
    status = int(f.readline().split()[1])
    headers = {}
    while (line := f.readline().strip()):
        k, v = line.decode().split(":", 1)
        headers[k.lower()] = v.strip()
    return status, json.loads(f.read(int(headers["content-length"])))


def test_a_404_with_a_body_keeps_the_connection_usable(served):
    """Two requests on ONE socket: a POST to an unknown path with a body, then a valid chat request."""
    port = int(served[1].rsplit(":", 1)[1].split("/")[0])
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        s.sendall(_raw(port, "POST", "/v1/nope", {"model": "tiny", "messages": USER, "padding": "x" * 500}))
        s.sendall(_raw(port, "POST", "/v1/chat/completions", {"model": "tiny", "messages": USER, "max_tokens": 2,
                                                                "temperature": 0}))
        f = s.makefile("rb")
        first, second = _read_response(f), _read_response(f)
    assert first[0] == 404 and first[1]["error"]["code"] == "not_found"
    assert second[0] == 200 and second[1]["usage"]["completion_tokens"] == 2


def test_the_official_client_survives_errors_on_its_pooled_connection(client):
    for _ in range(3):
        with pytest.raises(openai.NotFoundError):
            client.post("/nope", body={"model": "tiny", "messages": USER}, cast_to=object)
        with pytest.raises(openai.BadRequestError):
            client.chat.completions.create(model="tiny", messages=[{"role": "wizard", "content": "x"}])
        ok = client.chat.completions.create(model="tiny", messages=USER, max_tokens=2, temperature=0)
        assert ok.usage.completion_tokens == 2


def test_a_request_past_the_context_is_refused_naming_the_limit(served, client, tiny):
    chat, context = served[0], tiny[0].config.max_position_embeddings
    words = 1
    while len(chat.prompt_ids([{"role": "user", "content": "7 " * words}])) < context - 10:
        words += 1
    near = [{"role": "user", "content": "7 " * words}]
    room = context - len(chat.prompt_ids(near))
    assert client.chat.completions.create(model="tiny", messages=near, max_tokens=room).usage.completion_tokens <= room
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=near, max_tokens=room + 1)
    assert e.value.code == "context_length_exceeded" and f"maximum context length is {context}" in e.value.message
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "7 " * context}], max_tokens=1)
    assert e.value.code == "context_length_exceeded"


def test_simultaneous_requests_are_batched_and_answer_as_if_alone(tiny):
    """8 clients at once: the engine decodes them together (its widest batch > 1), and each greedy reply is
    the one the same request gets alone (padding and cache merges change nothing)."""
    with serving(*tiny) as (chat, url):
        client = openai.OpenAI(base_url=url, api_key="x", max_retries=0, timeout=120)

        def ask(i: int) -> str:
            messages = [{"role": "user", "content": f"question {i} " * (1 + i % 3)}]
            return client.chat.completions.create(model="tiny", messages=messages, temperature=0,
                                                  max_tokens=12 + 4 * i).choices[0].message.content

        alone = [ask(i) for i in range(8)]
        assert chat.engine.stats["max_batch"] == 1
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            together = list(pool.map(ask, range(8)))
        assert together == alone
        assert chat.engine.stats["max_batch"] > 1
        steps_alone = sum(12 + 4 * i for i in range(8))
        assert chat.engine.stats["steps"] < 2 * steps_alone  # the batched pass took fewer steps than serial


def _wait_until(predicate, timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_a_client_that_disconnects_frees_its_slot(tiny):
    with serving(*tiny, max_new_tokens=400, max_batch=1, queue_timeout_s=30) as (chat, url):
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        body = {"model": "tiny", "messages": USER, "max_tokens": 400, "temperature": 0}
        s = socket.create_connection(("127.0.0.1", port), timeout=30)
        s.sendall(_raw(port, "POST", "/v1/chat/completions", body))
        assert _wait_until(lambda: len(chat.engine._rows) == 1)
        s.close()  # gone mid-generation
        assert _wait_until(lambda: chat.engine.stats["cancelled"] == 1 and not chat.engine._rows)
        # the single row is free again: the next request is answered at once
        client = openai.OpenAI(base_url=url, api_key="x", max_retries=0, timeout=60)
        assert client.chat.completions.create(model="tiny", messages=USER, max_tokens=3,
                                              temperature=0).usage.completion_tokens == 3
        stream = client.chat.completions.create(model="tiny", messages=USER, max_tokens=400, stream=True,
                                                temperature=0)
        next(iter(stream))
        stream.close()  # a streaming client that leaves
        assert _wait_until(lambda: chat.engine.stats["cancelled"] == 2 and not chat.engine._rows)


def test_a_request_that_waits_too_long_for_a_row_gets_503(tiny, monkeypatch):
    model, real = tiny[0], tiny[0].forward

    def slow(*args, **kwargs):  # every decode step takes >= 20 ms, so the long request holds its row
        time.sleep(0.02)  # for max_time_s however fast the machine (an idle CPU decodes 400 tokens in < 0.3 s)
        return real(*args, **kwargs)

    monkeypatch.setattr(model, "forward", slow)
    with serving(*tiny, max_new_tokens=400, max_batch=1, queue_timeout_s=0.3, max_time_s=3) as (chat, url):
        client = openai.OpenAI(base_url=url, api_key="x", max_retries=0, timeout=60)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            long = pool.submit(client.chat.completions.create, model="tiny", messages=USER, max_tokens=400,
                                temperature=0)
            assert _wait_until(lambda: len(chat.engine._rows) == 1)
            with pytest.raises(openai.InternalServerError) as e:
                client.chat.completions.create(model="tiny", messages=USER, max_tokens=2)
            assert e.value.status_code == 503 and "--max-batch" in e.value.message
            assert long.result(timeout=60).choices[0].finish_reason == "length"  # max_time_s bounds it


def test_n_above_the_batch_is_refused(tiny):
    with serving(*tiny, max_batch=2) as (_, url):
        client = openai.OpenAI(base_url=url, api_key="x", max_retries=0, timeout=60)
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="tiny", messages=USER, n=3)
        assert e.value.param == "n"


def test_oversized_and_malformed_bodies(served):
    import httpx2

    url = f"{served[1]}/chat/completions"
    assert httpx2.post(url, content=b"x" * (1 << 17), timeout=10).status_code == 413
    bad = httpx2.post(url, content=b"{not json", timeout=10, headers={"Content-Type": "application/json"})
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"
    assert httpx2.put(url, content=b"{}", timeout=10).status_code == 405


def test_a_model_whose_cache_cannot_be_merged_queues_new_requests_until_the_batch_drains(tiny):
    """Sliding-window cache layers cannot be left-padded and merged: requests then join between batches."""
    with serving(*tiny) as (chat, url):
        chat.engine._mergeable = False
        client = openai.OpenAI(base_url=url, api_key="x", max_retries=0, timeout=120)

        def ask(i: int) -> str:
            return client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": f"q {i}"}],
                                                  temperature=0, max_tokens=8 + 8 * i).choices[0].message.content

        alone = [ask(i) for i in range(4)]
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            assert list(pool.map(ask, range(4))) == alone
