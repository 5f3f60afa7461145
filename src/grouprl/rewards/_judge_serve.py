"""A local judge for the run's duration: ``judge: {serve: builtin:judge}`` starts ``grouprl serve`` on loopback.

The server is a child process (``python -m grouprl serve MODEL --port 0 --parent-pid PID``) started on
the first judge request of a configuration and shared by every later one. Its first stderr line that
names its URL (a free port, picked by the OS) marks it ready; until then its stderr is echoed to ours
(a built-in model may be warm-started first). Every wait is bounded: no URL within
``startup_timeout_s`` (or the child exits first) is a RewardError naming the command and its last
output. The server stops when the run ends (``atexit``), and on its own when this process dies
(``--parent-pid``), so no judge outlives its run. Started as a subprocess rather than imported because
``rewards/`` stays free of torch: the model lives in the child.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import logging
import os
import queue
import re
import subprocess
import sys
import threading
import time
from typing import Any

from grouprl.errors import ConfigError, RewardError

log = logging.getLogger("grouprl.rewards.judge")

_URL = re.compile(r"serving .* at (http://127\.0\.0\.1:\d+/v1)")
_SERVERS: dict[tuple, LocalJudge] = {}
_LOCK = threading.Lock()


class LocalJudge:
    """One ``grouprl serve`` child process; ``start()`` returns its base URL, ``stop()`` ends it."""

    def __init__(self, model: str, *, name: str = "judge", device: str = "cpu", max_new_tokens: int = 64,
                 startup_timeout_s: float = 600.0, threads: int = 1) -> None:
        if not model or not isinstance(model, str):
            raise ConfigError(f"judge: serve={model!r}; name a local model directory or builtin:<name>, "
                              f"e.g. serve: builtin:judge.")
        if startup_timeout_s <= 0:
            raise ConfigError(f"judge: serve.startup_timeout_s={startup_timeout_s} must be positive.")
        self.model, self.name, self.startup_timeout_s = model, name, float(startup_timeout_s)
        self.command = [sys.executable, "-m", "grouprl", "serve", model, "--host", "127.0.0.1", "--port", "0",
                        "--name", name, "--device", device, "--max-new-tokens", str(int(max_new_tokens)),
                        "--parent-pid", str(os.getpid())]
        self.env = {**os.environ, "OMP_NUM_THREADS": str(int(threads))}
        self.proc: subprocess.Popen | None = None
        self.url: str | None = None
        self.fingerprint = model
        self.tail: collections.deque[str] = collections.deque(maxlen=20)

    def start(self) -> str:
        self.proc = subprocess.Popen(self.command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True, env=self.env, start_new_session=True)
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._pump, args=(lines,), daemon=True, name="judge-serve-stderr").start()
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            try:
                line = lines.get(timeout=min(1.0, max(0.01, deadline - time.monotonic())))
            except queue.Empty:
                if self.proc.poll() is not None:
                    break
                continue
            if line is None:  # its stderr closed: it is exiting; give it a moment to say with which code
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(timeout=10)
                break
            found = _URL.search(line)
            if found:
                self.url = found.group(1)
                self.fingerprint = self._fingerprint()
                log.info("judge: serving %s at %s (pid %d)", self.model, self.url, self.proc.pid)
                return self.url
        code = self.proc.poll()
        self.stop()
        what = f"exited with code {code}" if code is not None else f"was not ready after {self.startup_timeout_s:g}s"
        output = "".join(self.tail).strip() or "(no output)"
        raise RewardError(f"judge: the local judge server `{' '.join(self.command[2:])}` {what}. Its last output:\n"
                          f"{output}\nFix the model name or device, or raise serve.startup_timeout_s (a built-in "
                          f"model is warm-started once on first use).")

    def _fingerprint(self) -> str:
        """What identifies the served weights (``GET /health``), for the reply cache's file name."""
        import httpx2

        try:
            health = httpx2.get(self.url.removesuffix("/v1") + "/health", timeout=10, trust_env=False).json()
            return str(health.get("fingerprint") or self.model)
        except (httpx2.HTTPError, ValueError, AttributeError):
            return self.model

    def _pump(self, lines: queue.Queue) -> None:
        stream = self.proc.stderr if self.proc is not None else None
        for line in stream or ():
            self.tail.append(line)
            if self.url is None:
                lines.put(line)
                if "building" in line or "Error" in line:
                    print(f"[judge server] {line}", end="", file=sys.stderr, flush=True)
        lines.put(None)

    def stop(self, timeout_s: float = 10.0) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=timeout_s)


def serve_options(serve: Any) -> dict[str, Any]:
    """``serve: builtin:judge`` or ``serve: {model: ..., device: cpu, max_new_tokens: 64, startup_timeout_s: 600}``."""
    if isinstance(serve, str):
        return {"model": serve}
    if isinstance(serve, dict) and "model" in serve:
        known = {"model", "name", "device", "max_new_tokens", "startup_timeout_s", "threads"}
        unknown = set(serve) - known
        if unknown:
            raise ConfigError(f"judge: unknown serve option(s) {sorted(unknown)}; known: {sorted(known)}.")
        return dict(serve)
    raise ConfigError(f"judge: serve={serve!r}; use a model name (serve: builtin:judge) or "
                      f"{{model: ..., device: cpu, startup_timeout_s: 600}}.")


def local_judge(serve: Any, name: str = "judge") -> tuple[str, str]:
    """``(base URL, fingerprint of the weights)`` of the local judge for ``serve``, started on first use (one
    per configuration)."""
    options = {"name": name, **serve_options(serve)}
    key = tuple(sorted(options.items()))
    with _LOCK:
        server = _SERVERS.get(key)
        if server is None or server.proc is None or server.proc.poll() is not None:
            server = LocalJudge(**options)
            server.start()
            if not _SERVERS:
                atexit.register(stop_all)
            _SERVERS[key] = server
        return server.url, server.fingerprint  # type: ignore[return-value]


def stop_all() -> None:
    """Stop every local judge this process started (registered with ``atexit``)."""
    with _LOCK:
        servers = list(_SERVERS.values())
        _SERVERS.clear()
    for server in servers:
        server.stop()
