"""``judge: {serve: MODEL}``: the run starts ``grouprl serve`` on loopback, uses it, and stops it; a server that
never becomes ready, or dies, is a clear error in bounded time; a server outlives no parent."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
import pytest

from grouprl.errors import ConfigError, RewardError
from grouprl.rewards import _judge_serve
from grouprl.rewards.judge import judge_reward


@pytest.fixture(autouse=True)
def _stop_servers():
    yield
    _judge_serve.stop_all()


def test_serve_starts_answers_and_stops(tiny_model_dir):
    out = judge_reward(["q", "q"], ["a", "b"], serve={"model": str(tiny_model_dir), "max_new_tokens": 16},
                       timeout_s=60, max_retries=0)
    assert len(out) == 2 and all(s is not None and 0 <= s <= 1 for s in out)  # structured: always parses
    (server,) = _judge_serve._SERVERS.values()
    pid = server.proc.pid
    assert server.url.startswith("http://127.0.0.1:") and psutil.pid_exists(pid)
    again = judge_reward(["q"], ["c"], serve={"model": str(tiny_model_dir), "max_new_tokens": 16}, timeout_s=60)
    assert len(_judge_serve._SERVERS) == 1 and server.proc.pid == pid and again[0] is not None  # one server
    _judge_serve.stop_all()
    assert not _judge_serve._SERVERS
    with pytest.raises(psutil.NoSuchProcess):
        psutil.Process(pid).status()  # reaped, not a zombie


def test_a_server_that_is_never_ready_is_an_error_in_bounded_time(tiny_model_dir):
    start = time.monotonic()
    with pytest.raises(RewardError, match=r"(?s)was not ready after 0\.5s.*startup_timeout_s"):
        judge_reward(["q"], ["a"], serve={"model": str(tiny_model_dir), "startup_timeout_s": 0.5})
    assert time.monotonic() - start < 15  # the 0.5 s wait, then terminate (at most 10 s)
    assert not _judge_serve._SERVERS


def test_a_server_that_exits_reports_its_output():
    with pytest.raises(RewardError, match=r"(?s)exited with code 2.*unknown built-in model 'builtin:nosuch'"):
        judge_reward(["q"], ["a"], serve="builtin:nosuch")


def test_serve_and_base_url_exclude_each_other():
    with pytest.raises(ConfigError, match="either base_url"):
        judge_reward(["q"], ["a"], serve="builtin:judge", base_url="http://127.0.0.1:1/v1")
    with pytest.raises(ConfigError, match="unknown serve option"):
        judge_reward(["q"], ["a"], serve={"model": "x", "gpu": 1})


def test_the_server_stops_when_its_parent_dies(tiny_model_dir):
    """``--parent-pid``: a judge whose run was killed (no atexit) shuts itself down."""
    parent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    cmd = [sys.executable, "-m", "grouprl", "serve", str(tiny_model_dir), "--port", "0", "--device", "cpu",
           "--parent-pid", str(parent.pid)]
    server = subprocess.Popen(cmd, stderr=subprocess.DEVNULL, env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        time.sleep(1)
        assert server.poll() is None
        parent.kill()
        parent.wait(timeout=10)
        assert server.wait(timeout=60) == 0
    finally:
        for p in (parent, server):
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)


def test_a_zombie_parent_counts_as_dead():
    """A parent that died but was not reaped (a container whose PID 1 reaps nothing) still answers
    kill(pid, 0); the watchdog must see it as gone, or the judge outlives its run."""
    from grouprl.cmd.serve import process_alive

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        assert process_alive(child.pid)
        child.kill()
        deadline = time.monotonic() + 10
        while process_alive(child.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert child.returncode is None  # not reaped: a zombie
        os.kill(child.pid, 0)  # which kill(pid, 0) takes for a live process
        assert not process_alive(child.pid)
    finally:
        child.kill()
        child.wait(timeout=10)
    assert not process_alive(child.pid)


def test_replies_are_cached_per_served_weights(tiny_model_dir, tiny_llama_dir, tmp_path):
    """Two models served under the same name ("judge") never share cached replies: the cache file is named
    after the weights the server reports (GET /health)."""
    import httpx2

    for model_dir in (tiny_model_dir, tiny_model_dir, tiny_llama_dir):
        out = judge_reward(["q"], ["a"], serve={"model": str(model_dir), "max_new_tokens": 16},
                           cache_dir=str(tmp_path), timeout_s=60)
        assert out[0] is not None
    files = sorted(p.name for p in tmp_path.glob("judge-*.sqlite"))
    assert len(files) == 2, files
    (url, _), = [(s.url, s) for s in _judge_serve._SERVERS.values() if s.model == str(tiny_llama_dir)]
    assert str(tiny_llama_dir.resolve()) in httpx2.get(url.removesuffix("/v1") + "/health", timeout=10).json()[
        "fingerprint"]
