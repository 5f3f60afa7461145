"""OS-level helpers of the sandbox judge (stdlib only; inlined into ``_judge.py`` like ``_wire.py``).

Nothing here reads the job spec or the judge's state: the judge's exception types, exit-code wording, plain-value equality, output
normalisation, the program's resource limits, reading a file's head or tail, and dropping privileges.
"""

import ctypes
import math
import os
import resource
import signal


class ProgramDied(Exception):
    """The program's process is gone (exit, signal, limit)."""


class TestTimeout(Exception):
    """The test ran past its deadline."""

    __test__ = False


class RemoteError(Exception):
    """An exception raised inside the program that has no built-in counterpart."""


def _describe_exit(code, limits):
    if code is None:
        return "the program's process stopped answering"
    if code < 0:
        sig = -code
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
        if sig == signal.SIGXCPU:
            return "the program was killed by the CPU time limit ({}s, SIGXCPU)".format(limits["cpu_s"])
        if sig == signal.SIGXFSZ:
            return "the program was killed by the file size limit ({} MiB)".format(limits["fsize_mb"])
        return f"the program was killed by signal {name}"
    return f"the program's process exited with code {code} (exiting is never a pass)"


def same(a, b):
    """Equality of two plain values, floats within 1e-6 relative, lists and tuples alike."""
    if isinstance(a, float) or isinstance(b, float):
        if isinstance(a, (int, float)) and isinstance(b, (int, float)):
            return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)
        return False
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return a == b


def _norm_output(text):
    lines = [ln.rstrip() for ln in text.replace("\r\n", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def rlimits_preexec(limits):
    """The ``preexec_fn`` of a program's process: die with the judge, then the job's resource limits."""

    def preexec():
        ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG: die with the judge
        mb = 1024 * 1024
        for res, val in (
            (resource.RLIMIT_AS, limits["as_mb"] * mb),
            (resource.RLIMIT_CPU, limits["cpu_s"]),
            (resource.RLIMIT_NPROC, limits["nproc"]),
            (resource.RLIMIT_FSIZE, limits["fsize_mb"] * mb),
            (resource.RLIMIT_NOFILE, limits["nofile"]),
            (resource.RLIMIT_CORE, 0),
        ):
            resource.setrlimit(res, (val, val))

    return preexec


def _head_tail(path, n, tail):
    try:
        with open(path, "rb") as f:
            if tail:
                f.seek(max(0, os.fstat(f.fileno()).st_size - n))
            return f.read(n).decode("utf-8", "replace")
    except OSError:
        return ""


def _harden(uid):
    """Drop to the sandbox uid, forbid privilege gain, and become non-dumpable."""
    if uid is not None and os.getuid() == 0:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS: setuid binaries give no privileges
    libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 0: no ptrace, no /proc/<judge>/{mem,fd,environ}
    libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: orphans of the program come back to us
    libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG: die with the parent (after setuid, which clears it)
    if os.getuid() == 0 and uid is not None:
        raise RuntimeError("could not drop root privileges")
