"""``grouprl serve``: the OpenAI-compatible endpoint over the tiny test model, and the judge talking to it."""

from __future__ import annotations

import json
import threading

import httpx2
import pytest

from grouprl.rewards.judge import judge_reward


@pytest.fixture(scope="module")
def served(tiny_model_dir):
    import torch

    from grouprl.models import load_model, load_tokenizer
    from grouprl.serve.server import ChatServer, make_server

    torch.manual_seed(0)
    chat = ChatServer(load_model(str(tiny_model_dir), torch.device("cpu")), load_tokenizer(str(tiny_model_dir)),
                      name="tiny", max_new_tokens=32, max_time_s=20)
    server = make_server(chat, "127.0.0.1", 0, max_body_bytes=4096, socket_timeout_s=5)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


def test_chat_completion_has_the_openai_shape(served):
    r = httpx2.post(f"{served}/v1/chat/completions", timeout=60, json={
        "model": "tiny", "messages": [{"role": "user", "content": "2+2="}], "max_tokens": 4})
    assert r.status_code == 200
    out = r.json()
    assert out["object"] == "chat.completion" and out["model"] == "tiny"
    assert isinstance(out["choices"][0]["message"]["content"], str)
    assert 1 <= out["usage"]["completion_tokens"] <= 4


def test_models_and_health(served):
    assert httpx2.get(f"{served}/v1/models", timeout=10).json()["data"][0]["id"] == "tiny"
    assert httpx2.get(f"{served}/health", timeout=10).json()["status"] == "ok"


@pytest.mark.parametrize("content, status", [
    (b"x" * 5000, 413),  # over max_body_bytes
    (b"{not json", 400),
    (json.dumps({"messages": "hi"}).encode(), 400),
])
def test_bad_requests_are_refused(served, content, status):
    r = httpx2.post(f"{served}/v1/chat/completions", content=content, timeout=10,
                    headers={"Content-Type": "application/json"})
    assert r.status_code == status and "error" in r.json()


def test_the_judge_runs_against_a_served_local_model(served):
    """A random tiny model is a useless judge, but a parsable one: the judge asks for its JSON schema, so each
    score is a number in [0, 1]. Without structured output its free text is mostly unusable (None, logged)."""
    out = judge_reward(["q", "q"], ["a", "b"], base_url=f"{served}/v1", model="tiny", max_tokens=8, timeout_s=60,
                       max_retries=0)
    assert len(out) == 2 and all(s is not None and 0 <= s <= 1 for s in out)
    free = judge_reward(["q", "q"], ["a", "b"], base_url=f"{served}/v1", model="tiny", max_tokens=8, timeout_s=60,
                        max_retries=0, structured=False)
    assert len(free) == 2 and all(s is None or 0 <= s <= 1 for s in free)


def test_the_cli_knows_serve():
    from grouprl.cli import build_parser

    args = build_parser().parse_args(["serve", "builtin:arithmetic", "--port", "0"])
    assert args.model == "builtin:arithmetic" and args.port == 0 and args.host == "127.0.0.1"


def test_grouprl_serve_command_starts_answers_and_stops(tiny_model_dir):
    """The real command in a subprocess: it prints its URL (port 0 = a free port) and answers the judge."""
    import os
    import queue
    import re
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "grouprl.cli", "serve", str(tiny_model_dir), "--port", "0", "--device", "cpu",
           "--max-new-tokens", "4", "--name", "tiny-judge"]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in proc.stderr], daemon=True).start()
    try:
        line = ""
        for _ in range(200):  # bounded: at most 200 waits of 2 s for the URL line
            try:
                line = lines.get(timeout=2)
            except queue.Empty:
                if proc.poll() is not None:
                    break
                continue
            if "serving" in line:
                break
        url = re.search(r"(http://127\.0\.0\.1:\d+/v1)", line)
        assert url, f"no URL printed: {line!r} (exit code {proc.poll()})"
        assert httpx2.get(url.group(1) + "/models", timeout=30).json()["data"][0]["id"] == "tiny-judge"
        out = judge_reward(["q"], ["a"], base_url=url.group(1), model="tiny-judge", timeout_s=60, max_retries=0)
        assert len(out) == 1 and (out[0] is None or 0 <= out[0] <= 1)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
