"""Helpers for tests/serve: a ``grouprl serve`` endpoint in a thread, and a scripted policy."""

from __future__ import annotations

import contextlib
import threading

import torch

CALC = {"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression exactly.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}


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


class Scripted(torch.nn.Module):
    """The tiny model with one reply forced after a given prompt length (a scripted policy): its logits
    get a large bonus on the script's next token, so the server's real decode loop writes the script."""

    def __init__(self, model, tokenizer, script: str) -> None:
        super().__init__()
        self.inner, self.config = model, model.config
        self.script = tokenizer.encode(script, add_special_tokens=False) + [tokenizer.eos_token_id]
        self.prompt_len = None

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None, use_cache=None,
                logits_to_keep=0):
        out = self.inner(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, cache=cache,
                         use_cache=use_cache, logits_to_keep=logits_to_keep)
        done = attention_mask.sum(-1) - self.prompt_len  # tokens generated so far, per row
        for i, k in enumerate(done.tolist()):
            if 0 <= k < len(self.script):
                out.logits[i, -1, self.script[k]] += 1e4
        return out
