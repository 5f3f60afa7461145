"""Every recipe's learning curve, JSON + PNG in benchmarks/results/, from one command::

    python benchmarks/curves.py                          # all of them, one after another (hours on 2 cores)
    python benchmarks/curves.py --only retrieval         # one curve (--only a b: several)
    python benchmarks/curves.py --reuse                  # keep finished cells / seeds where the script can
    python benchmarks/curves.py --dry-run                # print the commands, run nothing
    make curves CURVES_ARGS="--only retrieval --reuse"

Each curve is the documented command of its own benchmark script (the one its recipe header quotes), run as
a subprocess with that script's CLI, one at a time, ``OMP_NUM_THREADS=1`` unless set:

- ``agent_calculator``: ``agent_curve.py --grid`` over warm-start seeds 0-2 x RL seeds 0-2, ``--jobs 1``,
  held-out evaluation every 25 steps -> ``results/agent_calculator_grid.{json,png}``
- ``code_repair``: ``code_repair_curve.py`` on cells 0:0 0:1 0:2 1:0 1:1 1:2 -> ``results/code_repair.{json,png}``
- ``retrieval``: ``retrieval_curve.py --judge-only`` (the built-in judge against the answer-present rule,
  ``results/retrieval_judge.json``), then ``retrieval_curve.py --judge-from`` that JSON over RL seeds 0-2
  -> ``results/retrieval.{json,png}``
- ``guess_number``, ``reasoning_gym``: ``env_recipes.py <recipe> --seeds 0 1 2`` -> ``results/<recipe>.{json,png}``

``--reuse`` passes ``--reuse`` to the scripts that keep finished work (agent_curve.py's and code_repair_curve.py's
cells, retrieval_curve.py's seeds) and skips a step without cells whose outputs exist (the judge part);
env_recipes.py has no such option and runs in full. A step that fails, times out (``--step-timeout-s``) or
does not write its outputs ends its curve (the others still run) and makes the exit status 1. The scripts'
own output goes to stderr; stdout carries one JSON summary: per curve, each command, its exit status, wall
seconds and the outputs it wrote, with the machine's load average before and after (figures from a busy
machine are slower, and every learning figure varies with the CPU).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = "benchmarks/results"


@dataclass(frozen=True)
class Step:
    """One subprocess: ``python <args>`` from the repository root, writing ``outputs`` (paths from the root)."""

    args: tuple[str, ...]
    outputs: tuple[str, ...]
    reuse_flag: bool = False      # the script takes --reuse (keeps its finished cells or seeds)
    skip_when_done: bool = False  # with --reuse, skip the step when every output exists (a step without cells)

    def command(self, reuse: bool) -> list[str]:
        return [sys.executable, *self.args, *(["--reuse"] if reuse and self.reuse_flag else [])]


def _pair(stem: str) -> tuple[str, str]:
    return f"{RESULTS}/{stem}.json", f"{RESULTS}/{stem}.png"


CURVES: dict[str, tuple[Step, ...]] = {
    "agent_calculator": (Step(("benchmarks/agent_curve.py", "--grid", "--ws-seeds", "0", "1", "2", "--rl-seeds",
                               "0", "1", "2", "--jobs", "1", "--eval-steps", "25", "--out",
                               f"{RESULTS}/agent_calculator_grid.json"), _pair("agent_calculator_grid"),
                              reuse_flag=True),),
    "code_repair": (Step(("benchmarks/code_repair_curve.py", "--cells", "0:0", "0:1", "0:2", "1:0", "1:1", "1:2",
                          "--out", f"{RESULTS}/code_repair.json"), _pair("code_repair"), reuse_flag=True),),
    "retrieval": (Step(("benchmarks/retrieval_curve.py", "--judge-only", "--out", f"{RESULTS}/retrieval.json"),
                       (f"{RESULTS}/retrieval_judge.json",), skip_when_done=True),
                  Step(("benchmarks/retrieval_curve.py", "--judge-from", f"{RESULTS}/retrieval_judge.json",
                        "--seeds", "0", "1", "2", "--out", f"{RESULTS}/retrieval.json"), _pair("retrieval"),
                       reuse_flag=True)),
    "guess_number": (Step(("benchmarks/env_recipes.py", "guess_number", "--seeds", "0", "1", "2", "--out",
                           f"{RESULTS}/guess_number.json"), _pair("guess_number")),),
    "reasoning_gym": (Step(("benchmarks/env_recipes.py", "reasoning_gym", "--seeds", "0", "1", "2", "--out",
                            f"{RESULTS}/reasoning_gym.json"), _pair("reasoning_gym")),),
}


def plan(only: list[str] | None, reuse: bool, root: Path = ROOT) -> list[dict]:
    """What would run, in order: per curve, each step's command line and whether --reuse skips it."""
    names = only or list(CURVES)
    unknown = [n for n in names if n not in CURVES]
    if unknown:
        raise SystemExit(f"curves.py: unknown curve {', '.join(map(repr, unknown))}; known: {', '.join(CURVES)}")
    out = []
    for name in names:
        steps = []
        for step in CURVES[name]:
            done = reuse and step.skip_when_done and all((root / p).exists() for p in step.outputs)
            steps.append({"command": step.command(reuse), "outputs": list(step.outputs),
                          "skip": "--reuse: its outputs exist" if done else None})
        out.append({"name": name, "steps": steps})
    return out


def _run_step(command: list[str], timeout_s: float, root: Path) -> tuple[int | str, float]:
    """Run one command in its own process group (a grid's cell processes die with it on a timeout)."""
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    t0 = time.perf_counter()
    proc = subprocess.Popen(command, cwd=root, env=env, stdout=sys.stderr, start_new_session=True)
    try:
        rc: int | str = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        rc = f"timeout after {timeout_s:g} s"
    except BaseException:
        os.killpg(proc.pid, signal.SIGTERM)
        raise
    return rc, round(time.perf_counter() - t0, 1)


def run_curve(curve: dict, timeout_s: float, root: Path = ROOT, runner=_run_step) -> dict:
    """Run a planned curve's steps in order; stop at the first that fails or leaves an output unwritten."""
    curve = {**curve, "ok": True}
    for step in curve["steps"]:
        if step["skip"]:
            continue
        started = time.time()
        step["rc"], step["wall_seconds"] = runner(step["command"], timeout_s, root)
        stale = [p for p in step["outputs"] if not (root / p).exists() or (root / p).stat().st_mtime < started - 1]
        step["not_written"] = stale
        if step["rc"] != 0 or stale:
            curve["ok"] = False
            break
    return curve


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="+", metavar="NAME", help=f"run only these curves ({', '.join(CURVES)})")
    ap.add_argument("--reuse", action="store_true", help="keep finished cells/seeds where the script supports it")
    ap.add_argument("--dry-run", action="store_true", help="print the plan (commands) as JSON, run nothing")
    ap.add_argument("--step-timeout-s", type=float, default=6 * 3600, help="deadline of each command (default 6 h)")
    args = ap.parse_args(argv)
    curves = plan(args.only, args.reuse)
    if args.dry_run:
        print(json.dumps({"dry_run": True, "curves": curves}, indent=1))
        return 0
    load_start = [round(x, 2) for x in os.getloadavg()]
    done = []
    for curve in curves:
        print(f"[curves] {curve['name']}", file=sys.stderr, flush=True)
        done.append(run_curve(curve, args.step_timeout_s))
    ok = all(c["ok"] for c in done)
    print(json.dumps({"ok": ok, "cpu_count": os.cpu_count(), "load_average_start": load_start,
                      "load_average_end": [round(x, 2) for x in os.getloadavg()], "curves": done}, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
