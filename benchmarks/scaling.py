"""How cost grows: time per optimizer step and peak RSS against G and against completion length; JSON out.

    python benchmarks/scaling.py                         # grouprl and TRL, G = 4, 8, 16 and T = 32, 64, 128
    python benchmarks/scaling.py --libs grouprl --repeats 3 --out benchmarks/results/scaling.json
    python benchmarks/scaling.py --size small --grouprl-opt logits_chunk_size=4096   # T = 64, 128, 256

The workload is ``vs_trl``'s GRPO configuration (token-level ratio, beta = 0.04, 2 prompts per step,
2 micro-batches, on-policy) on one of ``vs_trl``'s model presets (``--size``, ``_common.SIZES``; default
``tiny``) with one knob moved at a time: G in (4, 8, 16) at the preset's T, then T in (T/2, T, 2T) at
G = 8. Completions are forced to exactly T tokens, so work grows as B*G*T. Each point is a fresh child
process per library (interleaved), median over repeats.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import GRPO, SIZES, emit_json, make_model, markdown_scaling, median_result, run_child  # noqa: E402
from _sizes import parse_opts  # noqa: E402
from vs_trl import SCRIPT as WORKER  # noqa: E402
from vs_trl import versions  # noqa: E402


def point(lib: str, w, model_dir: str, repeats: int) -> dict[str, Any]:
    runs = []
    for _ in range(repeats):
        res = run_child(WORKER, lib, {"workload": asdict(w), "model_dir": model_dir})
        res.pop("steps_rows", None)
        runs.append(res)
    med = median_result(runs)
    if not med.get("repeats"):
        return {"ok": False, "errors": med.get("errors")}
    return {
        "time_per_step_s": 1.0 / med["steps_per_s"],
        "cpu_time_per_step_s": 1.0 / med["steps_per_cpu_s"],
        "peak_rss_mib": med["peak_rss_mib"],
        "completion_tokens_per_s": med["completion_tokens_per_s"],
        "breakdown_s_per_step": med["breakdown_s_per_step"],
        "losses_finite": med["losses_finite"],
        "rewards_finite": med["rewards_finite"],
        "repeats": med["repeats"],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="tiny", choices=list(SIZES), help="model preset (as vs_trl.py --size)")
    p.add_argument("--libs", default="grouprl,trl", help="comma list of: grouprl, trl")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--steps", type=int, default=5, help="optimizer steps per run (first is warm-up)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall", help="as vs_trl.py --clock")
    p.add_argument("--groups", default="4,8,16", help="G values (at T = --base-length)")
    p.add_argument("--lengths", default=None, help="completion lengths (at G = --base-group; default T/2, T, 2T "
                                                      "for the preset's T)")
    p.add_argument("--base-group", type=int, default=8)
    p.add_argument("--base-length", type=int, default=None, help="T of the G points (default: the preset's)")
    p.add_argument("--grouprl-opt", action="append", default=[], metavar="KEY=VALUE",
                   help="a grouprl config field (repeatable), as vs_trl.py --grouprl-opt")
    p.add_argument("--trl-opt", action="append", default=[], metavar="KEY=VALUE", help="a trl.GRPOConfig field")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--markdown", type=Path, default=None, help="print the table of a saved JSON result and exit")
    args = p.parse_args(argv)
    if args.markdown:
        print(markdown_scaling(json.loads(args.markdown.read_text())))
        return 0
    libs = [x.strip() for x in args.libs.split(",") if x.strip()]
    size = SIZES[args.size]
    base_length = args.base_length or size.tokens
    lengths = args.lengths or f"{size.tokens // 2},{size.tokens},{2 * size.tokens}"
    base = replace(GRPO, steps=args.steps, threads=args.threads, clock=args.clock,
                   grouprl_opts=parse_opts(args.grouprl_opt, "--grouprl-opt"),
                   trl_opts=parse_opts(args.trl_opt, "--trl-opt"))
    grid = [("G", g, replace(base, num_generations=g, max_new_tokens=base_length))
            for g in map(int, args.groups.split(","))]
    grid += [("T", t, replace(base, num_generations=args.base_group, max_new_tokens=t))
             for t in map(int, lengths.split(","))]
    result: dict[str, Any] = {"benchmark": "scaling", "versions": versions(), "size": args.size,
                              "model": asdict(size), "base_workload": asdict(base),
                              "repeats": args.repeats, "points": []}
    with tempfile.TemporaryDirectory(prefix="grouprl-bench-model-") as tmp:
        model_dir = str(make_model(Path(tmp) / args.size, size.hidden, size.layers, size.vocab))
        for knob, value, w in grid:
            row: dict[str, Any] = {"knob": knob, "value": value, "num_generations": w.num_generations,
                                   "max_new_tokens": w.max_new_tokens}
            for lib in libs:
                row[lib] = point(lib, w, model_dir, args.repeats)
                r = row[lib]
                msg = (f"{lib} {knob}={value}: {r['time_per_step_s'] * 1000:.0f} ms/step, "
                       f"{r['peak_rss_mib']:.0f} MiB") if r.get("repeats") else f"{lib} {knob}={value}: FAILED"
                print(msg, file=sys.stderr, flush=True)
            result["points"].append(row)
    emit_json(result, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
