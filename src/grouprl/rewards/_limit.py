"""A killable worker process that runs one function call under a wall-clock limit.

Why: math-verify's own timeout uses ``signal.alarm``, which raises outside the main thread (reward
functions often run in a thread pool) and cannot interrupt C code (sympy's big-integer arithmetic:
``9^{9^{9^9}}``). We disable it and instead send pathological inputs to a separate process that can be
killed. Common inputs never come here, so they stay fast (no process round trip).

The worker is a plain ``python -m grouprl.rewards._limit`` subprocess speaking length-prefixed pickles
over its stdin/stdout. It is independent of ``multiprocessing`` start methods, so it never re-imports
the user's ``__main__`` (a training script without an ``if __name__ == "__main__"`` guard is safe).
It is started lazily, reused, killed on timeout and restarted on the next call. Memory is capped with
``RLIMIT_AS`` so a runaway expression cannot take the trainer's RAM.

``time_limited`` puts a whole reward under its ``time_limit``: a completion longer than
``INPROCESS_CHARS`` is scored in the worker (answer extraction, regexes and all), not only the
comparison of the extracted answer. Inside the worker, nested limited calls run directly: the outer
limit already covers them.
"""

from __future__ import annotations

import atexit
import functools
import importlib
import os
import pickle
import select
import struct
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import Any

_MEMORY_LIMIT = 2 * 1024**3
INPROCESS_CHARS = 20_000
"""Completions up to this many characters are scored in-process (no round trip); longer ones in the worker."""
DEFAULT_TIME_LIMIT = 5.0
_IN_WORKER = False


class _Worker:
    def __init__(self) -> None:
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()

    def _start(self) -> subprocess.Popen:
        env = dict(os.environ)
        pkg_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env["PYTHONPATH"] = os.pathsep.join(
            [pkg_root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        )
        return subprocess.Popen(
            [sys.executable, "-u", "-m", "grouprl.rewards._limit"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
        )

    def kill(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc = None

    def call(self, target: str, args: tuple, timeout: float) -> tuple[bool, Any]:
        """Run ``target`` ("module:function") on ``args``; (True, result) or (False, reason)."""
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                self._proc = self._start()
            proc = self._proc
            payload = pickle.dumps((target, args))
            try:
                proc.stdin.write(struct.pack("<I", len(payload)) + payload)
                proc.stdin.flush()
                header = _read_exact(proc.stdout, 4, timeout)
                if header is None:
                    self.kill()
                    return False, "timeout"
                (size,) = struct.unpack("<I", header)
                body = _read_exact(proc.stdout, size, timeout)
                if body is None:
                    self.kill()
                    return False, "timeout"
                ok, value = pickle.loads(body)
                return ok, value
            except (OSError, EOFError, pickle.UnpicklingError, struct.error) as e:
                self.kill()
                return False, f"worker failed: {e}"


def _read_exact(stream, n: int, timeout: float) -> bytes | None:
    import time

    deadline = time.monotonic() + timeout
    fd = stream.fileno()
    buf = b""
    while len(buf) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            return None
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            raise EOFError("worker exited")
        buf += chunk
    return buf


_WORKER = _Worker()
atexit.register(_WORKER.kill)


def _forget_after_fork() -> None:
    """A forked child (e.g. a data-loader worker) must not share the parent's pipes or lock."""
    _WORKER._proc = None
    _WORKER._lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


def call_with_limit(target: str, args: tuple, timeout: float) -> tuple[bool, Any]:
    """Call ``target`` ("package.module:function") with ``args`` in the worker, at most ``timeout`` s.

    Returns ``(True, result)``, or ``(False, reason)`` on timeout, crash or exception (never raises).
    Inside the worker it calls ``target`` directly (the caller's limit already covers it).
    """
    if _IN_WORKER:
        try:
            return True, _import(target)(*args)
        except Exception as e:  # noqa: BLE001 - same contract as the worker: report, never raise
            return False, f"{type(e).__name__}: {e}"
    return _WORKER.call(target, args, timeout)


def _import(target: str) -> Callable:
    module, _, name = target.partition(":")
    obj: Any = importlib.import_module(module)
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def _apply(target: str, args: tuple, kwargs: dict) -> tuple[str, Any]:
    """Worker side of ``time_limited``: ("ok", value) or ("error", exception) so the caller can re-raise."""
    try:
        return "ok", _import(target)(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - handed back to the caller
        try:
            pickle.dumps(e)
        except Exception:  # noqa: BLE001
            e = RuntimeError(f"{type(e).__name__}: {e}")
        return "error", e


def time_limited(fn: Callable | None = None, *, fallback: float | None = 0.0, in_process: Callable | None = None):
    """Decorate a reward ``fn(completion, ...)`` so that a long completion is scored in the killable
    worker under ``time_limit`` seconds (the call's ``time_limit=`` keyword, default 5). On timeout the
    score is ``fallback`` (0.0: an answer that cannot be read in time is not credited). Short
    completions, and keyword values that cannot be pickled (a tokenizer object), run in-process.
    Errors raised by the reward (e.g. ``ConfigError`` for a bad option) reach the caller either way.
    ``in_process(args, kwargs) -> bool``: calls that must stay here (code tests run in their own
    sandbox, which has its own limits).
    """
    if fn is None:
        return functools.partial(time_limited, fallback=fallback, in_process=in_process)
    target = f"{fn.__module__}:{fn.__qualname__}"

    @functools.wraps(fn)
    def limited(completion, *args, **kwargs):
        if (
            _IN_WORKER
            or not isinstance(completion, str)
            or len(completion) <= INPROCESS_CHARS
            or (in_process is not None and in_process(args, kwargs))
        ):
            return fn(completion, *args, **kwargs)
        try:
            payload = (target, (completion, *args), kwargs)
            pickle.dumps(payload)
        except Exception:  # noqa: BLE001 - unpicklable options: no worker, run here
            return fn(completion, *args, **kwargs)
        limit = kwargs.get("time_limit", DEFAULT_TIME_LIMIT)
        ok, value = _WORKER.call("grouprl.rewards._limit:_apply", payload, float(limit))
        if not ok:
            return fallback
        status, result = value
        if status == "error":
            if isinstance(result, (MemoryError, RecursionError)):
                return fallback  # the worker's memory cap, or nesting too deep to read: not credited
            raise result
        return result

    return limited


def _serve() -> None:
    global _IN_WORKER
    _IN_WORKER = True  # this module runs as __main__; the rewards import it under its own name:
    importlib.import_module("grouprl.rewards._limit")._IN_WORKER = True
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (_MEMORY_LIMIT, _MEMORY_LIMIT))
    except (ImportError, ValueError, OSError):
        pass
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    while True:
        header = stdin.read(4)
        if len(header) < 4:
            return
        (size,) = struct.unpack("<I", header)
        target, args = pickle.loads(stdin.read(size))
        try:
            result = (True, _import(target)(*args))
        except BaseException as e:  # noqa: BLE001 - report every failure to the parent
            result = (False, f"{type(e).__name__}: {e}")
        out = pickle.dumps(result)
        stdout.write(struct.pack("<I", len(out)) + out)
        stdout.flush()


if __name__ == "__main__":
    _serve()
