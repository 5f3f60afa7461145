"""Capability detection, the isolation levels, and `grouprl sandbox check`."""

from __future__ import annotations

import dataclasses

import pytest

from grouprl.cli import main
from grouprl.errors import ConfigError
from grouprl.sandbox import capabilities
from grouprl.sandbox.capabilities import SandboxUnavailable, detect, resolve_isolation


@pytest.fixture
def no_bwrap(monkeypatch):
    """Pretend bubblewrap is missing (as on a machine without it)."""
    caps = dataclasses.replace(detect(), bwrap=None, strict_missing=(
        f"bubblewrap (bwrap) is not installed; {capabilities.INSTALL_HINT}",))
    monkeypatch.setattr(capabilities, "detect", lambda: caps)
    return caps


def test_strict_and_auto_refuse_without_bwrap_and_say_how_to_install(no_bwrap):
    for level in ("strict", "auto"):  # auto never falls back to basic by itself
        with pytest.raises(SandboxUnavailable, match="apt-get install bubblewrap") as e:
            resolve_isolation(level)
        assert "sandbox.isolation: basic" in str(e.value)


def test_basic_must_be_named_and_is_then_granted(no_bwrap):
    assert resolve_isolation("basic") == "basic"


def test_unknown_level_is_a_config_error():
    with pytest.raises(ConfigError, match="Did you mean 'strict'"):
        resolve_isolation("strcit")


@pytest.mark.skipif(not detect().strict, reason="bubblewrap not available")
def test_detect_here_finds_strict():
    caps = detect()
    assert caps.strict and caps.bwrap and caps.bwrap_error == ""
    assert resolve_isolation("auto") == "strict"


def test_cli_check_reports_and_exits_nonzero_when_strict_is_missing(no_bwrap, capsys):
    assert main(["sandbox", "check", "--no-run"]) == 1
    out = capsys.readouterr().out
    assert "bubblewrap" in out and "NOT INSTALLED" in out and "install bubblewrap" in out
    assert main(["sandbox", "check", "--no-run", "--isolation", "basic"]) == 0


@pytest.mark.skipif(not detect().strict, reason="bubblewrap not available")
def test_cli_check_runs_a_trial_job(capsys):
    assert main(["sandbox", "check"]) == 0
    out = capsys.readouterr().out
    assert "isolation strict" in out and "trial job ok" in out


@pytest.mark.skipif(detect().bwrap is None, reason="bubblewrap not installed")
def test_strict_works_when_the_checkout_and_its_venv_live_under_tmp(tmp_path):
    # CI may clone the project under /tmp; the sandbox mounts a private tmpfs at /tmp, which used to hide
    # the venv's interpreter ("bwrap: execvp /tmp/.../.venv/bin/python: No such file or directory").
    import os
    import site
    import subprocess
    import sys
    from pathlib import Path

    import grouprl

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    src = str(Path(grouprl.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, *site.getsitepackages()])}
    code = (
        "from grouprl.sandbox.capabilities import detect; from grouprl.sandbox import run_tests\n"
        "assert detect().strict, detect().strict_missing\n"
        "r = run_tests('def f():\\n    return 1\\n', ['assert f() == 1', 'assert f() == 2'], timeout=20,"
        " isolation='strict')\n"
        "print(r.passed, r.total)"
    )
    out = subprocess.run([str(venv / "bin" / "python"), "-c", code], env=env, capture_output=True, text=True,
                         timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["1", "2"]
