"""One run per output folder: an exclusive ``flock`` on ``<output_dir>/.lock`` for the life of a run.

Two runs writing into one ``output_dir`` would interleave their checkpoints, logs and config (and a fresh
run's clean-up would delete the other's files). So a run takes ``fcntl.flock(LOCK_EX | LOCK_NB)`` on
``<output_dir>/.lock`` before it touches the folder (the CLI: before the model loads) and writes who holds
it -- pid, host, start time, command -- into the file. A second run finds the lock held and refuses with
that information and the fixes. The kernel drops a ``flock`` when its process dies (even by SIGKILL), so a
lock left by a dead run is simply taken over; the file itself is never deleted (deleting it while another
process waits on it would let two runs hold "the" lock). POSIX only: where ``fcntl`` does not exist
(Windows), runs are not locked.

The lock is re-entrant within one process (the CLI takes it, then ``GRPOTrainer.train`` takes it again).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from grouprl.errors import ConfigError

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

LOCK_NAME = ".lock"
_held: dict[Path, list[Any]] = {}  # resolved output_dir -> [file descriptor, depth]


def holder_info() -> dict[str, Any]:
    """What this process writes into the lock file."""
    return {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
            "command": " ".join(sys.argv) or sys.executable}


def read_holder(output_dir: str | Path) -> dict[str, Any]:
    """The holder recorded in ``<output_dir>/.lock`` ({} if none or unreadable)."""
    try:
        return json.loads((Path(output_dir) / LOCK_NAME).read_text() or "{}")
    except (OSError, ValueError):
        return {}


def _busy_message(output_dir: str | Path, holder: dict[str, Any]) -> str:
    who = (f"pid {holder.get('pid', '?')} on {holder.get('host', '?')}, running since {holder.get('started', '?')}"
           f" (command: {holder.get('command', '?')})") if holder else "another process"
    return (f"output_dir {str(output_dir)!r} is in use by another grouprl run: {who}. Two runs in one folder would "
            f"mix their checkpoints and logs. Fix: wait for it to finish, stop it (kill -INT {holder.get('pid', '<pid>')}"
            f" saves a checkpoint and exits), or give this run another output_dir=<dir>.")


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def acquire(output_dir: str | Path) -> str | None:
    """Take the lock (creating ``output_dir``); ConfigError naming the holder if another process has it.
    Returns a note when the lock of a dead run was taken over, else None."""
    if fcntl is None:  # pragma: no cover
        return None
    root = Path(output_dir)
    key = root.resolve()
    if key in _held:
        _held[key][1] += 1
        return None
    try:
        root.mkdir(parents=True, exist_ok=True)
        fd = os.open(root / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise ConfigError(f"output_dir {str(output_dir)!r} cannot be used: {e.strerror or e} "
                          f"({type(e).__name__}). Fix: give output_dir=<dir> a folder this user can create and "
                          f"write.") from None
    if not _try_lock(fd):
        os.close(fd)
        raise ConfigError(_busy_message(output_dir, read_holder(root)))
    previous = read_holder(root)
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(holder_info()).encode(), 0)
    os.fsync(fd)
    _held[key] = [fd, 1]
    if previous.get("pid") and previous.get("pid") != os.getpid():
        return (f"grouprl: took over the lock of {str(output_dir)!r} from pid {previous['pid']} "
                f"(started {previous.get('started', '?')}), which is no longer running")
    return None


def release(output_dir: str | Path) -> None:
    """Drop one level of the lock; the last release empties the file and unlocks it."""
    key = Path(output_dir).resolve()
    if key not in _held:
        return
    _held[key][1] -= 1
    if _held[key][1] > 0:
        return
    fd = _held.pop(key)[0]
    try:
        os.ftruncate(fd, 0)
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


@contextmanager
def run_lock(output_dir: str | Path, *, quiet: bool = False) -> Iterator[None]:
    """``with run_lock(cfg.output_dir):`` hold the output folder for the block (re-entrant)."""
    note = acquire(output_dir)
    if note and not quiet:
        print(note, file=sys.stderr)
    try:
        yield
    finally:
        release(output_dir)


def check_free(output_dir: str | Path) -> None:
    """Read-only check for ``--dry-run``: ConfigError if a live run holds ``output_dir`` (creates nothing)."""
    path = Path(output_dir) / LOCK_NAME
    if fcntl is None or not path.is_file() or Path(output_dir).resolve() in _held:
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        if not _try_lock(fd):
            raise ConfigError(_busy_message(output_dir, read_holder(output_dir)))
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
