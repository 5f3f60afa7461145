"""The HTTP side of the LLM judge: an OpenAI-compatible ``/chat/completions`` client with every wait bounded.

The requests go through ``httpx2`` (already a dependency of ``huggingface_hub``); what is ours is the policy
around them, which no client library ships as one piece:

- deadlines, not per-read timeouts: each attempt must deliver its whole reply within ``timeout_s`` of its
  start (a server that sends its headers and then one byte every 0.4 s is cut off at ``timeout_s``, where
  httpx's own timeout, which bounds each read, would wait for ever), and a whole call -- every attempt,
  backoff and ``Retry-After`` wait included -- within ``call_deadline_s`` (:attr:`JudgeClient.call_deadline_s`);
- retries with exponential backoff on timeouts, connection errors, 429 and 5xx (a ``Retry-After`` header
  is honoured, capped at ``max_backoff_s``);
- a concurrency limit (a semaphore shared by every thread) and a rate limit (request starts spaced by
  ``1 / rate_limit_per_s`` seconds);
- a budget: when no request has succeeded for ``budget_s`` seconds while requests keep failing, the next
  failure raises :class:`~grouprl.errors.RewardError` naming the URL and the fix, so a run with a dead
  judge stops instead of hanging or silently training on "no opinion";
- structured output: a request may carry OpenAI's ``response_format`` (a JSON schema of the scores; ``grouprl
  serve`` enforces it by constrained decoding, so a served model's reply always parses). An endpoint that
  refuses it (HTTP 400 / 422) is asked again without it, and from then on never with it (logged once); a 400
  whose error code is ``context_length_exceeded`` (a prompt past the model's context) is no such refusal:
  that answer gets no opinion, and the next request still asks for the schema;
- an on-disk cache (SQLite, one table) of the judge's replies keyed by a hash of the request, so a resumed
  run does not pay twice.

The API key is read from the environment variable *named* by ``api_key_env`` at request time; it is never
stored on the client, never part of its ``repr``, never part of a cache key and never logged.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pathlib
import sqlite3
import threading
import time
from typing import Any

from grouprl.errors import ConfigError, RewardError

log = logging.getLogger("grouprl.rewards.judge")

RETRYABLE_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})
MAX_REPLY_BYTES = 1 << 20  # a chat completion of a few hundred tokens is a few KB; more is a broken endpoint


def error_code(body: bytes) -> str | None:
    """The ``error.code`` of an OpenAI error reply (``{"error": {"message", "type", "param", "code"}}``), if any.
    A prompt past the context is a 400 like a refused ``response_format``; the code tells them apart.

    >>> error_code(b'{"error": {"code": "context_length_exceeded"}}'), error_code(b"oops")
    ('context_length_exceeded', None)
    """
    try:
        error = json.loads(body).get("error")
    except (ValueError, AttributeError):
        return None
    code = error.get("code") if isinstance(error, dict) else None
    return code if isinstance(code, str) else None


class ReplyCache:
    """``key -> reply text`` in a SQLite file (thread-safe; survives a restart)."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = pathlib.Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(self.path), check_same_thread=False, timeout=30)
        self._db.execute("CREATE TABLE IF NOT EXISTS replies (key TEXT PRIMARY KEY, reply TEXT NOT NULL)")
        self._db.commit()
        self.hits = self.misses = 0

    def get(self, key: str) -> str | None:
        with self._lock:
            row = self._db.execute("SELECT reply FROM replies WHERE key = ?", (key,)).fetchone()
            if row is None:
                self.misses += 1
                return None
            self.hits += 1
            return row[0]

    def put(self, key: str, reply: str) -> None:
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO replies (key, reply) VALUES (?, ?)", (key, reply))
            self._db.commit()


def cache_key(*parts: Any) -> str:
    """A stable hash of the request's identity, e.g. ``(rubric, prompt, completion, judge model)``."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


class JudgeClient:
    """Bounded, retrying, rate-limited chat requests to one OpenAI-compatible endpoint (see module docstring)."""

    def __init__(self, base_url: str, model: str, *, api_key_env: str | None = None, timeout_s: float = 30.0,
                 max_retries: int = 3, backoff_s: float = 0.5, max_backoff_s: float = 8.0, concurrency: int = 4,
                 rate_limit_per_s: float | None = None, budget_s: float = 120.0,
                 cache_path: str | os.PathLike | None = None, temperature: float = 0.0,
                 max_tokens: int = 256) -> None:
        import httpx2

        if not base_url or not isinstance(base_url, str):
            raise ConfigError("judge: `base_url` is required, e.g. base_url: http://127.0.0.1:8000/v1 "
                              "(start a local judge with `grouprl serve MODEL`).")
        if not model:
            raise ConfigError("judge: `model` is required (the judge model's name as the endpoint knows it).")
        if concurrency < 1 or timeout_s <= 0 or budget_s <= 0 or max_retries < 0 or max_backoff_s < 0:
            raise ConfigError(f"judge: need concurrency >= 1, timeout_s > 0, budget_s > 0, max_retries >= 0, "
                              f"max_backoff_s >= 0; got {concurrency}, {timeout_s}, {budget_s}, {max_retries}, "
                              f"{max_backoff_s}.")
        if api_key_env is not None and api_key_env not in os.environ:
            raise ConfigError(f"judge: api_key_env={api_key_env!r} names an environment variable that is not set. "
                              f"Export it (export {api_key_env}=...) or drop api_key_env for a local judge.")
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model, self.api_key_env = model, api_key_env
        self.timeout_s, self.max_retries, self.budget_s = float(timeout_s), int(max_retries), float(budget_s)
        self.backoff_s, self.max_backoff_s = float(backoff_s), float(max_backoff_s)
        self.temperature, self.max_tokens = float(temperature), int(max_tokens)
        # every attempt's timeout is the time left to its deadline (see _exchange); this is only the ceiling
        self._http = httpx2.Client(timeout=httpx2.Timeout(self.timeout_s), trust_env=False)
        self._timeout = httpx2.Timeout
        self._errors = (httpx2.TransportError,)
        self._slots = threading.BoundedSemaphore(int(concurrency))
        self._interval = 1.0 / float(rate_limit_per_s) if rate_limit_per_s else 0.0
        self._rate_lock = threading.Lock()
        self._next_start = 0.0
        self._state_lock = threading.Lock()
        self._failing_since: float | None = None
        self.cache = ReplyCache(cache_path) if cache_path else None
        self.requests = 0
        self.structured_ok = True  # False once the endpoint has refused a response_format

    def __repr__(self) -> str:
        return f"JudgeClient({self.url!r}, model={self.model!r}, api_key_env={self.api_key_env!r})"

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if self.api_key_env:
            headers["Authorization"] = "Bearer " + os.environ.get(self.api_key_env, "")
        return headers

    def _wait_for_rate(self) -> None:
        if not self._interval:
            return
        with self._rate_lock:
            now = time.monotonic()
            start = max(now, self._next_start)
            self._next_start = start + self._interval
        if start > now:
            time.sleep(start - now)

    def _note(self, ok: bool) -> None:
        """Track how long the endpoint has been failing; past the budget, stop the run."""
        with self._state_lock:
            if ok:
                self._failing_since = None
                return
            now = time.monotonic()
            if self._failing_since is None:
                self._failing_since = now
            elapsed = now - self._failing_since
        if elapsed > self.budget_s:
            raise RewardError(
                f"judge {self.url} (model {self.model!r}) has failed every request for {elapsed:.0f}s, past its "
                f"budget_s={self.budget_s:g}. Check that the server is up (`grouprl serve MODEL --port N`), "
                f"the base_url, and the key in ${self.api_key_env or '(none)'}; or raise budget_s.")

    @property
    def call_deadline_s(self) -> float:
        """The most one :meth:`chat` call can take: every attempt (one more when the endpoint refuses a
        ``response_format``) at ``timeout_s`` each, and every backoff at its ceiling."""
        return (self.max_retries + 2) * self.timeout_s + self.max_retries * self.max_backoff_s

    def chat(self, messages: list[dict[str, str]], key: str | None = None,
             response_format: dict | None = None) -> tuple[str | None, str]:
        """``(reply text, "")`` or ``(None, reason)`` after the retries, within :attr:`call_deadline_s`;
        cached under ``key`` when given. ``response_format`` is sent unless the endpoint has refused one
        before (see the module docstring). Raises RewardError when the endpoint has been failing for longer
        than ``budget_s``."""
        if key is not None and self.cache is not None:
            cached = self.cache.get(key)
            if cached is not None:
                return cached, ""
        body = {"model": self.model, "messages": messages, "temperature": self.temperature,
                "max_tokens": self.max_tokens}
        deadline = time.monotonic() + self.call_deadline_s
        reason = ""
        for attempt in range(self.max_retries + 1):
            if attempt:
                delay = self._delay(attempt, reason)
                if time.monotonic() + delay + 0.01 >= deadline:
                    break
                time.sleep(delay)
            self._wait_for_rate()
            if response_format is not None and self.structured_ok:
                body["response_format"] = response_format
            reply, reason, retry = self._attempt(body, deadline)
            if "response_format" in body and reason in ("HTTP 400", "HTTP 422"):
                self._refused_format(reason)
                body.pop("response_format")
                reply, reason, retry = self._attempt(body, deadline)
            if reply is not None:
                self._note(True)
                if key is not None and self.cache is not None:
                    self.cache.put(key, reply)
                return reply, ""
            self._note(False)
            if not retry:
                break
        return None, reason

    def _attempt(self, body: dict, call_deadline: float) -> tuple[str | None, str, bool]:
        with self._slots:
            return self._post(body, min(time.monotonic() + self.timeout_s, call_deadline))

    def _refused_format(self, reason: str) -> None:
        with self._state_lock:
            first, self.structured_ok = self.structured_ok, False
        if first:
            log.warning("judge %s refused response_format (%s): asking without it from now on; replies that are "
                        "not JSON count as no opinion. Set structured: false to skip the attempt.", self.url, reason)

    def _delay(self, attempt: int, reason: str) -> float:
        delay = self.backoff_s * 2 ** (attempt - 1)
        if reason.startswith("retry-after="):
            try:
                delay = max(delay, float(reason.split("=", 1)[1].split()[0]))
            except ValueError:
                pass
        return min(delay, self.max_backoff_s)

    def _post(self, body: dict, deadline: float) -> tuple[str | None, str, bool]:
        """One request that must be answered in full by ``deadline`` (``time.monotonic()``): ``(reply,
        reason, retryable)``. The exchange runs in a thread of its own so that the wait here is exactly the
        time left, whatever the server does; a cut-off exchange notices within one read and closes."""
        self.requests += 1
        left = deadline - time.monotonic()
        if left <= 0:
            return None, f"no time left within the call's deadline ({self.call_deadline_s:g}s)", False
        box: dict[str, Any] = {}
        done, cancel = threading.Event(), threading.Event()
        threading.Thread(target=self._exchange, args=(body, deadline, cancel, box, done), daemon=True,
                         name="grouprl-judge-request").start()
        if not done.wait(left):
            cancel.set()
            return None, f"no complete reply within timeout_s={self.timeout_s:g}s", True
        return box["result"]

    def _exchange(self, body: dict, deadline: float, cancel: threading.Event, box: dict,
                  done: threading.Event) -> None:
        try:
            box["result"] = self._read(body, deadline, cancel)
        except Exception as e:  # noqa: BLE001 -- reported as the attempt's reason, never lost in a thread
            box["result"] = (None, f"{type(e).__name__}: {e}", False)
        finally:
            done.set()

    def _read(self, body: dict, deadline: float, cancel: threading.Event) -> tuple[str | None, str, bool]:
        left = max(0.001, deadline - time.monotonic())
        try:
            with self._http.stream("POST", self.url, json=body, headers=self._headers(),
                                   timeout=self._timeout(left)) as response:
                data = bytearray()
                for chunk in response.iter_bytes():
                    if cancel.is_set() or time.monotonic() > deadline:
                        return None, f"no complete reply within timeout_s={self.timeout_s:g}s", True
                    data += chunk
                    if len(data) > MAX_REPLY_BYTES:
                        return None, f"the reply is over {MAX_REPLY_BYTES} bytes (not a judge's score)", False
                status, retry_after = response.status_code, response.headers.get("retry-after")
        except self._errors as e:
            return None, f"{type(e).__name__} within timeout_s={self.timeout_s:g}s", True
        if status != 200:
            reason = f"HTTP {status}"
            if status == 429 and retry_after:
                reason = f"retry-after={retry_after} (HTTP 429)"
            elif error_code(bytes(data)) == "context_length_exceeded":
                reason = (f"HTTP {status} context_length_exceeded: the judge prompt is longer than the judge model's "
                          "context (a shorter answer, a smaller max_tokens or a model with a longer context fits)")
            return None, reason, status in RETRYABLE_STATUS
        try:
            content = json.loads(bytes(data))["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError):
            return None, "the endpoint's reply is not an OpenAI chat completion", False
        if not isinstance(content, str):
            return None, "the reply's message content is not text", False
        return content, "", False

    def close(self) -> None:
        self._http.close()
