"""Hostile programs must be contained: reward 0 with the right reason, the host and this test process
unaffected, no process left behind (the ``no_leftovers`` fixture scans the process table), and a
bounded run time (pytest-timeout)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import textwrap
import time

import psutil
import pytest

from grouprl.sandbox import detect, run_tests

pytestmark = pytest.mark.timeout(90)
def run(code: str, tests=("assert f() == 1",), **kw):
    return run_tests(textwrap.dedent(code), list(tests), **{"timeout": 3.0, **kw})


def test_fork_bomb(level, no_leftovers):
    res = run(isolation=level, code="""
        import os
        def f():
            while True:
                try:
                    os.fork()
                except OSError:
                    pass
    """)
    assert res.reward == 0.0 and res.status == "timeout"
    assert "deadline" in res.tests[0].reason


def test_infinite_loop(level, no_leftovers):
    res = run(isolation=level, code="def f():\n    while True:\n        pass\n")
    assert (res.reward, res.status, res.tests[0].status) == (0.0, "timeout", "timeout")


def test_memory_bomb(level, no_leftovers):
    res = run(isolation=level, code="def f():\n    blocks = []\n    while True:\n        blocks.append(bytearray(1 << 26))\n", timeout=10.0)
    assert res.reward == 0.0 and "MemoryError (memory limit 1024 MiB)" in res.tests[0].reason


def test_one_gigabyte_of_output(level, no_leftovers):
    res = run(isolation=level, code="""
        import sys
        def f():
            for _ in range(1024):
                sys.stdout.write("x" * (1 << 20))
            return 1
    """, timeout=10.0)
    assert res.reward == 0.0 and "File too large" in res.tests[0].reason
    assert len(res.stdout) <= 4096  # what comes back to the parent is capped


def test_one_gigabyte_on_stdout_of_a_stdin_program(level, no_leftovers):
    prog = "import sys\nfor _ in range(1024):\n    sys.stdout.write('x' * (1 << 20))\n"
    res = run_tests(prog, [{"input": "", "output": "x"}], timeout=10.0, isolation=level)
    assert res.reward == 0.0 and "more than 1024 KiB" in res.tests[0].reason


def test_writing_outside_the_workdir(level, no_leftovers, tmp_path):
    target = tmp_path / "escaped.txt"
    repo_file = os.path.abspath("PWNED_BY_SANDBOX")
    res = run(isolation=level, code=f"""
        def f():
            for path in ({str(target)!r}, {repo_file!r}, "/etc/pwned"):
                try:
                    open(path, "w").write("x")
                    return 1
                except OSError:
                    pass
            return 0
    """)
    assert res.reward == 0.0 and res.tests[0].reason.startswith("AssertionError")
    assert not target.exists() and not os.path.exists(repo_file) and not os.path.exists("/etc/pwned")


def test_the_workdir_is_writable_and_private(level, no_leftovers):
    res = run(isolation=level, code="""
        import os
        def f():
            open("scratch.txt", "w").write("ok")
            fresh = set(os.listdir(".")) <= {"scratch.txt", "program.stdout", "program.stderr"}
            return int(open("scratch.txt").read() == "ok" and fresh)
    """)
    assert res.reward == 1.0


def test_parent_environment_secrets_do_not_reach_the_program(level, no_leftovers, monkeypatch):
    monkeypatch.setenv("API_KEY", "sk-fake-0123456789")
    res = run(isolation=level, code="""
        import os
        def f():
            found = os.environ.get("API_KEY", "")
            for pid in os.listdir("/proc"):
                try:
                    found += open(f"/proc/{pid}/environ", "rb").read().decode(errors="replace")
                except OSError:
                    pass
            print(found)
            return found
    """, tests=["assert 'sk-fake' in f()"])
    assert res.reward == 0.0 and res.tests[0].reason.startswith("AssertionError")
    assert "sk-fake" not in res.stdout + res.stderr


def test_socket_to_localhost(level, no_leftovers):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.setblocking(False)
    port = server.getsockname()[1]
    try:
        res = run(isolation=level, code=f"""
            import socket
            def f():
                socket.create_connection(("127.0.0.1", {port}), timeout=1).sendall(b"hi")
                return 1
        """)
        assert res.reward == 0.0 and ("ConnectionRefusedError" in res.tests[0].reason or "OSError" in res.tests[0].reason)
        with pytest.raises(BlockingIOError):
            server.accept()  # nothing connected to the host's loopback
    finally:
        server.close()


def test_signalling_or_killing_the_parent(level, no_leftovers):
    me = os.getpid()
    res = run(isolation=level, code=f"""
        import os, signal
        def f():
            for pid in (os.getppid(), {me}, 1, -1):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            return 0
    """)
    assert res.reward == 0.0
    if level == "strict":  # the judge is an ordinary process of the same uid: killing it fails closed
        assert res.status == "error" and "judge stopped" in res.tests[0].reason
    else:  # basic as root: the judge is init of a PID namespace and ignores the SIGKILL
        assert res.tests[0].reason.startswith("AssertionError")
    assert psutil.pid_exists(me) and os.getpid() == me  # this process is alive to check


def test_sleeping_past_the_deadline(level, no_leftovers):
    res = run(isolation=level, code="import time\ndef f():\n    time.sleep(600)\n    return 1\n", timeout=2.0)
    assert (res.reward, res.status) == (0.0, "timeout")


def test_detached_grandchild_does_not_outlive_the_job(level, no_leftovers):
    res = run(isolation=level, code="""
        import os, sys
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                os.execv("/bin/sh", ["sh", "-c", "sleep 1000; echo PASSED"])
            os._exit(0)
        def f():
            return 0
    """)
    assert res.reward == 0.0 and res.tests[0].reason.startswith("AssertionError")


def test_rlimits_and_identity_inside(level, no_leftovers):
    # Limits() defaults: core 0, 64 processes, 1024 MiB address space, 128 fds, 16 MiB files;
    # CPU seconds = ceil(timeout) + 1 = ceil(3.0) + 1 = 4 (soft and hard alike)
    res = run(isolation=level, code="""
        import os, resource
        def f():
            return [os.getuid() != 0, resource.getrlimit(resource.RLIMIT_CORE)[1],
                    resource.getrlimit(resource.RLIMIT_NPROC)[1], resource.getrlimit(resource.RLIMIT_AS)[1] >> 20,
                    resource.getrlimit(resource.RLIMIT_NOFILE)[1], resource.getrlimit(resource.RLIMIT_FSIZE)[1] >> 20,
                    list(resource.getrlimit(resource.RLIMIT_CPU))]
    """, tests=["assert f() == [True, 0, 64, 1024, 128, 16, [4, 4]]"])
    assert res.reward == 1.0, res.reason


def test_private_workdir_is_removed_afterwards(level, no_leftovers):
    # The program reports its working directory through a failing (input, expected) test's reason.
    res = run_tests("import os\ndef f():\n    open('left.txt', 'w').write('x')\n    return os.getcwd()\n",
                    [((), "?")], entry_point="f", timeout=5.0, isolation=level)
    reason = res.tests[0].reason
    assert reason.startswith("AssertionError: returned '") and reason.endswith("', expected '?'"), reason
    workdir = reason.split("'")[1]
    if level == "strict":
        assert workdir == "/tmp"  # a tmpfs inside bubblewrap's mount namespace: it dies with the sandbox
        assert not os.path.exists("/tmp/left.txt")
    else:
        assert os.path.basename(workdir).startswith("grouprl-sandbox-") and not os.path.exists(workdir)


def test_test_code_and_program_can_import_the_stdlib(level, no_leftovers):
    check = "import random\n\ndef check(candidate):\n    rng = random.Random(0)\n    xs = [rng.randrange(9) for _ in range(5)]\n    assert candidate(xs) == sorted(xs)\n"
    res = run_tests("import heapq\ndef f(xs):\n    return heapq.nsmallest(len(xs), xs)\n", check, entry_point="f",
                    timeout=5.0, isolation=level)
    assert res.reward == 1.0, res.reason


@pytest.mark.skipif(not detect().strict, reason="bubblewrap not available")
def test_hidden_paths_keep_answer_files_out_of_reach(no_leftovers):
    """World-readable files are visible under strict unless hidden (docs/SANDBOX.md)."""
    import tempfile

    d = tempfile.mkdtemp(dir="/var/tmp")
    try:
        os.chmod(d, 0o755)
        answers = os.path.join(d, "answers.txt")
        with open(answers, "w") as f:
            f.write("42")
        os.chmod(answers, 0o644)
        cheat = f"def f():\n    try:\n        return int(open({answers!r}).read())\n    except OSError:\n        return -1\n"
        assert run_tests(cheat, ["assert f() == 42"], timeout=5).reward == 1.0  # visible by default
        assert run_tests(cheat, ["assert f() == 42"], timeout=5, hide_paths=[d]).reward == 0.0
        assert run_tests(cheat, ["assert f() == 42"], timeout=5, hide_paths=[answers]).reward == 0.0
    finally:
        import shutil

        shutil.rmtree(d)


def test_hostile_jobs_do_not_disturb_honest_ones_running_beside_them(level, no_leftovers):
    """Each job has its own uid (NPROC, kill(-1) and clean-up stay inside it) and its own namespaces."""
    from grouprl.sandbox import CodeJob, run_many

    honest = CodeJob("def f():\n    return 1\n", ["assert f() == 1"])
    hostile = [
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",  # fork bomb
        "import os, signal\nos.kill(-1, signal.SIGKILL)\ndef f():\n    return 0\n",  # kill everything it may
        "x = [bytearray(1 << 26) for _ in range(64)]\n",  # memory bomb
    ]
    jobs = [job for code in hostile for job in (CodeJob(code, ["assert f() == 1"]), honest)]
    results = run_many(jobs, workers=3, timeout=4.0, isolation=level)
    assert [r.reward for r in results] == [0.0, 1.0, 0.0, 1.0, 0.0, 1.0]


def test_the_leftover_check_sees_stray_processes(leftover_scan):
    """Negative control for ``no_leftovers``: a process started during a test is reported, both as a
    descendant of this process and, when detached under a job uid, through the uid scan."""
    children, sandbox_pids = leftover_scan
    existing = children()
    child = subprocess.Popen(["sleep", "30"])
    try:
        assert sandbox_pids(set(), existing) == [child.pid]
    finally:
        child.kill()
        child.wait()
    assert sandbox_pids(set(), existing) == []
    if os.geteuid() != 0:
        return
    uid = 1_800_000_000 - 7  # outside the lease range: no real job uses it
    # sh backgrounds sleep and exits: the sleep is re-parented away from us, only its uid gives it away
    subprocess.run(["sh", "-c", "sleep 30 >/dev/null 2>&1 &"], user=uid, group=uid, check=True)
    deadline = time.monotonic() + 5
    while not (stray := sandbox_pids({uid}, children())) and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        assert len(stray) == 1 and psutil.Process(stray[0]).uids().real == uid
        assert stray[0] not in {pid for pid, _ in children()}
    finally:
        for pid in stray:
            os.kill(pid, signal.SIGKILL)
