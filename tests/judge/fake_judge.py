"""A fake OpenAI-compatible chat endpoint on 127.0.0.1 (http.server in a thread), for the judge tests.

``FakeJudge(behaviour)`` serves ``POST /v1/chat/completions``; ``behaviour(body) -> (status, reply_text,
delay_s, headers)`` decides each answer (for a status other than 200, a non-empty ``reply_text`` is the body). Every request's body and headers are kept in ``requests``.
"""

from __future__ import annotations

import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def chat_reply(text: str) -> dict:
    return {"id": "x", "object": "chat.completion", "model": "fake",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]}


FENCED = re.compile(r"<(answer-[0-9a-f]{12}(?:-\d+)?)>\n(.*?)\n</\1>", re.DOTALL)


def answers_in(body: dict) -> list[str]:
    """The answers shown to the judge, in the order shown (the text inside each random-tag fence)."""
    user = body["messages"][-1]["content"]
    return [text for _, text in FENCED.findall(user)]


def outside_fences(body: dict) -> str:
    """The judge's prompt with every fenced answer cut out: the text a judge reads as instructions."""
    return FENCED.sub("", body["messages"][-1]["content"])


class FakeJudge:
    def __init__(self, behaviour) -> None:
        self.behaviour = behaviour
        self.requests: list[tuple[dict, dict]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep the test output clean
                pass

            def do_POST(self):
                length = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(length) or b"{}")
                outer.requests.append((body, dict(self.headers)))
                status, text, delay, headers = outer.behaviour(body)
                time.sleep(delay)
                payload = (json.dumps(chat_reply(text)).encode() if status == 200  # an error's text is its body
                           else text.encode() if text else b'{"error": "x"}')
                try:
                    self.send_response(status)
                    for k, v in (headers or {}).items():
                        self.send_header(k, v)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)
