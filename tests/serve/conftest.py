"""A ``grouprl serve`` endpoint over the tiny random test model, in a thread, and the official client."""

from __future__ import annotations

import contextlib
import threading

import pytest


@contextlib.contextmanager
def serving(model, tokenizer, **kw):
    """``(ChatServer, base URL)`` of a server on a free loopback port, stopped on exit."""
    from grouprl.serve.server import ChatServer, make_server

    chat = ChatServer(model, tokenizer, **{"name": "tiny", "max_new_tokens": 64, "max_time_s": 30, **kw})
    server = make_server(chat, "127.0.0.1", 0, max_body_bytes=1 << 16, socket_timeout_s=10)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield chat, f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()
        chat.close()
        thread.join(timeout=5)


@pytest.fixture(scope="session")
def tiny(tiny_model_dir):
    import torch

    from grouprl.train.model import load_model, load_tokenizer

    torch.manual_seed(0)
    return load_model(str(tiny_model_dir), torch.device("cpu")), load_tokenizer(str(tiny_model_dir))


@pytest.fixture(scope="module")
def served(tiny):
    with serving(*tiny) as out:
        yield out


@pytest.fixture()
def client(served):
    import openai

    return openai.OpenAI(base_url=served[1], api_key="unused", max_retries=0, timeout=60)

