"""What isolation this machine allows, detected once per process, and the ``isolation`` levels.

Levels (``sandbox.isolation``):

- ``strict``: bubblewrap gives the judge and the program new network, PID, IPC and UTS namespaces and a
  read-only view of the filesystem with a size-capped private tmpfs as working directory; as root the
  program runs under a dedicated unprivileged uid (so RLIMIT_NPROC applies), otherwise under the user's
  own uid in a user namespace.
- ``basic`` (only when asked for by name): no bubblewrap. rlimits, a scrubbed environment, a private
  temporary directory, a process group and a dedicated uid when root; network and PID namespaces
  through ``unshare`` when that works here, else none (``grouprl sandbox check`` says which).
- ``auto`` (default): ``strict``, and if the machine cannot give ``strict`` the same error as
  ``strict`` -- it never falls back to ``basic`` by itself.
"""

from __future__ import annotations

import functools
import os
import shutil
import stat
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from grouprl.errors import ConfigError

LEVELS = ("auto", "strict", "basic")
INSTALL_HINT = (
    "install bubblewrap: `sudo apt-get install bubblewrap` (Debian/Ubuntu), `sudo dnf install bubblewrap` "
    "(Fedora/RHEL), `sudo pacman -S bubblewrap` (Arch), or `make sandbox-deps` as root"
)


class SandboxUnavailable(ConfigError):
    """The requested isolation level cannot be had on this machine; the message says what is missing."""


def _inaccessible_ancestors(path: str) -> list[str]:
    """Ancestors of ``path`` that other users cannot traverse (mode lacks o+x), outermost first."""
    out, cur = [], os.path.dirname(os.path.abspath(path))
    chain = []
    while cur and cur != "/":
        chain.append(cur)
        cur = os.path.dirname(cur)
    for d in reversed(chain):
        try:
            if not os.stat(d).st_mode & stat.S_IXOTH:
                out.append(d)
                break
        except OSError:
            break
    return out


def sandbox_python() -> str:
    """The interpreter strict jobs run: the base install behind our venv, not the venv itself.

    The judge and the program server need only the standard library, and the venv may live where the
    sandbox mounts its private tmpfs (a checkout under /tmp), which would hide it."""
    base = os.path.realpath(getattr(sys, "_base_executable", "") or sys.executable)
    return base if os.path.exists(base) else sys.executable


def python_paths() -> list[str]:
    """Directories the sandboxed interpreter needs: its install prefix and its executable's directory."""
    paths = {os.path.realpath(sys.base_prefix), os.path.dirname(os.path.realpath(sandbox_python()))}
    return sorted(paths)


@dataclass(frozen=True)
class Capabilities:
    """What was found; ``strict_missing`` lists what strict lacks (empty when strict works)."""

    root: bool
    python: str
    bwrap: str | None
    bwrap_error: str
    unshare: str | None
    unshare_net: bool
    unshare_pid: bool
    masked_dirs: tuple[str, ...] = ()
    strict_missing: tuple[str, ...] = field(default_factory=tuple)
    basic_python: str | None = None
    """Interpreter for the program under ``basic``: the dedicated uid must be able to run it."""

    @property
    def strict(self) -> bool:
        return not self.strict_missing

    def to_dict(self) -> dict:
        return asdict(self) | {"strict": self.strict}


def _probe(argv: list[str]) -> str:
    """'' when ``argv`` runs and exits 0 within 10 s, else the error text."""
    try:
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=10, env={})
    except (OSError, subprocess.TimeoutExpired) as e:
        return str(e)
    return "" if proc.returncode == 0 else (proc.stderr.decode(errors="replace").strip() or f"exit {proc.returncode}")


@functools.lru_cache(maxsize=1)
def detect() -> Capabilities:
    """Probe bubblewrap and unshare once (about 50 ms) and cache the answer for this process."""
    root = os.geteuid() == 0
    python = sandbox_python()
    masked = sorted({a for p in python_paths() for a in _inaccessible_ancestors(p + "/x")})
    bwrap = shutil.which("bwrap") or next((p for p in ("/usr/bin/bwrap", "/bin/bwrap") if os.path.exists(p)), None)
    missing: list[str] = []
    bwrap_error = ""
    if bwrap is None:
        missing.append(f"bubblewrap (bwrap) is not installed; {INSTALL_HINT}")
    else:
        bwrap_error = _probe(bwrap_argv(bwrap, root, masked) + [python, "-I", "-S", "-c", "pass"])
        if bwrap_error:
            missing.append(
                f"bubblewrap ({bwrap}) is installed but cannot create the sandbox here: {bwrap_error}. "
                "It needs unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1 and "
                "user.max_user_namespaces > 0) or root"
            )
    unshare = shutil.which("unshare")
    net = pid = False
    if unshare:
        userns = [] if root else ["--user", "--map-current-user"]
        net = not _probe([unshare, *userns, "--net", "true"])
        pid = not _probe([unshare, *userns, "--net", "--pid", "--fork", "--kill-child", "--mount-proc", "true"])
    return Capabilities(root, python, bwrap, bwrap_error, unshare, net, pid, tuple(masked), tuple(missing),
                        _basic_python(root, masked))


def _basic_python(root: bool, masked: list[str]) -> str | None:
    """sys.executable when another uid can run it; else a system interpreter of the same version."""
    if not root or not masked:
        return sys.executable
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for cand in (f"/usr/bin/{version}", f"/usr/local/bin/{version}"):
        if os.path.exists(cand) and not _inaccessible_ancestors(os.path.realpath(cand)):
            return cand
    return None


def resolve_isolation(isolation: str) -> str:
    """'strict' or 'basic' for a requested level; raises SandboxUnavailable if it cannot be had."""
    if isolation not in LEVELS:
        from grouprl.errors import did_you_mean

        raise ConfigError(f"sandbox.isolation={isolation!r} is not a level; use one of "
                          f"{', '.join(LEVELS)}.{did_you_mean(isolation, LEVELS)}")
    caps = detect()
    if isolation == "basic":
        if caps.basic_python is None:
            raise SandboxUnavailable(
                f"sandbox.isolation='basic' runs the program under a dedicated uid, which cannot reach the "
                f"interpreter {sys.executable} (hidden under {', '.join(caps.masked_dirs)}); install Python "
                f"where other users can run it, or {INSTALL_HINT} and use strict"
            )
        return "basic"
    if not caps.strict:
        raise SandboxUnavailable(
            f"sandbox.isolation={isolation!r} needs strict isolation, which this machine cannot give: "
            + "; ".join(caps.strict_missing)
            + ". Or set sandbox.isolation: basic to accept weaker isolation (no read-only filesystem, "
            "no PID namespace; see docs/SANDBOX.md). `grouprl sandbox check` shows what is available."
        )
    return "strict"


INSIDE_WORKDIR = "/tmp"
"""The sandbox's working directory (a private tmpfs) as the job sees it."""


def bwrap_argv(bwrap: str, root: bool, masked: list[str] | tuple[str, ...], tmpfs_mb: int = 64,
               hide: tuple[str, ...] = ()) -> list[str]:
    """bubblewrap command line: new net/pid/ipc/uts namespaces, read-only /, private tmpfs at /tmp.

    ``masked`` directories (not traversable by other users, e.g. /root holding a pyenv interpreter) and
    ``hide`` paths (e.g. where the evaluation data lives) are replaced by empty tmpfs mounts (a hidden
    file by /dev/null); the interpreter's own directories under them are bind-mounted back read-only.
    """
    argv = [bwrap, "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            "--die-with-parent", "--new-session", "--ro-bind", "/", "/"]
    tops = sorted({os.path.abspath(p) for p in (*masked, *hide) if os.path.exists(p)}, key=len)
    for top in tops:
        if not os.path.isdir(top):
            argv += ["--ro-bind", "/dev/null", top]
            continue
        argv += ["--perms", "0755", "--tmpfs", top]
        for p in python_paths():
            if p == top or p.startswith(top + "/"):
                parts = Path(p).relative_to(top).parts
                for i in range(1, len(parts)):
                    argv += ["--perms", "0755", "--dir", str(Path(top, *parts[:i]))]
                argv += ["--ro-bind", p, p]
    argv += ["--dev", "/dev", "--proc", "/proc",
             "--perms", "1777", "--size", str(tmpfs_mb << 20), "--tmpfs", INSIDE_WORKDIR,
             "--perms", "1777", "--size", str(8 << 20), "--tmpfs", "/dev/shm",
             "--chdir", INSIDE_WORKDIR]
    # An interpreter installed under /tmp is hidden by the private tmpfs just mounted there: bind its
    # directories back, read-only, on top of it (bwrap resolves bind sources on the host).
    for p in python_paths():
        if p.startswith(INSIDE_WORKDIR + "/"):
            parts = Path(p).relative_to(INSIDE_WORKDIR).parts
            for i in range(1, len(parts)):
                argv += ["--dir", str(Path(INSIDE_WORKDIR, *parts[:i]))]
            argv += ["--ro-bind", p, p]
    argv += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"] if root else ["--unshare-user"]
    return argv + ["--"]
