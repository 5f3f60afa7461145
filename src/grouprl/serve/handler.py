"""The HTTP side of ``grouprl serve`` (stdlib ``BaseHTTPRequestHandler``; why: :mod:`grouprl.serve.server`).

Routes: ``POST /v1/chat/completions`` (JSON, or Server-Sent Events with ``stream=true``: one
``chat.completion.chunk`` per decode step that adds text, a last chunk per choice with its
``finish_reason``, a usage chunk with ``stream_options.include_usage``, then ``data: [DONE]``),
``GET /v1/models``, ``GET /v1/models/{id}``, ``GET /health``. Keep-alive: the body of every request is
read before its answer, whatever the route or the error, so the next request on the connection parses.
"""

from __future__ import annotations

import json
import logging
import queue
import select
import socket
import time
import uuid
from http.server import BaseHTTPRequestHandler
from typing import Any

from grouprl.serve.protocol import APIError, ChatRequest, parse_request

log = logging.getLogger("grouprl.serve")


def client_gone(sock: socket.socket) -> bool:
    """The client closed its end (readable with nothing to read)."""
    try:
        ready, _, _ = select.select([sock], [], [], 0)
        return bool(ready) and sock.recv(1, socket.MSG_PEEK) == b""
    except (OSError, ValueError):
        return True


def _logprobs(req: ChatRequest, entries: list[dict]) -> dict | None:
    return {"content": entries, "refusal": None} if req.logprobs else None


def usage(job: Any, rows: list) -> dict:
    completion = sum(len(r.ids) for r in rows)
    return {"prompt_tokens": len(job.prompt_ids), "completion_tokens": completion,
            "total_tokens": len(job.prompt_ids) + completion}


def completion_body(chat: Any, req: ChatRequest, job: Any, rows: list) -> dict:
    choices = []
    for row in sorted(rows, key=lambda r: r.index):
        message, finish = chat.result(req, row)
        choices.append({"index": row.index, "message": message, "logprobs": _logprobs(req, row.logprobs),
                        "finish_reason": finish})
    return {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "object": "chat.completion", "created": int(time.time()),
            "model": chat.name, "system_fingerprint": None, "choices": choices, "usage": usage(job, rows)}


class ChatHandler(BaseHTTPRequestHandler):
    """One connection's requests (module docstring); ``make_handler`` binds it to a server."""

    chat: Any = None  # the ChatServer (set by make_handler)
    max_body_bytes = 1 << 20
    timeout = 30.0  # socket timeout: a stalled client is dropped instead of holding a thread
    protocol_version = "HTTP/1.1"

    def setup(self):
        super().setup()
        # headers and body go out as separate writes: without TCP_NODELAY, Nagle's algorithm holds the
        # body until the client's delayed ACK (tens of milliseconds on every reply)
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, fmt, *args):
        log.debug("%s " + fmt, self.address_string(), *args)

    def _send(self, status: int, payload: dict) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _error(self, e: APIError) -> None:
        self._send(e.status, e.body())

    def _body(self) -> bytes | None:
        """The request body, always read in full (None after an error answer that closes the connection)."""
        if self.headers.get("Transfer-Encoding"):
            self.close_connection = True
            self._error(APIError(411, "chunked request bodies are not supported; send a Content-Length"))
            return None
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            self.close_connection = True
            self._error(APIError(400, "the Content-Length header is not a number"))
            return None
        if length > self.max_body_bytes:
            self.close_connection = True
            self._error(APIError(413, f"request body of {length} bytes is over the limit of {self.max_body_bytes} "
                                      f"(--max-body-bytes)"))
            return None
        return self.rfile.read(length) if length else b""

    def _route(self, body: bytes | None) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        if self.command == "GET" and path in ("/health", ""):
            self._send(200, {"status": "ok", "model": self.chat.name, "fingerprint": self.chat.fingerprint,
                             "engine": dict(self.chat.engine.stats)})
        elif self.command == "GET" and path == "/v1/models":
            self._send(200, {"object": "list", "data": [self._model()]})
        elif self.command == "GET" and path.startswith("/v1/models/"):
            name = path[len("/v1/models/"):]
            if name != self.chat.name:
                raise APIError(404, f"The model `{name}` does not exist: this server serves `{self.chat.name}`.",
                               "model", "model_not_found")
            self._send(200, self._model())
        elif self.command == "POST" and path == "/v1/chat/completions":
            self._chat(body)
        else:
            raise APIError(404, f"no route {self.command} {self.path}; this server answers POST "
                                f"/v1/chat/completions, GET /v1/models and GET /health", code="not_found")

    def _model(self) -> dict:
        return {"id": self.chat.name, "object": "model", "created": 0, "owned_by": "grouprl"}

    def _handle(self) -> None:
        body = self._body()
        if body is None:
            return
        try:
            self._route(body)
        except APIError as e:
            self._error(e)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    do_GET = do_POST = _handle

    def do_PUT(self):
        self._method_not_allowed()

    do_DELETE = do_PATCH = do_PUT

    def _method_not_allowed(self) -> None:
        if self._body() is not None:
            self._error(APIError(405, f"{self.command} is not supported; POST /v1/chat/completions"))

    def _chat(self, body: bytes) -> None:
        try:
            data = json.loads(body)
        except (ValueError, UnicodeDecodeError) as e:
            raise APIError(400, f"the request body is not JSON: {e}") from None
        req = parse_request(data, self.chat.name, self.chat.assistant_turn, self.chat.max_batch)
        job = self.chat.submit(req)
        if req.stream:
            return self._stream(req, job)
        rows = self.chat.wait(job, lambda: client_gone(self.connection))
        if not rows:  # the client left: nothing to answer
            self.close_connection = True
            return
        self._send(200, completion_body(self.chat, req, job, rows))

    # ---- Server-Sent Events -----------------------------------------------------------------------
    def _chunk(self, payload: dict | str) -> None:
        data = payload if isinstance(payload, str) else json.dumps(payload)
        line = f"data: {data}\n\n".encode()
        self.wfile.write(f"{len(line):x}\r\n".encode() + line + b"\r\n")
        self.wfile.flush()

    def _stream(self, req: ChatRequest, job: Any) -> None:
        first = self._next_event(job)
        if first is None:
            return
        if first[0] == "error":
            raise APIError(first[1], first[2], kind="server_error" if first[1] >= 500 else "invalid_request_error")
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        base = {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "object": "self.chat.completion.chunk",
                "created": int(time.time()), "model": self.chat.name, "system_fingerprint": None}
        extra = {"usage": None} if req.include_usage else {}

        def send(index: int, delta: dict, finish: str | None = None, logprobs: list | None = None) -> None:
            choice = {"index": index, "delta": delta, "logprobs": _logprobs(req, logprobs or []) if logprobs
                      is not None else None, "finish_reason": finish}
            self._chunk({**base, "choices": [choice], **extra})

        try:
            for k in range(job.n):
                send(k, {"role": "assistant", "content": ""})
            event = first
            while event is not None:
                if event[0] == "delta":
                    send(event[1], {"content": event[2]}, logprobs=event[3] if req.logprobs else None)
                elif event[0] == "done":
                    self._finish_choice(req, event[2], send)
                elif event[0] == "error":  # mid-stream: the stream ends with the error object
                    self._chunk(APIError(event[1], event[2], kind="server_error").body())
                    break
                elif event[0] == "end":
                    if req.include_usage:
                        self._chunk({**base, "choices": [], "usage": usage(job, job.rows)})
                    break
                event = self._next_event(job)
            self._chunk("[DONE]")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (TimeoutError, BrokenPipeError, ConnectionResetError):
            job.cancel()
            self.close_connection = True

    def _finish_choice(self, req: ChatRequest, row: Any, send) -> None:
        message, finish = self.chat.result(req, row)
        content = message["content"] or ""
        streamed = row.text[:row.emitted]
        rest = content[len(streamed):] if content.startswith(streamed) else ""
        if rest or len(row.logprobs) > row.lp_emitted:
            send(row.index, {"content": rest}, logprobs=row.logprobs[row.lp_emitted:] if req.logprobs else None)
        if message.get("tool_calls"):
            send(row.index, {"tool_calls": [{"index": k, **call} for k, call in enumerate(message["tool_calls"])]})
        send(row.index, {}, finish)

    def _next_event(self, job: Any):
        """The job's next event; None (and the job cancelled) when the client left or the bound ran out."""
        deadline = time.monotonic() + self.chat.queue_timeout_s + self.chat.max_time_s + 30.0
        while time.monotonic() < deadline:
            try:
                return job.events.get(timeout=0.1)
            except queue.Empty:
                if client_gone(self.connection):
                    break
        job.cancel()
        self.close_connection = True
        return None


def make_handler(chat: Any, max_body_bytes: int, socket_timeout_s: float) -> type[ChatHandler]:
    """A :class:`ChatHandler` subclass bound to ``chat`` and the server's bounds."""
    return type("Handler", (ChatHandler,), {"chat": chat, "max_body_bytes": int(max_body_bytes),
                                            "timeout": float(socket_timeout_s)})
