"""A bounded OpenAI-compatible ``/v1/chat/completions`` endpoint over a local causal LM (stdlib http.server).

Hand-written because the job is small and every piece of it is a bound we want to state: a request body
over ``max_body_bytes`` is refused with 413 before it is read, a client that stalls mid-request is cut off
after ``socket_timeout_s``, generation stops after ``max_new_tokens`` or ``max_time_s`` seconds
(``generate(max_time=...)``), and requests queue for the model for at most ``queue_timeout_s`` before a
503. A web framework would add a dependency without removing any of these decisions.

Endpoints: ``POST /v1/chat/completions`` (``messages``, ``max_tokens``, ``temperature``, ``response_format``;
``model`` is echoed, not checked), ``GET /v1/models``, ``GET /health``. ``response_format`` (OpenAI's
``{"type": "json_object"}`` or ``{"type": "json_schema", "json_schema": {"schema": ...}}``) is enforced by
constrained decoding (:mod:`grouprl.serve.constrained`): the reply is always JSON of the schema, and its
values are the model's own choice among the allowed tokens. A structured reply ends when its JSON is
complete, so ``max_tokens`` does not cut it short (the server's ``max_new_tokens`` still bounds it). Messages go through the tokenizer's chat
template when it has one, else through a plain ``role: content`` transcript.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import torch

from grouprl.errors import ConfigError
from grouprl.serve.constrained import TokenTexts, constrained_generate
from grouprl.serve.grammar import grammar_for

log = logging.getLogger("grouprl.serve")


class ChatServer:
    """The model side: messages in, reply text out, one generation at a time."""

    def __init__(self, model: Any, tokenizer: Any, *, name: str = "local", max_new_tokens: int = 256,
                 max_time_s: float = 60.0, max_prompt_tokens: int = 4096, queue_timeout_s: float = 120.0) -> None:
        self.model, self.tokenizer, self.name = model.eval(), tokenizer, name
        self.max_new_tokens, self.max_time_s = int(max_new_tokens), float(max_time_s)
        self.max_prompt_tokens, self.queue_timeout_s = int(max_prompt_tokens), float(queue_timeout_s)
        self._lock = threading.Lock()
        self._vocab = None
        self.fingerprint = name  # what identifies the weights (GET /health); load_chat_server sets it

    def prompt_ids(self, messages: list[dict]) -> list[int]:
        tok = self.tokenizer
        if getattr(tok, "chat_template", None):
            ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
        else:
            text = "".join(f"{m.get('role', 'user')}: {m.get('content', '')}\n" for m in messages) + "assistant:"
            ids = tok(text)["input_ids"]
        return list(ids)[-self.max_prompt_tokens:]

    def complete(self, messages: list[dict], max_tokens: int | None = None, temperature: float = 0.0,
                 response_format: dict | None = None) -> tuple[str, int, int]:
        """``(text, prompt tokens, completion tokens)``; TimeoutError when the model stays busy too long,
        ValueError for a ``response_format`` it cannot enforce."""
        grammar = grammar_for(response_format)
        if grammar is not None and grammar.remaining("") > self.max_new_tokens:
            raise ValueError(f"max_new_tokens={self.max_new_tokens} of this server cannot hold the shortest JSON of "
                             f"the response_format schema ({grammar.remaining('')} characters); restart grouprl serve "
                             f"with a larger --max-new-tokens.")
        ids = self.prompt_ids(messages)
        new = min(int(max_tokens or self.max_new_tokens), self.max_new_tokens)
        if not self._lock.acquire(timeout=self.queue_timeout_s):
            raise TimeoutError(f"the model was busy for {self.queue_timeout_s:g}s")
        try:
            if grammar is not None:
                if self._vocab is None:
                    self._vocab = TokenTexts(self.tokenizer)
                text, n = constrained_generate(self.model, ids, grammar, self._vocab, temperature=float(temperature),
                                               max_new_tokens=self.max_new_tokens, max_time_s=self.max_time_s)
                return text, len(ids), n
            device = next(self.model.parameters()).device
            input_ids = torch.tensor([ids], device=device)
            sample = float(temperature) > 0
            with torch.no_grad():
                out = self.model.generate(
                    input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=max(1, new),
                    do_sample=sample, temperature=float(temperature) if sample else None, top_p=None, top_k=None,
                    max_time=self.max_time_s, pad_token_id=self.tokenizer.pad_token_id)
        finally:
            self._lock.release()
        completion = out[0, len(ids):].tolist()
        text = self.tokenizer.decode(completion, skip_special_tokens=True)
        return text, len(ids), len(completion)


def _handler(chat: ChatServer, max_body_bytes: int, socket_timeout_s: float):
    class Handler(BaseHTTPRequestHandler):
        timeout = socket_timeout_s  # a stalled client is dropped (socket timeout) instead of holding a thread
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *args):
            log.debug("%s " + fmt, self.address_string(), *args)

        def _send(self, status: int, payload: dict) -> None:
            body = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _error(self, status: int, message: str) -> None:
            self._send(status, {"error": {"message": message, "type": "invalid_request_error", "code": status}})

        def do_GET(self):
            if self.path.rstrip("/") in ("/health", ""):
                self._send(200, {"status": "ok", "model": chat.name, "fingerprint": chat.fingerprint})
            elif self.path.rstrip("/") == "/v1/models":
                self._send(200, {"object": "list", "data": [{"id": chat.name, "object": "model"}]})
            else:
                self._error(404, f"no route {self.path}; POST /v1/chat/completions")

        def do_POST(self):
            if self.path.rstrip("/") != "/v1/chat/completions":
                self._error(404, f"no route {self.path}; POST /v1/chat/completions")
                return
            try:
                length = int(self.headers.get("Content-Length", ""))
            except ValueError:
                self._error(411, "a Content-Length header is required")
                return
            if length > max_body_bytes:
                self.close_connection = True
                self._error(413, f"request body of {length} bytes is over the limit of {max_body_bytes}")
                return
            try:
                body = json.loads(self.rfile.read(length))
                messages = body["messages"]
                if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
                    raise TypeError("messages must be a list of {role, content} objects")
            except (ValueError, KeyError, TypeError) as e:
                self._error(400, f"bad request: {type(e).__name__}: {e}")
                return
            try:
                text, n_prompt, n_completion = chat.complete(messages, body.get("max_tokens"),
                                                             float(body.get("temperature") or 0.0),
                                                             body.get("response_format"))
            except TimeoutError as e:
                self._error(503, str(e))
                return
            except ValueError as e:
                self._error(400, f"bad request: {e}")
                return
            self._send(200, {
                "id": f"chatcmpl-{uuid.uuid4().hex[:12]}", "object": "chat.completion", "created": int(time.time()),
                "model": body.get("model") or chat.name,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": n_prompt, "completion_tokens": n_completion,
                          "total_tokens": n_prompt + n_completion}})

    return Handler


def make_server(chat: ChatServer, host: str = "127.0.0.1", port: int = 8000, *, max_body_bytes: int = 1 << 20,
                socket_timeout_s: float = 30.0) -> ThreadingHTTPServer:
    """A ThreadingHTTPServer bound to ``host:port`` (port 0 picks a free one); call ``serve_forever()``."""
    if max_body_bytes < 1 or socket_timeout_s <= 0:
        raise ConfigError(f"serve: max_body_bytes={max_body_bytes} and socket_timeout_s={socket_timeout_s} "
                          f"must be positive.")
    server = ThreadingHTTPServer((host, port), _handler(chat, max_body_bytes, socket_timeout_s))
    server.daemon_threads = True
    return server


def load_chat_server(model: str, *, device: str = "auto", **kw: Any) -> ChatServer:
    """Load ``model`` (a local path, hub id or ``builtin:<name>``) and its tokenizer for serving."""
    from grouprl.models import load_model, load_tokenizer, pick_device, resolve_model_path

    path = resolve_model_path(model)
    tokenizer = load_tokenizer(path)
    chat = ChatServer(load_model(model, pick_device(device)), tokenizer, name=kw.pop("name", None) or model, **kw)
    chat.fingerprint = model_fingerprint(str(path))
    return chat


def model_fingerprint(path: str) -> str:
    """The model directory with the size and modification time of its files (a hub id as it is), so that a
    judge's reply cache never mixes the replies of two different weights served under one name."""
    import hashlib
    from pathlib import Path

    root = Path(path)
    if not root.is_dir():
        return path
    stats = sorted((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in root.iterdir() if f.is_file())
    return f"{root.resolve()}#{hashlib.sha256(repr(stats).encode()).hexdigest()[:16]}"
