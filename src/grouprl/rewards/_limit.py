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
"""

from __future__ import annotations

import atexit
import importlib
import os
import pickle
import select
import struct
import subprocess
import sys
import threading
from typing import Any

_MEMORY_LIMIT = 2 * 1024**3


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
    """
    return _WORKER.call(target, args, timeout)


def _serve() -> None:
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
            module, _, name = target.partition(":")
            result = (True, getattr(importlib.import_module(module), name)(*args))
        except BaseException as e:  # noqa: BLE001 - report every failure to the parent
            result = (False, f"{type(e).__name__}: {e}")
        out = pickle.dumps(result)
        stdout.write(struct.pack("<I", len(out)) + out)
        stdout.flush()


if __name__ == "__main__":
    _serve()
