"""Run one (code, tests) job in a fresh sandbox and turn the judge's records into a SandboxResult.

Per job: a fresh process tree in its own session (the wall-clock deadline kills the whole group), the
judge started through bubblewrap (strict) or plainly (basic) with a scrubbed environment and the job
spec on stdin; the judge drops to a dedicated uid (leased with a lock file, so concurrent jobs never
share one), sets the rlimits on the program's process and writes one record per test, each carrying
a random nonce that only the parent and the judge know. Only authenticated records count; a test
without a record did not pass. Afterwards every process left under the job's uid is killed and the
working directory is removed.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import fcntl
import functools
import json
import math
import os
import random
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from grouprl.sandbox import _wire as wire
from grouprl.sandbox.capabilities import INSIDE_WORKDIR, bwrap_argv
from grouprl.sandbox.result import SandboxResult, TestResult
from grouprl.sandbox.suite import normalize_tests, suite_size

UID_BASE, UID_SPAN = 1_800_000_000, 1 << 24
GRACE_S = 5.0  # parent-side slack over the job budget for start-up and clean-up
LEASED_UIDS: collections.deque[int] = collections.deque(maxlen=100_000)  # uids this process leased


@dataclass(frozen=True)
class Limits:
    """Resource limits of the program's process (each process it starts gets the same)."""

    memory_mb: int = 1024
    """RLIMIT_AS in MiB. Python itself needs ~30 MiB; numpy with one thread ~120 MiB."""
    nproc: int = 64
    """RLIMIT_NPROC: processes and threads of the job's uid, judge included."""
    fsize_mb: int = 16
    """RLIMIT_FSIZE in MiB: largest file the program may write (its stdout/stderr files included)."""
    nofile: int = 128
    """RLIMIT_NOFILE: open file descriptors."""
    output_kb: int = 1024
    """stdout read back from a stdin/stdout program before the test fails."""
    tmpfs_mb: int = 64
    """Size of the private working directory (strict: a tmpfs)."""


def _inline(name: str) -> str:
    """``name``'s source with each ``from grouprl.sandbox.<mod> import ...  # sandbox:inline`` statement
    replaced by ``<mod>.py`` itself: the judge and the program server run as single stdlib-only scripts."""
    here = Path(__file__).parent
    lines, out = iter((here / name).read_text().splitlines()), []
    for line in lines:
        found = re.match(r"from grouprl\.sandbox\.(\w+) import .*# sandbox:inline$", line)
        if not found:
            out.append(line)
            continue
        out.append((here / f"{found[1]}.py").read_text())
        if "(" in line:  # a parenthesised import list: skip to its end
            while ")" not in line:
                line = next(lines)
    return "\n".join(out) + "\n"


@functools.lru_cache(maxsize=1)
def scripts() -> tuple[str, str]:
    """(judge source, program-server source), each with the wire codec inlined."""
    return _inline("_judge.py"), _inline("_server.py")


@contextlib.contextmanager
def uid_lease() -> Iterator[int | None]:
    """A uid no other job on this machine uses right now (root only; None otherwise)."""
    if os.geteuid() != 0:
        yield None
        return
    lockdir = Path(tempfile.gettempdir()) / "grouprl-sandbox-uids"
    lockdir.mkdir(mode=0o700, exist_ok=True)
    rng = random.SystemRandom()
    for _ in range(1000):
        uid = UID_BASE + rng.randrange(UID_SPAN)
        fd = os.open(lockdir / str(uid), os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        LEASED_UIDS.append(uid)
        try:
            yield uid
        finally:
            kill_uid(uid)
            with contextlib.suppress(OSError):
                os.unlink(lockdir / str(uid))
            os.close(fd)
        return
    raise RuntimeError("no free sandbox uid after 1000 tries")


def uid_pids(uid: int) -> list[int]:
    """Pids of live processes owned by ``uid`` (from /proc)."""
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            with contextlib.suppress(OSError):
                if os.stat(f"/proc/{name}").st_uid == uid:
                    out.append(int(name))
    return out


def kill_uid(uid: int, rounds: int = 200) -> int:
    """SIGKILL every process of ``uid`` until none is left; returns how many were still found."""
    found = 0
    for _ in range(rounds):
        pids = uid_pids(uid)
        if not pids:
            return found
        found += len(pids)
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.005)
    return found


def _env(workdir: str) -> dict[str, str]:
    """The whole environment of the sandbox: nothing is inherited from the parent."""
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1", "OMP_NUM_THREADS": "1",
            "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def run_tests(
    code: str,
    tests: Any,
    *,
    timeout: float = 10.0,
    isolation: str = "auto",
    entry_point: str | None = None,
    test_timeout: float | None = None,
    limits: Limits | None = None,
    hide_paths: tuple[str, ...] | list[str] = (),
) -> SandboxResult:
    """Run ``code`` against ``tests`` in a fresh sandbox; ``timeout`` is the job's wall-clock budget.

    ``tests`` is any form :func:`grouprl.sandbox.suite.normalize_tests` accepts. ``test_timeout``
    (default: ``timeout``) bounds each test. ``hide_paths`` (strict only) are made invisible to the
    program, e.g. the directory holding the expected outputs. Raises SandboxUnavailable when
    ``isolation`` cannot be had.
    """
    from grouprl.sandbox.capabilities import detect, resolve_isolation

    level = resolve_isolation(isolation)
    suite = normalize_tests(tests, entry_point=entry_point)
    n = suite_size(suite)
    if n == 0:
        return SandboxResult.not_run("no_tests", "the test suite is empty", 0, level)
    caps = detect()
    limits = _job_limits(limits or Limits(), caps)
    t0 = time.monotonic()
    with uid_lease() as uid, contextlib.ExitStack() as stack:
        argv, cwd, workdir, pid_ns = _launcher(level, caps, limits, tuple(hide_paths), uid, stack)
        # basic has no mount namespace: after the judge drops to the job's uid it (and the program) must
        # still be able to read the interpreter's stdlib, so both use one the uid can reach
        python = caps.python if level == "strict" else caps.basic_python
        nonce = secrets.token_hex(16)
        spec = _job_spec(code, suite, nonce=nonce, uid=uid, python=python, timeout=timeout,
                         test_timeout=test_timeout, sweep=uid is not None or pid_ns, limits=limits, workdir=workdir)
        argv = argv + [python, "-I", "-S", "-c", scripts()[0]]
        try:
            out, err, killed = _communicate(argv, cwd, _env(workdir), json.dumps(spec).encode(), timeout + GRACE_S)
        except OSError as e:
            return SandboxResult.not_run("sandbox_error", f"could not start the sandbox: {e}", n, level)
    result = _collect(out, err, nonce, n, killed, timeout)
    result.seconds = time.monotonic() - t0
    result.isolation = level
    return result


def _job_limits(limits: Limits, caps) -> Limits:
    """``limits`` for this job. Without root, RLIMIT_NPROC counts all of the user's processes, not just
    the job's: the ones already running are added to the allowance."""
    if caps.root:
        return limits
    return dataclasses.replace(limits, nproc=limits.nproc + len(uid_pids(os.getuid())))


def _launcher(level: str, caps, limits: Limits, hide_paths: tuple[str, ...], uid: int | None,
              stack: contextlib.ExitStack) -> tuple[list[str], str, str, bool]:
    """(argv prefix, cwd of the launcher, the job's working directory as the judge sees it, whether the job
    has its own PID namespace). Basic: a fresh host directory, owned by the job's uid and removed when
    ``stack`` closes. Strict: bubblewrap's private tmpfs."""
    if level == "strict":
        argv = bwrap_argv(caps.bwrap, caps.root, caps.masked_dirs, limits.tmpfs_mb, hide_paths)
        return argv, "/", INSIDE_WORKDIR, True
    workdir = tempfile.mkdtemp(prefix="grouprl-sandbox-")
    stack.callback(shutil.rmtree, workdir, True)
    if uid is not None:
        os.chown(workdir, uid, uid)
    os.chmod(workdir, 0o700)
    argv, pid_ns = _basic_prefix(caps)
    return argv, workdir, workdir, pid_ns


def _job_spec(code: str, suite: dict, *, nonce: str, uid: int | None, python: str, timeout: float,
              test_timeout: float | None, sweep: bool, limits: Limits, workdir: str) -> dict[str, Any]:
    """What the judge reads on stdin (see ``_judge.py``)."""
    if suite["kind"] == "call":  # Python values (tuples, sets, bytes...) survive the trip to the judge
        suite = {**suite, "cases": [{k: wire.encode(v) for k, v in case.items()} for case in suite["cases"]]}
    return {
        "nonce": nonce, "uid": uid, "python": python, "server_src": scripts()[1], "code": code,
        "suite": suite, "job_timeout": float(timeout), "test_timeout": float(test_timeout or timeout),
        # kill(-1) from the judge reaches only the job's own processes: under a dedicated uid or in
        # a PID namespace. Never otherwise -- it would hit every process of the user.
        "sweep": sweep,
        "limits": asdict(limits) | {"as_mb": limits.memory_mb, "cpu_s": math.ceil(timeout) + 1},
        "env": _env(workdir),
    }


def _basic_prefix(caps) -> tuple[list[str], bool]:
    """(``unshare`` prefix, whether it gives a PID namespace) for the basic level."""
    if not caps.unshare or not caps.unshare_net:
        return [], False
    userns = [] if caps.root else ["--user", "--map-current-user"]
    pid_ns = caps.unshare_pid
    pid = ["--pid", "--fork", "--kill-child", "--mount-proc"] if pid_ns else []
    return [caps.unshare, *userns, "--net", *pid, "--"], pid_ns


def _communicate(argv, cwd, env, data: bytes, deadline: float) -> tuple[bytes, bytes, bool]:
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            cwd=cwd, env=env, start_new_session=True)
    killed = False
    try:
        out, err = proc.communicate(data, timeout=deadline)
    except subprocess.TimeoutExpired:
        killed = True
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
    finally:
        if proc.poll() is None:
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return out, err, killed


def _collect(out: bytes, err: bytes, nonce: str, n: int, killed: bool, timeout: float) -> SandboxResult:
    """Count only records that carry the nonce; anything else on the stream is ignored."""
    ready, done, tests = False, {}, {}
    for line in out.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if not isinstance(rec, dict) or rec.get("nonce") != nonce:
            continue
        if rec.get("ready"):
            ready = True
        elif rec.get("done"):
            done = rec
        elif isinstance(rec.get("i"), int) and 0 <= rec["i"] < n and rec.get("status") in ("passed", "failed", "error", "timeout"):
            tests[rec["i"]] = TestResult(rec["i"], rec["status"], str(rec.get("reason", "")), float(rec.get("s", 0.0)))
    errtext = err.decode("utf-8", "replace")[-2000:].strip()
    if not ready:
        reason = "the sandbox failed before the program ran: " + (errtext or "no output from the judge")
        if killed:
            reason = f"the sandbox did not start within {timeout + GRACE_S:.0f}s"
        return SandboxResult.not_run("sandbox_error", reason, n)
    if killed:
        missing = ("timeout", f"the job ran past its budget of {timeout:g}s and was killed")
    else:
        missing = ("error", "the judge stopped before this test (the program may have killed it)")
    results = [tests.get(i) or TestResult(i, *missing) for i in range(n)]
    statuses = {r.status for r in results}
    status = "timeout" if "timeout" in statuses else "error" if "error" in statuses else "ok"
    reason = next((f"test {r.index}: {r.reason}" for r in results if not r.passed), "")
    return SandboxResult(sum(r.passed for r in results), n, status, reason, results,
                         stdout=str(done.get("stdout", "")), stderr=str(done.get("stderr", "")))
