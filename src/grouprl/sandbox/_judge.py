"""The judge: trusted harness that runs the tests and writes one authenticated record per test.

Runs as a script (stdlib only) inside the sandbox. It reads the job spec from stdin (the parent writes
it and closes the pipe), drops to the sandbox uid, makes itself non-dumpable (so a process of the same
uid can neither ptrace it nor read its memory or file descriptors through /proc), then starts the
program server -- a separate, fresh interpreter that holds the model's code and never sees a test.
Test code runs HERE, in a namespace whose unknown names resolve to proxies of the program's globals;
values come back as plain data (``_wire``), so the program cannot rebind this process's builtins or
``assert``, cannot hand over objects with a rigged ``__eq__``, and its exit code or output mean
nothing. Each verdict is written to a private copy of fd 1 together with the job's nonce.
"""

import builtins
import json
import os
import select
import signal
import subprocess
import time

from grouprl.sandbox._judge_os import (  # sandbox:inline
    ProgramDied,
    RemoteError,
    TestTimeout,
    _describe_exit,
    _harden,
    _head_tail,
    _norm_output,
    rlimits_preexec,
    same,
)
from grouprl.sandbox._wire import MAX_LINE, WireError, decode, dumps, encode  # sandbox:inline

_REC = None
_NONCE = ""


def emit(**rec):
    rec["nonce"] = _NONCE
    os.write(_REC, dumps(rec))


class Server:
    """The process that holds the model's code; requests go over a pair of private pipes."""

    def __init__(self, spec):
        self.spec = spec
        self.proc = None

    def start(self, deadline):
        req_r, req_w = os.pipe()
        rep_r, rep_w = os.pipe()
        out = open("program.stdout", "ab")
        err = open("program.stderr", "ab")

        argv = [self.spec["python"], "-I", "-c", self.spec["server_src"], str(req_r), str(rep_w)]
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err, pass_fds=(req_r, rep_w),
            preexec_fn=rlimits_preexec(self.spec["limits"]), start_new_session=True, env=self.spec["env"],
        )
        out.close()
        err.close()
        os.close(req_r)
        os.close(rep_w)
        self.wfd, self.rfd, self.buf = req_w, rep_r, b""
        mod = "__main__" if self.spec["suite"]["kind"] == "stdio" else "solution"
        return self.request({"op": "load", "code": self.spec["code"], "module": mod}, deadline)

    def request(self, msg, deadline):
        try:
            data = memoryview(dumps(msg))
            while data:
                data = data[os.write(self.wfd, data):]
        except OSError:
            raise ProgramDied(self._died()) from None
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                self.kill()
                raise TestTimeout("the test ran past its deadline")
            ready, _, _ = select.select([self.rfd], [], [], left)
            if not ready:
                continue
            chunk = os.read(self.rfd, 1 << 20)
            if not chunk:
                raise ProgramDied(self._died())
            self.buf += chunk
            if len(self.buf) > MAX_LINE:
                self.kill()
                raise ProgramDied(f"the program sent a reply larger than {MAX_LINE} bytes")
        line, _, self.buf = self.buf.partition(b"\n")
        try:
            return json.loads(line)
        except ValueError:
            self.kill()
            raise ProgramDied("the program sent a malformed reply") from None

    def _died(self):
        try:
            code = self.proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            self.kill()
            code = None
        self.close()
        return _describe_exit(code, self.spec["limits"])

    def kill(self):
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except OSError:
                pass
            self.proc.wait()
        self.close()

    def close(self):
        for fd in ("wfd", "rfd"):
            if getattr(self, fd, None) is not None:
                os.close(getattr(self, fd))
                setattr(self, fd, None)

    @property
    def alive(self):
        return self.proc is not None and self.proc.poll() is None and self.rfd is not None


def _raise_remote(reply):
    cls = getattr(builtins, str(reply["exc"]), None)
    msg = reply.get("msg", "")
    if isinstance(cls, type) and issubclass(cls, Exception):
        try:
            exc = cls(msg)
        except Exception:
            exc = None
        if exc is not None:
            raise exc
    raise RemoteError("{}: {}".format(reply["exc"], msg))


class Session:
    """The current program server, restarted after a timeout or crash; load failures are sticky."""

    def __init__(self, spec):
        self.spec = spec
        self.server = None
        self.load_failure = None  # (status, reason), fixed once loading failed
        self.deadline = 0.0

    def request(self, msg):
        if self.server is None or not self.server.alive:
            if self.load_failure:
                raise LoadFailed(*self.load_failure)
            self.server = Server(self.spec)
            try:
                reply = self.server.start(self.deadline)
            except TestTimeout:
                self.load_failure = ("timeout", "loading the program ran past the deadline")
                raise LoadFailed(*self.load_failure) from None
            except ProgramDied as e:
                self.load_failure = ("error", f"the program died while loading: {e}")
                raise LoadFailed(*self.load_failure) from None
            if "exc" in reply:
                self.server.kill()
                self.load_failure = ("error", "loading the program raised {}: {}".format(reply["exc"], reply["msg"]))
                raise LoadFailed(*self.load_failure)
        return self.server.request(msg, self.deadline)

    def close(self):
        if self.server is not None:
            self.server.kill()


class LoadFailed(Exception):
    def __init__(self, status, reason):
        super().__init__(reason)
        self.status = status


class Proxy:
    """Stands for one of the program's functions; arguments and results cross as plain data."""

    def __init__(self, session, name):
        self.session, self.name = session, name

    def __call__(self, *args, **kwargs):
        try:
            msg = {"op": "call", "name": self.name, "args": [encode(a) for a in args],
                   "kwargs": {k: encode(v) for k, v in kwargs.items()}}
        except WireError as e:
            raise TypeError(f"argument cannot be sent to the program: {e}") from None
        reply = self.session.request(msg)
        if "exc" in reply:
            _raise_remote(reply)
        return decode(reply["v"])

    def __repr__(self):
        return f"<program function {self.name}>"


class Namespace(dict):
    """Globals of the test code: its own names, then the program's (as proxies), then real builtins."""

    def __init__(self, session, entry_point=None):
        super().__init__(__name__="__tests__")
        self.session, self.entry_point = session, entry_point

    def __missing__(self, name):
        if name != self.entry_point and (name.startswith("__") or name in _BUILTIN_NAMES):
            raise KeyError(name)
        reply = self.session.request({"op": "get", "name": name})
        if reply.get("missing"):
            raise KeyError(name)
        if "exc" in reply:
            _raise_remote(reply)
        if reply.get("callable"):
            self[name] = Proxy(self.session, name)
            return self[name]
        return decode(reply["v"])


_BUILTIN_NAMES = frozenset(dir(builtins))


def _reason(e):
    if isinstance(e, AssertionError):
        return "AssertionError" + (f": {e}" if str(e) else "")
    text = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
    if isinstance(e, MemoryError) or "MemoryError" in text:
        text += f" (memory limit {SPEC['limits']['as_mb']} MiB)"
    return text[:1000]


def run_one(i, session, fn):
    """Run one test under its deadline and emit its record."""
    t0 = time.monotonic()
    end = SPEC["job_end"]
    if t0 >= end:
        emit(i=i, status="timeout", reason="the job's time budget ran out before this test", s=0.0)
        return
    session.deadline = min(t0 + SPEC["test_timeout"], end)
    try:
        fn()
        status, reason = "passed", ""
    except LoadFailed as e:
        status, reason = e.status, str(e)
    except TestTimeout as e:
        status, reason = "timeout", "{} ({:.1f}s)".format(e, SPEC["test_timeout"])
    except ProgramDied as e:
        status, reason = "error", str(e)
    except BaseException as e:  # the test's own assertion or the program's exception
        status, reason = "failed", _reason(e)
    emit(i=i, status=status, reason=reason, s=round(time.monotonic() - t0, 4))


def run_code_tests(suite):
    session = Session(SPEC)
    ns = Namespace(session, suite.get("entry_point"))
    try:
        if suite["kind"] == "call":
            proxy = Proxy(session, suite["entry_point"])
            for i, raw in enumerate(suite["cases"]):
                case = {k: decode(v) for k, v in raw.items()}

                def test(case=case):
                    got = proxy(*case["args"], **case["kwargs"])
                    if not same(got, case["expected"]):
                        raise AssertionError(f"returned {got!r:.200}, expected {case['expected']!r:.200}")
                run_one(i, session, test)
            return
        setup = suite["check"] if suite["kind"] == "check" else suite["setup"]
        session.deadline = SPEC["job_end"]
        setup_error = None
        try:
            exec(compile(setup, "<test setup>", "exec"), ns)
        except BaseException as e:
            setup_error = e
        tests = ["check({})".format(suite["entry_point"])] if suite["kind"] == "check" else suite["tests"]
        for i, src in enumerate(tests):
            def test(src=src, i=i):
                if setup_error is not None:
                    raise setup_error
                exec(compile(src, f"<test {i}>", "exec"), ns)
            run_one(i, session, test)
    finally:
        session.close()


def run_stdio_tests(suite):
    """Each case runs the program afresh with the case's stdin; its stdout is compared here."""
    with open("solution.py", "w") as f:
        f.write(SPEC["code"])
    cap = SPEC["limits"]["output_kb"] * 1024
    clock = _Deadline()
    for i, case in enumerate(suite["cases"]):
        def test(case=case):
            server = Server(SPEC)
            argv = [SPEC["python"], "-I", "solution.py"]
            with open("program.stderr", "ab") as err:
                server.proc = subprocess.Popen(
                    argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                    preexec_fn=rlimits_preexec(SPEC["limits"]), start_new_session=True, env=SPEC["env"],
                )
            proc = server.proc
            try:
                out = _feed_and_read(proc, case["stdin"].encode(), cap, clock.deadline)
            finally:
                server.kill()
            if out is None:
                raise AssertionError(f"the program wrote more than {cap // 1024} KiB to stdout")
            got = out.decode("utf-8", "replace")
            if _norm_output(got) != _norm_output(case["stdout"]):
                raise AssertionError(f"stdout was {got!r:.200}, expected {case['stdout']!r:.200}")
        run_one(i, clock, test)


class _Deadline:
    """What run_one needs of a session when there is no program server: somewhere to put the deadline."""

    deadline = 0.0


def _feed_and_read(proc, data, cap, deadline):
    """Write stdin, read stdout up to ``cap`` bytes before ``deadline``; None when over the cap."""
    out = bytearray()
    wfd, rfd = proc.stdin.fileno(), proc.stdout.fileno()
    os.set_blocking(wfd, False)
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TestTimeout("the program ran past its deadline")
        ws = [wfd] if data else []
        r, w, _ = select.select([rfd], ws, [], left)
        if w:
            try:
                n = os.write(wfd, data[:65536])
                data = data[n:]
            except BrokenPipeError:
                data = b""
            if not data:
                proc.stdin.close()
                wfd = -1
        if r:
            chunk = os.read(rfd, 65536)
            if not chunk:
                break
            out += chunk
            if len(out) > cap:
                return None
        if not data and wfd != -1:
            proc.stdin.close()
            wfd = -1
    code = proc.wait(timeout=max(0.05, deadline - time.monotonic()))
    if code != 0:
        raise ProgramDied(_describe_exit(code, SPEC["limits"]))
    return bytes(out)


def main():
    global _REC, _NONCE, SPEC
    _REC = os.dup(1)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 1)
    raw = b""
    while True:
        chunk = os.read(0, 1 << 20)
        if not chunk:
            break
        raw += chunk
    os.dup2(devnull, 0)
    SPEC = json.loads(raw)
    _NONCE = SPEC["nonce"]
    SPEC["job_end"] = time.monotonic() + SPEC["job_timeout"]
    _harden(SPEC.get("uid"))
    emit(ready=True, uid=os.getuid(), pid=os.getpid())
    try:
        if SPEC["suite"]["kind"] == "stdio":
            run_stdio_tests(SPEC["suite"])
        else:
            run_code_tests(SPEC["suite"])
    finally:
        if SPEC.get("sweep"):
            try:
                os.kill(-1, signal.SIGKILL)  # every other process of this dedicated uid
            except OSError:
                pass
        emit(done=True, stdout=_head_tail("program.stdout", 4096, False),
             stderr=_head_tail("program.stderr", 4096, True))


SPEC = {}

if __name__ == "__main__":
    main()
