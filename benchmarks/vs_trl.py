"""grouprl vs Hugging Face TRL ``GRPOTrainer``: same model, data, reward, settings and machine; JSON out.

    python benchmarks/vs_trl.py                      # tiny model, both configurations, 3 repeats each
    python benchmarks/vs_trl.py --size all --out benchmarks/results/vs_trl_sizes.json   # `make bench-all`
    python benchmarks/vs_trl.py --size small --grouprl-opt logits_chunk_size=4096   # a grouprl config switch
    python benchmarks/vs_trl.py --markdown benchmarks/results/vs_trl_sizes.json   # the tables again

Sizes (``_common.SIZES``, shared with ``scaling.py`` and ``floor.py``): ``tiny`` (hidden 64, 2 layers, 64
completion tokens), ``small`` (hidden 256, 4 layers, 128 tokens) and ``medium`` (hidden 512, 2 layers,
vocabulary 32768, 256 tokens: about 25M parameters, most of them in the tied embedding / LM head).

What is compared (see ``_common.py`` for the shared workload):

- ``grpo``: token-level ratio, KL to a reference model (beta = 0.04), on-policy (one generation round per
  optimizer step, so neither library needs an old-log-prob forward);
- ``gspo``: sequence-level ratio (GSPO, TRL ``importance_sampling_level="sequence"``), beta = 0, one
  generation round feeds two optimizer steps (``steps_per_generation`` = 2 x ``grad_accum`` micro-batches),
  so the second step is off-policy and needs old log-probs.

Each (library, repeat) runs in a fresh child process, A and B interleaved and the order alternated every
repeat (ABBA...), so drift in machine load hits both. Figures are steady-state (the first generation round
is left out as warm-up) medians over repeats; peak RSS is the child's ``ru_maxrss``, so one side's memory
never counts for the other. Every completion is exactly ``max_new_tokens`` long on both sides (EOS masked
until then), and completion tokens are counted from what each library generated, so the two do the same
work. TRL is configured without gradient checkpointing and in fp32, as grouprl is; ``--precision bf16``
sets ``bf16`` on both sides instead (grouprl ``bf16: true``; TRL ``bf16=True`` with ``use_cpu=True``, which
accelerate runs as ``torch.autocast("cpu", bfloat16)`` around the model's forward). Each side's JSON then
has ``dtypes_all``: the output dtypes of its first ``q_proj`` per pass (grad / no grad), and grouprl's
``mismatch_all``: its ``mismatch/*`` metrics (sampler vs trainer log-probs).

    OMP_NUM_THREADS=1 python benchmarks/vs_trl.py --size small --clock cpu --precision bf16 --repeats 2

With ``--floor`` (on by default with ``--size``) a third child per size measures the plain-PyTorch floor of
each phase (``floor.measure_floor``: the GRPO step's decode, forward+backward and reference forward), and
the table gives grouprl's phases as multiples of it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
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
    SIZES,
    Size,
    Workload,
    emit_json,
    make_model,
    markdown_vs_trl,
    median_result,
    run_child,
    size_workload,
    use_clock,
)
from _sizes import floor_multiples, markdown_sizes, parse_opts, size_targets  # noqa: E402

SCRIPT = Path(__file__).resolve()
CONFIGS = {"grpo": GRPO, "gspo": GSPO}
LIBS = ("grouprl", "trl")


def worker(lib: str, spec: dict[str, Any]) -> None:
    """Child-process entry: run one library on one workload and write the result JSON."""
    w = Workload(**spec["workload"])
    use_clock(w.clock)
    if lib == "floor":
        from floor import measure_floor

        out = measure_floor(spec["model_dir"], w, spec["repeats"], w.threads)
    elif lib == "trl":
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


def count_parameters(model_dir: str) -> int:
    """Parameters of the saved checkpoint (the tied LM head is saved, and counted, once)."""
    from safetensors import safe_open

    total = 0
    for f in Path(model_dir).glob("*.safetensors"):
        with safe_open(str(f), "pt") as fh:
            total += sum(math.prod(fh.get_slice(k).get_shape()) for k in fh.keys())
    return total


def floor_child(w: Workload, model_dir: str, repeats: int, log=print) -> dict[str, Any]:
    """The plain-PyTorch floor of ``w``'s GRPO step on this model, in its own child process."""
    spec = {"workload": asdict(replace(w, grouprl_opts={}, trl_opts={}, precision="fp32")), "model_dir": model_dir,
            "repeats": repeats}
    res = run_child(SCRIPT, "floor", spec)
    if res["ok"]:
        log("[floor] " + ", ".join(f"{k} {1000 * v:.1f} ms" for k, v in res["floor_s"].items()))
    else:
        log(f"[floor] FAILED rc={res['returncode']}\n{res['log_tail'][-2000:]}")
    return res


def run_size(name: str, size: Size, args: argparse.Namespace, overrides: dict[str, Any], tmp: Path,
             log=print) -> dict[str, Any]:
    """Floor (optional), then every configuration on one model size, each library interleaved."""
    model_dir = str(make_model(tmp / name, size.hidden, size.layers, size.vocab))
    out: dict[str, Any] = {"model": {"hidden_size": size.hidden, "num_layers": size.layers,
                                     "vocab": size.vocab or "tokenizer's (373)", "max_new_tokens": size.tokens,
                                     "parameters": count_parameters(model_dir)}, "configs": {}}
    libs = tuple(x.strip() for x in args.libs.split(",") if x.strip())
    if args.floor and "grouprl" in libs:
        w = replace(size_workload(GRPO, size), **overrides)
        out["floor"] = floor_child(w, model_dir, args.floor_repeats, log=log)
    for cfg in args.configs.split(","):
        w = replace(size_workload(CONFIGS[cfg.strip()], size), **overrides)
        out["configs"][w.name] = compare(w, model_dir, args.repeats, libs,
                                         log=lambda m, n=name: log(f"[{n}] {m}"))
    for cfg, res in out["configs"].items():
        res["floor_multiple"] = floor_multiples(cfg, res.get("grouprl") or {}, out.get("floor") or {})
    out["targets"] = size_targets(name, out)
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--worker", choices=(*LIBS, "floor"), help=argparse.SUPPRESS)
    p.add_argument("--spec", help=argparse.SUPPRESS)
    p.add_argument("--size", default="tiny",
                   help="comma list of model presets (" + ", ".join(SIZES) + ") or 'all'")
    p.add_argument("--configs", default="grpo,gspo", help="comma list of: " + ", ".join(CONFIGS))
    p.add_argument("--libs", default="grouprl,trl", help="comma list of: grouprl, trl")
    p.add_argument("--repeats", type=int, default=3, help="interleaved repeats per library (median reported)")
    p.add_argument("--steps", type=int, default=None, help="optimizer steps per run (default per size and config)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads in every child (same for both; 1 is least sensitive to other load)")
    p.add_argument("--max-new-tokens", type=int, default=None, help="fixed completion length (default: the size's)")
    p.add_argument("--num-generations", type=int, default=None, help="G")
    p.add_argument("--hidden-size", type=int, default=None, help="override the preset's model width")
    p.add_argument("--num-layers", type=int, default=None, help="override the preset's model depth")
    p.add_argument("--vocab", type=int, default=None, help="override the preset's vocabulary (embedding rows)")
    p.add_argument("--rollout-backend", default=None,
                   help="grouprl rollout_backend (a built-in name or package.module:Class)")
    p.add_argument("--grouprl-opt", action="append", default=[], metavar="KEY=VALUE",
                   help="a grouprl config field for the grouprl side (repeatable; VALUE is JSON or a string), "
                        "e.g. logits_chunk_size=4096")
    p.add_argument("--trl-opt", action="append", default=[], metavar="KEY=VALUE",
                   help="a trl.GRPOConfig field for the TRL side (repeatable)")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="time phases and steps by wall clock, or by each child's CPU time (steadier on a "
                        "shared machine; steps/s then means steps per CPU-second)")
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                   help="fp32 on both sides, or bf16 on both: grouprl bf16=true, TRL bf16=True (CPU autocast); "
                        "the floor stays fp32")
    p.add_argument("--floor", action=argparse.BooleanOptionalAction, default=True,
                   help="also measure the plain-PyTorch floor per size (a third child process)")
    p.add_argument("--floor-repeats", type=int, default=2, help="timed repeats of each floor phase")
    p.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    p.add_argument("--markdown", type=Path, nargs="+", default=None,
                   help="print tables of saved JSON results and exit (several --size runs are shown as one table)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        worker(args.worker, json.loads(args.spec))
        return 0
    if args.markdown:
        saved = [json.loads(f.read_text()) for f in args.markdown]
        if all("sizes" in r for r in saved):
            print(markdown_sizes({"sizes": {k: v for r in saved for k, v in r["sizes"].items()}, "runs": saved}))
        else:
            print("\n\n".join(markdown_sizes(r) if "sizes" in r else markdown_vs_trl(r) for r in saved))
        return 0
    names = list(SIZES) if args.size.strip() == "all" else [x.strip() for x in args.size.split(",") if x.strip()]
    unknown = [n for n in names if n not in SIZES]
    if unknown:
        raise SystemExit(f"--size: unknown {unknown}; choose from {list(SIZES)} or 'all'")
    overrides: dict[str, Any] = {"threads": args.threads, "clock": args.clock, "precision": args.precision,
                                 "grouprl_opts": parse_opts(args.grouprl_opt, "--grouprl-opt"),
                                 "trl_opts": parse_opts(args.trl_opt, "--trl-opt")}
    for key, value in (("steps", args.steps), ("rollout_backend", args.rollout_backend),
                       ("num_generations", args.num_generations)):
        if value:
            overrides[key] = value
    result: dict[str, Any] = {"benchmark": "vs_trl", "versions": versions(), "repeats": args.repeats,
                              "threads": args.threads, "clock": args.clock, "load_average_before": os.getloadavg(),
                              "fixed_length": "every completion is exactly max_new_tokens tokens on both sides "
                                              "(EOS masked until then via min_new_tokens)",
                              "overrides": {k: v for k, v in overrides.items() if k != "threads"}, "sizes": {}}
    with tempfile.TemporaryDirectory(prefix="grouprl-bench-model-") as tmp:
        for name in names:
            size = replace(SIZES[name], **{k: v for k, v in (("hidden", args.hidden_size), ("layers", args.num_layers),
                                                            ("vocab", args.vocab), ("tokens", args.max_new_tokens))
                                           if v})
            result["sizes"][name] = run_size(name, size, args, overrides, Path(tmp),
                                             log=lambda m: print(m, file=sys.stderr, flush=True))
    result["load_average_after"] = os.getloadavg()
    emit_json(result, args.out)
    print(markdown_sizes(result), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
