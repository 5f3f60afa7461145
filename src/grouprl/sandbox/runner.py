"""Run a (code, tests) job. Minimal first version: a fresh interpreter per job, no isolation yet."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

from grouprl.sandbox.result import SandboxResult, TestResult
from grouprl.sandbox.suite import normalize_tests, suite_size

_PROGRAM = r"""
import json, sys
spec = json.loads(sys.stdin.read())
ns = {}
exec(spec["code"], ns)
s = spec["suite"]
tests = []
if s["kind"] == "assert":
    exec(s["setup"], ns); tests = s["tests"]
elif s["kind"] == "check":
    exec(s["check"], ns); tests = ["check(%s)" % s["entry_point"]]
for i, t in enumerate(tests):
    try:
        exec(t, ns); print(json.dumps({"i": i, "status": "passed"}))
    except Exception as e:
        print(json.dumps({"i": i, "status": "failed", "reason": type(e).__name__}))
"""


def run_tests(code: str, tests: Any, *, timeout: float = 10.0, isolation: str = "auto",
              entry_point: str | None = None) -> SandboxResult:
    suite = normalize_tests(tests, entry_point=entry_point)
    n = suite_size(suite)
    t0 = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, "-I", "-c", _PROGRAM], input=json.dumps({"code": code, "suite": suite}),
                              capture_output=True, text=True, timeout=timeout, env={})
    except subprocess.TimeoutExpired:
        return SandboxResult.not_run("timeout", "job deadline", n)
    results = [TestResult(i, "failed", "no record") for i in range(n)]
    for line in proc.stdout.splitlines():
        rec = json.loads(line)
        results[rec["i"]] = TestResult(rec["i"], rec["status"], rec.get("reason", ""))
    k = sum(r.passed for r in results)
    return SandboxResult(k, n, "ok", "", results, time.monotonic() - t0, "none")
