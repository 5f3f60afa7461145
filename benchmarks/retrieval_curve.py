"""What ``recipes/retrieval.yaml`` learns: citation-checked accuracy and searches per trajectory, over seeds,
and the built-in judge's agreement with the answer-present rule.

    python benchmarks/retrieval_curve.py --seeds 0 1 2     # benchmarks/results/retrieval.{json,png}
    python benchmarks/retrieval_curve.py --judge-only       # only the judge: benchmarks/results/retrieval_judge.json
    python benchmarks/retrieval_curve.py --judge-from benchmarks/results/retrieval_judge.json --seeds 0 1 2
    python benchmarks/retrieval_curve.py ... --reuse       # keep the seeds already in --out (same overrides)
    python benchmarks/retrieval_curve.py --replot          # only redraw the PNG from the JSON at --out

For each RL seed it trains the recipe (``seed=S``, a checkpoint every ``--every`` steps, outputs in
``runs/retrieval-curve/``) and then evaluates the warm start, every checkpoint and the final model on every
distinct question of the built-in task: the 20 training questions and the 2 held-out ones
(:func:`grouprl.data.tasks._bucket_is_test`), greedy and sampled (T=1, ``--samples`` per question), with
the recipe's multi-turn ``search`` rollouts. A trajectory is **correct** when its final answer contains the
gold answer *and* its citations pass the retrieval reward's support gate (2-4 distinct ``[pN]``, every one
returned by a search of that trajectory: :func:`grouprl.rewards.retrieval.rule_scores`); no judge takes
part in this number. ``searches`` is the mean number of ``search`` calls per trajectory.

The judge part serves ``builtin:judge`` in process (:class:`grouprl.serve.server.ChatServer`, the schema the
judge reward asks for) on the 88 held-out items of :func:`grouprl.builtin.judge_demo.heldout_items` (the
22 built-in questions, 4 answers each; never a training reference) and on 200 items of its own training
distribution (another seed), and reports agreement with the rule. The training runs add the run-wide
judge/rule agreement on the policy's own answers (the line the recipe prints at the end).

One thread (OMP_NUM_THREADS=1); both built-in models are built on first use and cached. Results vary with
the CPU (the warm starts' builds and every sampled rollout depend on its floating-point details).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
RECIPE = ROOT / "recipes" / "retrieval.yaml"


def question_rows() -> dict[str, list[dict]]:
    """One row per distinct built-in question, split as the dataset splits them."""
    from grouprl.data.retrieval import INSTRUCTIONS, QUESTIONS
    from grouprl.data.tasks import _bucket_is_test

    split: dict[str, list[dict]] = {"train": [], "heldout": []}
    for question, answer, gold in QUESTIONS:
        row = {"prompt": f"{INSTRUCTIONS}\n\nQuestion: {question}", "answer": answer, "gold_ids": list(gold)}
        split["heldout" if _bucket_is_test(f"retrieval|{question}") else "train"].append(row)
    return split


def _correct(prompts, completions, *, answer=None, gold_ids=None, tool_calls=None, env_state=None, **_):
    """1 when the answer is present and supported by the trajectory's own searches (no judge)."""
    from grouprl.rewards.adapters import completion_text
    from grouprl.rewards.retrieval import _column, rule_scores

    n = len(completions)
    answers, golds = _column(answer, n), _column(gold_ids, n)
    calls, states = _column(tool_calls, n), _column(env_state, n)
    out = []
    for i, c in enumerate(completions):
        r = rule_scores(completion_text(c), answer=answers[i], gold_ids=golds[i], tool_calls=calls[i],
                        env_state=states[i])
        out.append(r["answer"] * r["support"])
    return out


_correct.reward_form = "batch"


def evaluate_dir(cfg, path: str, rows: dict[str, list[dict]], samples: int) -> dict:
    """Greedy and sampled citation-checked accuracy and searches of the model in ``path``, per split."""
    import torch

    from grouprl.models import load_model, load_tokenizer
    from grouprl.train.evaluate import evaluate_model

    model, tok = load_model(path, torch.device("cpu")), load_tokenizer(path)
    out = {}
    for split, split_rows in rows.items():
        for name, temperature, n in (("greedy", 0.0, 1), ("sampled", 1.0, samples)):
            r = evaluate_model(cfg, model, tok, split_rows, _correct, temperature=temperature, num_samples=n, ks=())
            out[f"{split}_{name}"] = {"accuracy": round(r["accuracy"], 4),
                                      "searches": round(r.get("tools/calls_per_traj", 0.0), 3),
                                      "n": r["num_scored"]}
    return out


def _per_step(metrics: Path) -> list[dict]:
    keep = ("reward", "tools/calls_per_traj", "judge/agreement", "time/step")
    rows = []
    for line in metrics.read_text().splitlines():
        rec = json.loads(line)
        if "time/step" in rec:
            rows.append({"step": rec["step"], **{k: rec.get(k) for k in keep}})
    return rows


def run_seed(seed: int, args) -> dict:
    """Train one RL seed, then evaluate the warm start, each checkpoint and the final model."""
    from grouprl.config import GRPOConfig
    from grouprl.rewards import retrieval as retrieval_reward
    from grouprl.train import GRPOTrainer
    from grouprl.train.checkpoint.store import list_checkpoints

    run_dir = Path(args.runs_dir) / f"seed{seed}"
    overrides = [f"seed={seed}", f"output_dir={run_dir}", f"save_steps={args.every}", "overwrite_output_dir=true",
                 "resume_from_checkpoint=null", "progress_bar=false", "report_to=none",
                 f"reward_kwargs.retrieval.judge.cache_dir={run_dir}/judge-cache", *args.overrides]
    cfg = GRPOConfig.from_yaml(str(RECIPE), overrides)
    for key in retrieval_reward.RUN_TOTALS:
        retrieval_reward.RUN_TOTALS[key] = 0
    t0 = time.perf_counter()
    result = GRPOTrainer(config=cfg).train()
    wall = round(time.perf_counter() - t0, 1)
    totals = dict(retrieval_reward.RUN_TOTALS)
    rows = question_rows()
    points = [(0, None)] + [(int(p.name.split("-")[1]), str(p)) for p in list_checkpoints(run_dir)]
    final = str(result.get("final_model") or run_dir / "final")
    if points[-1][0] != result["global_step"]:
        points.append((result["global_step"], final))
    curve = []
    for step, path in points:
        from grouprl.models import resolve_model_path

        print(f"[retrieval_curve] seed {seed}: evaluating step {step}", file=sys.stderr, flush=True)
        curve.append({"step": step, **evaluate_dir(cfg, path or resolve_model_path(cfg.model), rows, args.samples)})
    return {"seed": seed, "wall_seconds": wall, "steps": result["global_step"], "curve": curve,
            "per_step": _per_step(Path(result["metrics_path"])), "judge_totals": totals,
            "judge_agreement": round(totals["agree"] / totals["judged"], 4) if totals["judged"] else None}


def judge_agreement(n_train: int = 200) -> dict:
    """The built-in judge served in process, greedy with the score schema, against the answer-present rule."""
    import torch

    from grouprl.builtin import judge_demo
    from grouprl.builtin.warmstart import builtin_model_path
    from grouprl.models import load_model, load_tokenizer
    from grouprl.rewards.judge import parse_pointwise, score_schema
    from grouprl.rewards.retrieval import answer_present
    from grouprl.serve.server import ChatServer

    t0 = time.perf_counter()
    path = builtin_model_path("judge")
    build_s = round(time.perf_counter() - t0, 1)
    chat = ChatServer(load_model(path, torch.device("cpu")), load_tokenizer(path), max_new_tokens=16)
    fmt = {"type": "json_schema", "json_schema": {"name": "s", "schema": score_schema(judge_demo.SCALE)}}
    out: dict = {"model": path, "build_or_load_seconds": build_s,
                 "max_positions": chat.context}
    for name, items in (("heldout", judge_demo.heldout_items()), ("train_distribution",
                                                                   judge_demo.synthetic_items(n_train, seed=99))):
        agree = positives = unparsed = false_pos = false_neg = 0
        longest = 0
        for question, reference, answer in items:
            messages = judge_demo.judge_conversation(question, reference, answer)[:-1]
            longest = max(longest, len(chat.prompt_ids(messages)))
            text, _, _ = chat.complete(messages, 16, 0.0, fmt)
            score, _why = parse_pointwise(text, judge_demo.SCALE)
            rule = answer_present(answer, reference) > 0.5
            positives += rule
            if score is None:
                unparsed += 1
                continue
            said = score > 0.5
            agree += said == rule
            false_pos += said and not rule
            false_neg += rule and not said
        out[name] = {"items": len(items), "agreement": round(agree / len(items), 4),
                     "majority_baseline": round(max(positives, len(items) - positives) / len(items), 4),
                     "ten_for_wrong": false_pos, "zero_for_right": false_neg, "unparsed": unparsed,
                     "longest_prompt_tokens": longest}
    chat.close()
    return out


def plot(report: dict, path: Path) -> None:
    """Citation-checked accuracy per seed (training questions sampled and greedy, held-out sampled) against step
    and training seconds (the learning-curve helper)."""
    from learning_curve import plot as plot_curves

    runs = []
    for run in report["runs"]:
        seconds, elapsed = {0: 0.0}, 0.0
        for p in run["per_step"]:
            elapsed += p["time/step"] or 0.0
            seconds[p["step"]] = round(elapsed, 1)
        for key, label in (("train_sampled", "training questions, T=1"), ("train_greedy", "training questions, greedy"),
                           ("heldout_sampled", "held-out questions, T=1")):
            runs.append({"algorithm": f"seed {run['seed']}, {label}",
                         "curve": [{"step": c["step"], "train_seconds": seconds.get(c["step"], elapsed),
                                    "accuracy": c[key]["accuracy"]} for c in run["curve"]]})
    plot_curves(runs, path, f"{RECIPE.name}: answer present and every citation searched",
                ylabel="citation-checked accuracy (%)")


def summary(runs: list[dict]) -> dict:
    """Before -> after ranges over seeds, per split and decoding, with searches per trajectory."""
    out = {}
    for key in ("train_greedy", "train_sampled", "heldout_greedy", "heldout_sampled"):
        before = [r["curve"][0][key]["accuracy"] for r in runs]
        after = [r["curve"][-1][key]["accuracy"] for r in runs]
        out[key] = {"before": [min(before), max(before)], "after": [min(after), max(after)],
                    "searches_before": [r["curve"][0][key]["searches"] for r in runs],
                    "searches_after": [r["curve"][-1][key]["searches"] for r in runs]}
    agreements = [r["judge_agreement"] for r in runs if r["judge_agreement"] is not None]
    out["judge_agreement_in_runs"] = [min(agreements), max(agreements)] if agreements else None
    return out


def _previous(out: Path, overrides: list[str]) -> dict | None:
    """The report already at ``out`` for ``--reuse`` (None when there is none); it must share the overrides."""
    if not out.exists():
        return None
    prev = json.loads(out.read_text())
    if prev.get("overrides") != overrides:
        raise SystemExit(f"retrieval_curve.py --reuse: {out} was measured with the overrides {prev.get('overrides')}, "
                         f"not {overrides}; drop --reuse or choose another --out")
    return prev


def _judge_part(args, previous: dict | None) -> dict:
    if args.judge_from:
        return json.loads(Path(args.judge_from).read_text())["judge"]
    if previous and previous.get("judge"):
        return previous["judge"]
    return judge_agreement()


def _write(report: dict, out: Path, measured: bool = True) -> None:
    """Write the JSON + PNG; ``measured``: a seed was just run, so the load average at the end is now's."""
    report["summary"] = summary(report["runs"])
    if measured or "load_average_end" not in report:
        report["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    out.write_text(json.dumps(report, indent=2) + "\n")
    plot(report, out.with_suffix(".png"))


def run_seeds(report: dict, args, out: Path, previous: dict | None) -> None:
    """Train and evaluate each seed (or keep it from ``previous``); the report is written after every seed, so an
    interrupted run keeps what it did (and ``--reuse`` continues it)."""
    kept = {r["seed"]: r for r in (previous or {}).get("runs", [])}
    if kept:  # the load averages span the runs that measured the seeds, not this process's re-plot
        report.update({k: previous[k] for k in ("load_average_start", "load_average_end") if k in previous})
    report["runs"] = []
    for seed in args.seeds:
        if seed in kept:
            print(f"[retrieval_curve] seed {seed}: kept from {out} (--reuse)", file=sys.stderr, flush=True)
            report["runs"].append(kept[seed])
        else:
            report["runs"].append(run_seed(seed, args))
            print(json.dumps({k: v for k, v in report["runs"][-1].items() if k != "per_step"}), file=sys.stderr,
                  flush=True)
        _write(report, out, measured=seed not in kept)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--every", type=int, default=5, help="checkpoint (and evaluate) every N steps")
    ap.add_argument("--samples", type=int, default=4, help="sampled trajectories per question (T=1)")
    ap.add_argument("--judge-only", action="store_true")
    ap.add_argument("--judge-from", help="take the judge part from the JSON of an earlier --judge-only run")
    ap.add_argument("--reuse", action="store_true", help="keep the seeds (and the judge part) already in --out; "
                                                         "it must have been written with the same overrides")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "retrieval.json"))
    ap.add_argument("--replot", action="store_true", help="only redraw the PNG from the JSON at --out")
    ap.add_argument("--runs-dir", default=str(ROOT / "runs" / "retrieval-curve"))
    ap.add_argument("overrides", nargs="*", metavar="key=value", help="recipe overrides for every run")
    args = ap.parse_args(argv)
    if args.replot:
        plot(json.loads(Path(args.out).read_text()), Path(args.out).with_suffix(".png"))
        return 0
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    out = Path(args.out)
    previous = _previous(out, args.overrides) if args.reuse and not args.judge_only else None
    report: dict = {"recipe": str(RECIPE.relative_to(ROOT)), "overrides": args.overrides, "cpu_count": os.cpu_count(),
                    "load_average_start": [round(x, 2) for x in os.getloadavg()],
                    "judge": _judge_part(args, previous)}
    print(json.dumps({"judge": report["judge"]}), file=sys.stderr, flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    if args.judge_only:
        out = out.with_name(out.stem + "_judge.json")
        report["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
        out.write_text(json.dumps(report, indent=2) + "\n")
    else:
        run_seeds(report, args, out, previous)
    print(json.dumps({"json": str(out), "judge": {k: report["judge"][k] for k in ("heldout", "train_distribution")},
                      **({"summary": report["summary"]} if "summary" in report else {})}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
