"""grouprl vs Hugging Face TRL ``GRPOTrainer``: same model, data, reward, settings and machine; JSON out.

    python benchmarks/vs_trl.py                      # both configurations, 3 repeats each
    python benchmarks/vs_trl.py --repeats 5 --configs grpo --out benchmarks/results/vs_trl.json

What is compared (see ``_common.py`` for the shared workload):

- ``grpo``: token-level ratio, KL to a reference model (beta = 0.04), on-policy (one generation round per
  optimizer step, so neither library needs an old-log-prob forward);
- ``gspo``: sequence-level ratio (GSPO), beta = 0, one generation round feeds two optimizer steps
  (``steps_per_generation`` = 2 x ``grad_accum`` micro-batches), so the second step is off-policy and
  needs old log-probs.

Each (library, repeat) runs in a fresh child process, A and B interleaved and the order alternated every
repeat (ABBA...), so drift in machine load hits both. Figures are steady-state (the first generation round
is left out as warm-up) medians over repeats; peak RSS is the child's ``ru_maxrss``. Every completion is
exactly ``max_new_tokens`` long on both sides (EOS masked until then), and completion tokens are counted
from what each library generated, so the two do the same work. TRL is configured without gradient
checkpointing and in fp32, as grouprl is.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    GRPO,
    GSPO,
    Workload,
    emit_json,
    make_checkpoint,
    markdown_vs_trl,
    median_result,
    run_child,
)

SCRIPT = Path(__file__).resolve()
CONFIGS = {"grpo": GRPO, "gspo": GSPO}
LIBS = ("grouprl", "trl")


def worker(lib: str, spec: dict[str, Any]) -> None:
    """Child-process entry: run one library on one workload and write the result JSON."""
    w = Workload(**spec["workload"])
    if lib == "trl":
        from _trl_side import run_trl

        out = run_trl(w, spec["model_dir"], spec["work_dir"])
    else:
        from _grouprl_side import run_grouprl

        out = run_grouprl(w, spec["model_dir"], spec["work_dir"])
    Path(spec["result_path"]).write_text(json.dumps(out))


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version(), "machine": platform.machine(), "platform": platform.platform()}
    for pkg in ("torch", "transformers", "trl", "accelerate", "grouprl"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "missing"
    import os

    out["cpus"] = str(os.cpu_count())
    return out


def ratios(a: dict[str, Any], b: dict[str, Any]) -> dict[str, float | None]:
    """grouprl / TRL for the headline figures (None when a side failed)."""
    if not (a.get("repeats") and b.get("repeats")):
        return {}
    return {
        k: a[k] / b[k]
        for k in ("steps_per_s", "steps_per_s_mean", "steps_per_cpu_s", "completion_tokens_per_s", "peak_rss_mib")
    }


def compare(w: Workload, model_dir: str, repeats: int, libs: tuple[str, ...], log=print) -> dict[str, Any]:
    """Interleaved repeats of every library on ``w``; medians, ratios and goal checks."""
    runs: dict[str, list[dict[str, Any]]] = {lib: [] for lib in libs}
    spec = {"workload": asdict(w), "model_dir": model_dir}
    for rep in range(repeats):
        order = libs if rep % 2 == 0 else tuple(reversed(libs))
        for lib in order:
            res = run_child(SCRIPT, lib, spec)
            res.pop("steps_rows", None)
            runs[lib].append(res)
            if res["ok"]:
                log(f"[{w.name}] rep {rep} {lib}: {res['steps_per_s']:.3f} steps/s "
                    f"({res['steps_per_cpu_s']:.3f}/cpu-s), "
                    f"{res['completion_tokens_per_s']:.0f} tok/s, {res['peak_rss_mib']:.0f} MiB")
            else:
                log(f"[{w.name}] rep {rep} {lib}: FAILED rc={res['returncode']}\n{res['log_tail'][-2000:]}")
    out: dict[str, Any] = {"workload": asdict(w)}
    for lib in libs:
        out[lib] = median_result(runs[lib])
    if set(libs) == set(LIBS):
        r = ratios(out["grouprl"], out["trl"])
        out["ratio_grouprl_over_trl"] = r
        if r:
            out["goals"] = goals(r, out["grouprl"])
    return out


def goals(ratio: dict[str, float], grouprl: dict[str, Any]) -> dict[str, bool]:
    """The issue's goals: >= 2x TRL's steps/s (wall, and per CPU-second), RSS <= TRL's, overhead <= 10%."""
    return {
        "steps_per_s_ge_2x_trl": ratio["steps_per_s"] >= 2.0,
        "steps_per_cpu_s_ge_2x_trl": ratio["steps_per_cpu_s"] >= 2.0,
        "peak_rss_le_trl": ratio["peak_rss_mib"] <= 1.0,
        "overhead_le_10pct": grouprl["overhead_frac"] <= 0.10,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--worker", choices=LIBS, help=argparse.SUPPRESS)
    p.add_argument("--spec", help=argparse.SUPPRESS)
    p.add_argument("--configs", default="grpo,gspo", help="comma list of: " + ", ".join(CONFIGS))
    p.add_argument("--libs", default="grouprl,trl", help="comma list of: grouprl, trl")
    p.add_argument("--repeats", type=int, default=3, help="interleaved repeats per library (median reported)")
    p.add_argument("--steps", type=int, default=None, help="optimizer steps per run (default per config)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads in every child (same for both; 1 is least sensitive to other load)")
    p.add_argument("--max-new-tokens", type=int, default=None, help="fixed completion length")
    p.add_argument("--num-generations", type=int, default=None, help="G")
    p.add_argument("--hidden-size", type=int, default=64, help="tiny model width")
    p.add_argument("--num-layers", type=int, default=2, help="tiny model depth")
    p.add_argument("--rollout-backend", default=None,
                   help="grouprl rollout_backend (a built-in name or package.module:Class)")
    p.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    p.add_argument("--markdown", type=Path, default=None, help="print tables of a saved JSON result and exit")
    args = p.parse_args(argv)
    if args.worker:
        worker(args.worker, json.loads(args.spec))
        return 0
    if args.markdown:
        print(markdown_vs_trl(json.loads(args.markdown.read_text())))
        return 0

    libs = tuple(x.strip() for x in args.libs.split(",") if x.strip())
    overrides: dict[str, Any] = {"threads": args.threads}
    if args.steps:
        overrides["steps"] = args.steps
    if args.max_new_tokens:
        overrides["max_new_tokens"] = args.max_new_tokens
    if args.rollout_backend:
        overrides["rollout_backend"] = args.rollout_backend
    if args.num_generations:
        overrides["num_generations"] = args.num_generations
    with tempfile.TemporaryDirectory(prefix="grouprl-bench-model-") as tmp:
        model_dir = str(make_checkpoint(Path(tmp) / "tiny", args.hidden_size, args.num_layers))
        result: dict[str, Any] = {
            "benchmark": "vs_trl",
            "versions": versions(),
            "model": {"source": "grouprl.builtin.tiny.make_tiny_checkpoint", "hidden_size": args.hidden_size,
                      "num_layers": args.num_layers},
            "repeats": args.repeats,
            "fixed_length": "every completion is exactly max_new_tokens tokens on both sides (EOS masked "
                            "until then via min_new_tokens)",
            "configs": {},
        }
        for name in args.configs.split(","):
            w = replace(CONFIGS[name.strip()], **overrides)
            result["configs"][w.name] = compare(w, model_dir, args.repeats, libs,
                                                log=lambda m: print(m, file=sys.stderr, flush=True))
    emit_json(result, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
