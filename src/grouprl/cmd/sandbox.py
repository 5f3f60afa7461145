"""``grouprl sandbox check``: what isolation this machine gives the code sandbox, proven by a trial run.

Prints each building block (bubblewrap, network / PID namespaces, dedicated uid, rlimits), which
isolation levels are available, and, unless ``--no-run``, runs a two-test job under each available
level to show that it works end to end. Exit status 0 when the level asked with ``--isolation``
(default ``auto``, i.e. strict) is available, 1 otherwise with the message saying what to install.
"""

from __future__ import annotations

import argparse
import json


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sandbox", help="inspect the code sandbox (`grouprl sandbox check`)")
    ssub = p.add_subparsers(dest="sandbox_command", metavar="ACTION")
    c = ssub.add_parser("check", help="print what isolation is available here")
    c.add_argument("--isolation", default="auto", help="level to require: auto | strict | basic (default auto)")
    c.add_argument("--json", action="store_true", help="print the report as JSON")
    c.add_argument("--no-run", action="store_true", help="skip the trial job")
    c.set_defaults(func=check)
    p.set_defaults(func=lambda args: p.print_help() or 1)


def _trial(level: str) -> str:
    """Run f(x) = 2x against one right and one deliberately wrong test: expect exactly 1 of 2 to pass."""
    from grouprl.sandbox import run_tests

    res = run_tests("def f(x):\n    return 2 * x\n", ["assert f(2) == 4", "assert f(3) == 7"],
                    timeout=10, isolation=level)
    if res.status == "ok" and [t.status for t in res.tests] == ["passed", "failed"]:
        return f"ok ({res.seconds * 1000:.0f} ms; the right test passed, the deliberately wrong one failed)"
    return f"FAILED ({res.seconds * 1000:.0f} ms; {res.status}: {res.reason})"


def check(args: argparse.Namespace) -> int:
    from grouprl.sandbox import capabilities
    from grouprl.sandbox.capabilities import LEVELS, SandboxUnavailable, resolve_isolation
    from grouprl.sandbox.runner import Limits

    if args.isolation not in LEVELS:
        resolve_isolation(args.isolation)  # raises ConfigError naming the levels
    caps = capabilities.detect()
    report = caps.to_dict() | {"limits": Limits().__dict__, "levels": {}}
    report["levels"]["strict"] = "available" if caps.strict else "unavailable: " + "; ".join(caps.strict_missing)
    report["levels"]["basic"] = "available (must be chosen explicitly)"
    if not args.no_run:
        for level in ("strict", "basic"):
            if level == "basic" or caps.strict:
                report["levels"][level] += f"; trial job {_trial(level)}"
    wanted_ok, message = True, ""
    try:
        resolve_isolation(args.isolation)
    except SandboxUnavailable as e:
        wanted_ok, message = False, str(e)
    if args.json:
        print(json.dumps(report | {"requested": args.isolation, "requested_ok": wanted_ok}, indent=2))
    else:
        yes = {True: "yes", False: "NO"}
        rows = [
            ("running as root", yes[caps.root]),
            ("bubblewrap", caps.bwrap or "NOT INSTALLED"),
            ("  works here", yes[bool(caps.bwrap) and not caps.bwrap_error] + (f" ({caps.bwrap_error})" if caps.bwrap_error else "")),
            ("network namespace (strict)", yes[caps.strict]),
            ("read-only filesystem, PID namespace (strict)", yes[caps.strict]),
            ("network namespace via unshare (basic)", yes[caps.unshare_net]),
            ("PID namespace via unshare (basic)", yes[caps.unshare_pid]),
            ("dedicated unprivileged uid per job", yes[caps.root]),
            ("rlimits, scrubbed env, private workdir", "yes"),
            ("hidden directories (re-exposing Python)", ", ".join(caps.masked_dirs) or "none"),
        ]
        width = max(len(k) for k, _ in rows)
        for k, v in rows:
            print(f"{k:<{width}}  {v}")
        lim = Limits()
        print(f"{'limits':<{width}}  memory {lim.memory_mb} MiB, {lim.nproc} processes, files {lim.fsize_mb} MiB, "
              f"{lim.nofile} fds, workdir {lim.tmpfs_mb} MiB, no core dumps")
        for level, text in report["levels"].items():
            print(f"{'isolation ' + level:<{width}}  {text}")
        if not wanted_ok:
            print(f"\nerror: {message}")
    return 0 if wanted_ok else 1
