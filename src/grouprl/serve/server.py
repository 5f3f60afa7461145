"""``grouprl serve``: an OpenAI-compatible ``/v1/chat/completions`` endpoint over a local causal LM.

The HTTP layer is the standard library's ``ThreadingHTTPServer`` (one thread per connection, HTTP/1.1
keep-alive), not FastAPI + uvicorn as ``transformers serve`` uses: the endpoint is three routes and a
stream, and the judge reward (``judge: {serve: MODEL}``) starts it as a child process of every run,
where a web framework would add four dependencies to the core install without removing any of the
decisions written here. The bounds are the server's own: a body over ``max_body_bytes`` is refused
with 413 (the connection is then closed, since the body is not read); every other answer, a 404
included, is sent only after the body has been read, so the next request on a pooled connection starts
where it should; a client that stalls mid-request is cut off after ``socket_timeout_s``; a request
waits at most ``queue_timeout_s`` for a free row (then 503) and generates at most ``max_new_tokens``
tokens or ``max_time_s`` seconds (then ``finish_reason="length"``).

Generation is :class:`grouprl.serve.engine.Engine` (simultaneous requests decode in one batch); the
request is checked by :mod:`grouprl.serve.protocol` (fields honoured or refused with OpenAI's error
object) and tool calls go through :mod:`grouprl.serve.tools` (the rollouts' parser and message shape).
A client that disconnects -- noticed while it waits, or when a stream write fails -- frees its rows at
the next decode step. Messages go through the tokenizer's chat template (the tools too, as in a
rollout: :func:`grouprl.rollout.chat.prompt_ids`), else through a plain ``role: content`` transcript.
``response_format`` is enforced by constrained decoding (:mod:`grouprl.serve.constrained`); a
``max_tokens`` below what the schema's shortest JSON needs is raised to it, so a structured reply
always parses. docs/SERVING.md has the whole surface.
"""

from __future__ import annotations

import logging
import queue
import time
from http.server import ThreadingHTTPServer
from typing import Any

from grouprl.errors import ConfigError
from grouprl.rewards._text import TOOL_CLOSE, TOOL_OPEN
from grouprl.rollout.chat import prompt_ids as template_prompt_ids
from grouprl.rollout.chat import stop_token_ids
from grouprl.serve.engine import Engine, Job, Row, Sampling
from grouprl.serve.handler import make_handler
from grouprl.serve.protocol import APIError, ChatRequest
from grouprl.serve.tools import TurnMemory, assistant_turn, call_grammar, extract_calls

log = logging.getLogger("grouprl.serve")


class ChatServer:
    """The model side: checked requests in, :class:`~grouprl.serve.engine.Job` s out."""

    def __init__(self, model: Any, tokenizer: Any, *, name: str = "local", max_new_tokens: int = 256,
                 max_time_s: float = 60.0, max_prompt_tokens: int | None = None, queue_timeout_s: float = 120.0,
                 max_batch: int = 32) -> None:
        self.model, self.tokenizer, self.name = model.eval(), tokenizer, name
        self.max_new_tokens, self.max_time_s = int(max_new_tokens), float(max_time_s)
        self.queue_timeout_s, self.max_batch = float(queue_timeout_s), int(max_batch)
        limit = getattr(model.config, "max_position_embeddings", None) or 1 << 30
        self.context = min(int(limit), int(max_prompt_tokens) + self.max_new_tokens) if max_prompt_tokens else int(limit)
        self.fingerprint = name  # what identifies the weights (GET /health); load_chat_server sets it
        self.memory = TurnMemory()
        self.renders_calls = "tool_calls" in str(getattr(tokenizer, "chat_template", "") or "")
        self.engine = Engine(model, tokenizer, stop_token_ids(tokenizer) if tokenizer.eos_token else [],
                             max_batch=max_batch, queue_timeout_s=queue_timeout_s)

    def close(self) -> None:
        self.engine.close()

    def assistant_turn(self, content: str, calls: list[dict]) -> dict:
        return assistant_turn(content, calls, self.memory, self.renders_calls)

    def prompt_ids(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        tok = self.tokenizer
        if getattr(tok, "chat_template", None):
            try:
                return template_prompt_ids(tok, messages, tools or None)
            except Exception as e:  # a template that rejects these messages is the request's problem
                raise APIError(400, f"the model's chat template failed on these messages: {type(e).__name__}: {e}",
                               "messages") from None
        text = "".join(f"{m['role']}: {m.get('content', '')}\n" for m in messages) + "assistant:"
        return list(tok(text)["input_ids"])

    def sampling(self, req: ChatRequest, prompt_len: int) -> Sampling:
        """The decoding of ``req`` within the server's bounds; APIError 400 past the context."""
        room = self.context - prompt_len
        asked = min(req.max_tokens or 1, self.max_new_tokens)  # the server never writes past its own cap
        if asked > room or room < 1:
            raise APIError(400, f"This model's maximum context length is {self.context} tokens. However, you requested "
                                f"{prompt_len + asked} tokens ({prompt_len} in the messages, {asked} in the completion). "
                                f"Please reduce the length of the messages or completion.", "messages",
                           "context_length_exceeded")
        grammar, ban, hold, end_after = req.grammar, None, None, None
        choice = req.tool_choice
        if req.tools and choice == "none":
            ban = TOOL_OPEN
        elif req.tools and choice == "auto":
            hold, end_after = TOOL_OPEN, (None if req.parallel_tool_calls else TOOL_CLOSE)
        elif req.tools:
            named = choice["function"]["name"] if isinstance(choice, dict) else None
            grammar = call_grammar([t for t in req.tools if named in (None, t["function"]["name"])])
            hold = TOOL_OPEN  # the block is sent as tool_calls, never streamed as content
        budget = min(req.max_tokens or self.max_new_tokens, self.max_new_tokens, room)
        if grammar is not None:
            shortest = grammar.remaining("") or 0
            if shortest > min(self.max_new_tokens, room):
                raise APIError(400, f"max_new_tokens={self.max_new_tokens} of this server (or the context left) cannot "
                                    f"hold the shortest reply the constraint allows ({shortest} characters); restart "
                                    f"grouprl serve with a larger --max-new-tokens.", "response_format")
            budget = max(budget, shortest)
        return Sampling(max_new_tokens=budget, temperature=req.temperature, top_p=req.top_p, seed=req.seed,
                        stop=req.stop, logprobs=req.logprobs, top_logprobs=req.top_logprobs, grammar=grammar, ban=ban,
                        hold=hold, end_after=end_after, max_time_s=self.max_time_s)

    def submit(self, req: ChatRequest) -> Job:
        ids = self.prompt_ids(req.messages, req.tools)
        return self.engine.submit(Job(ids, req.n, self.sampling(req, len(ids)), stream=req.stream))

    def wait(self, job: Job, gone=lambda: False) -> list[Row]:
        """The finished rows of ``job``; cancels it when ``gone()`` says the client left (then ``[]``)."""
        deadline = time.monotonic() + self.queue_timeout_s + self.max_time_s + 30.0
        while time.monotonic() < deadline:
            try:
                event = job.events.get(timeout=0.1)
            except queue.Empty:
                if gone():
                    job.cancel()
                    return []
                continue
            if event[0] == "error":
                raise APIError(event[1], event[2], kind="server_error" if event[1] >= 500 else "invalid_request_error")
            if event[0] == "end":
                return job.rows
        job.cancel()
        raise APIError(504, "generation did not finish within its bound", kind="server_error")

    def result(self, req: ChatRequest, row: Row) -> tuple[dict, str]:
        """``(message, finish_reason)`` of one finished row."""
        content, calls = row.text, []
        if req.tools and req.tool_choice != "none":
            content, calls = extract_calls(row.text)
            if calls:
                self.memory.remember(calls, row.text)
        message = {"role": "assistant", "content": content, "refusal": None}
        if calls:
            message["tool_calls"] = calls
        return message, ("tool_calls" if calls else row.finish or "stop")

    def complete(self, messages: list[dict], max_tokens: int | None = None, temperature: float = 0.0,
                 response_format: dict | None = None) -> tuple[str, int, int]:
        """``(text, prompt tokens, completion tokens)`` of one reply, for in-process callers.
        ValueError for a ``response_format`` it cannot enforce, TimeoutError when the server stays busy."""
        from grouprl.serve.grammar import grammar_for

        req = ChatRequest(model=self.name, messages=messages, max_tokens=max_tokens, temperature=float(temperature),
                          grammar=grammar_for(response_format), tool_choice="none")
        try:
            job = self.submit(req)
            (row,) = self.wait(job)
        except APIError as e:
            raise (TimeoutError if e.status >= 500 else ValueError)(e.message) from None
        return row.text, len(job.prompt_ids), len(row.ids)


def make_server(chat: ChatServer, host: str = "127.0.0.1", port: int = 8000, *, max_body_bytes: int = 1 << 20,
                socket_timeout_s: float = 30.0) -> ThreadingHTTPServer:
    """A ThreadingHTTPServer bound to ``host:port`` (port 0 picks a free one); call ``serve_forever()``."""
    if max_body_bytes < 1 or socket_timeout_s <= 0:
        raise ConfigError(f"serve: max_body_bytes={max_body_bytes} and socket_timeout_s={socket_timeout_s} "
                          f"must be positive.")
    server = ThreadingHTTPServer((host, port), make_handler(chat, max_body_bytes, socket_timeout_s))
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
