"""Turn a parsed run into the JSON the page draws: curve panels, reward histograms per window, the sample
review (highest and lowest rewards per window) and the measured effect of each reward-changelog entry.

The sample review reads these ``samples.jsonl`` fields when present: ``step``, ``prompt``, ``completion``,
``reward``, ``rewards`` ({component: value}), ``advantage`` (a number, or one per token), ``truncated``; for
the per-token view ``tokens`` (the completion's tokens as strings) or ``completion_ids`` / ``token_ids``
(shown as ids when no strings are logged) with ``loss_mask`` (0 = tool output or template, greyed); for
agent runs ``messages`` (tool messages greyed when there is no per-token data), ``tool_calls``,
``num_turns`` and ``end_reason``. Rows with an ``eval`` tag are held-out samples and are not reviewed.
"""

from __future__ import annotations

import fnmatch
import math
import statistics
from typing import Any

from grouprl.report.runlog import RunLog

# (panel id, title, fnmatch patterns); a key goes to the first panel that matches it. Order = page order.
PANELS: list[tuple[str, str, list[str]]] = [
    ("reward", "Total reward (training)", ["reward", "reward_std", "reward/*"]),
    ("components", "Reward components (mean per component)", ["rewards/*/mean", "rewards/*/weighted*"]),
    ("component_spread", "Reward components: std and fraction unscored", ["rewards/*"]),
    ("eval", "Held-out evaluation (rates)", ["eval/*"]),
    ("eval_other", "Held-out evaluation (counts, lengths)", ["eval/*"]),
    ("kl", "KL to the reference", ["kl"]),
    ("entropy", "Entropy (nats / token)", ["entropy"]),
    ("clip", "Clip fractions", ["policy/clip_frac*"]),
    ("policy", "Policy ratio and approximate KL to the sampler", ["policy/*"]),
    ("length", "Completion length (tokens)", ["completions/mean_length", "completions/min_length",
                                               "completions/max_length", "completions/*"]),
    ("zero_std", "Groups with all-equal rewards (fraction)", ["frac_reward_zero_std"]),
    ("lr", "Learning rate", ["lr"]),
    ("grad_norm", "Gradient norm", ["grad_norm"]),
    ("throughput", "Tokens per second", ["tokens_per_s"]),
    ("time", "Time per step (s)", ["time/*"]),
    ("agent", "Agent: turns, tool calls, failures", ["turns/*", "tools/*", "end_reason/*"]),
    ("advantage", "Advantages", ["advantage/*"]),
    ("loss", "Loss", ["loss/*"]),
    # asynchronous runs (max_staleness >= 1, grouprl.train.pipeline); absent from synchronous runs
    ("staleness", "Asynchronous: staleness of the trained rounds (optimizer steps) and rounds dropped",
     ["async/staleness_*", "async/dropped"]),
    ("async_wait", "Asynchronous: trainer and worker waits, the worker's phase times (s)", ["async/*_s"]),
    ("mismatch", "Behaviour vs trainer log-probs: gap and importance weights", ["mismatch/*"]),
    ("async", "Asynchronous: the policy version that sampled each trained round", ["async/*"]),
]
SECONDARY = {"completions/truncated_frac", "completions/clipped_frac"}


def _matches(key: str, rule: str) -> bool:
    return fnmatch.fnmatchcase(key, rule)


def panels(run: RunLog) -> list[dict[str, Any]]:
    """Every numeric logged key in exactly one panel; keys no rule claims go to an "Other metrics" panel."""
    keys = [k for k in run.metric_keys() if run.series(k)[0]]
    taken: set[str] = set()
    out = []
    for pid, title, rules in PANELS + [("other", "Other metrics", ["*"])]:
        mine = [k for rule in rules for k in keys if k not in taken and _matches(k, rule)]
        mine = list(dict.fromkeys(mine))
        if pid == "eval":  # rates in [0, 1] (accuracy, pass@k) apart from counts and lengths
            mine = [k for k in mine if all(0 <= v <= 1 for v in run.series(k)[1])]
        taken.update(mine)
        if mine:
            out.append({"id": f"panel-{pid}", "title": title, "keys": mine,
                        "secondary": [k for k in mine if k in SECONDARY or k.endswith("/frac_none")]})
    return out


def columns(run: RunLog) -> dict[str, list]:
    """Metrics by key, column-wise: ``{"step": [...], key: [value or None, ...]}``."""
    keys = run.metric_keys()
    cols: dict[str, list] = {"step": [r["step"] for r in run.metrics]}
    for k in keys:
        vals = [r.get(k) for r in run.metrics]
        cols[k] = [None if isinstance(v, float) and not math.isfinite(v) else v for v in vals]
    return cols


def train_samples(run: RunLog) -> list[dict[str, Any]]:
    return [s for s in run.samples if not s.get("eval") and isinstance(s.get("reward"), (int, float))]


def _windows(steps: list[int], size: int) -> list[tuple[int, int]]:
    """Windows of ``size`` steps: 1..size, size+1..2*size, ... (step 0, if logged, joins the first)."""
    if not steps:
        return []
    first = (max(min(steps), 1) - 1) // size
    last = (max(max(steps), 1) - 1) // size
    return [(0 if i == 0 else i * size + 1, (i + 1) * size) for i in range(first, last + 1)]


def histograms(run: RunLog, window: int, bins: int = 20) -> dict[str, Any]:
    """Reward distribution of the logged training samples, one histogram per ``window`` steps."""
    rows = train_samples(run)
    rewards = [float(s["reward"]) for s in rows if math.isfinite(s["reward"])]
    if not rewards:
        return {}
    lo, hi = min(rewards), max(rewards)
    width = (hi - lo) / bins if hi > lo else 1.0
    edges = [lo + i * width for i in range(bins + 1)]
    out = []
    for a, b in _windows([int(s["step"]) for s in rows], window):
        counts = [0] * bins
        for s in rows:
            if a <= s["step"] <= b and math.isfinite(s["reward"]):
                counts[min(int((s["reward"] - lo) / width), bins - 1)] += 1
        if sum(counts):
            out.append({"window": [a, b], "counts": counts})
    return {"edges": edges, "windows": out}


def _length(s: dict[str, Any]) -> int:
    for key in ("completion_ids", "token_ids", "tokens"):
        if isinstance(s.get(key), list):
            return len(s[key])
    return len(str(s.get("completion", "")))


def _review_row(s: dict[str, Any], run: RunLog) -> dict[str, Any]:
    keep = ("id", "step", "prompt", "completion", "reward", "rewards", "advantage", "truncated", "tokens",
            "completion_ids", "token_ids", "loss_mask", "messages", "tool_calls", "num_turns", "end_reason")
    row = {k: s[k] for k in keep if k in s}
    row["length"] = _length(s)
    row["length_unit"] = "tokens" if any(isinstance(s.get(k), list) for k in ("completion_ids", "token_ids",
                                                                                "tokens")) else "chars"
    if s["id"] in run.marks:
        row["mark"] = run.marks[s["id"]].get("mark")
    return row


def review(run: RunLog, window: int, k: int = 20) -> list[dict[str, Any]]:
    """Per window: the ``k`` highest- and ``k`` lowest-reward training samples (ties: earlier first)."""
    rows = train_samples(run)
    out = []
    for a, b in _windows([int(s["step"]) for s in rows], window):
        mine = [s for s in rows if a <= s["step"] <= b]
        if not mine:
            continue
        ranked = sorted(mine, key=lambda s: -s["reward"])
        top = ranked[:min(k, (len(mine) + 1) // 2)]
        chosen = {id(s) for s in top}  # identity, not equality: a group may repeat a completion
        bottom = [s for s in sorted(mine, key=lambda s: s["reward"]) if id(s) not in chosen][:k]
        out.append({"window": [a, b], "n": len(mine), "top": [_review_row(s, run) for s in top],
                    "bottom": [_review_row(s, run) for s in bottom]})
    return out


def _mean_between(run: RunLog, key: str, a: float, b: float) -> float | None:
    xs, ys = run.series(key)
    vals = [y for x, y in zip(xs, ys) if a <= x <= b]
    return statistics.fmean(vals) if vals else None


def changelog(run: RunLog, window: int) -> list[dict[str, Any]]:
    """The config's ``reward_changelog`` entries, each with the measured change of the reward, each component
    and the held-out metric: mean over ``window`` steps after the entry's step minus the mean before it
    (no step: the run's last window minus its first)."""
    entries = run.config.get("reward_changelog") or []
    steps = [r["step"] for r in run.metrics]
    if not steps:
        return []
    keys = ["reward"] + [k for k in run.metric_keys() if k.startswith("rewards/") and k.endswith("/mean")]
    keys += [k for k in ("eval/accuracy",) if k in run.metric_keys()]
    out = []
    for e in entries:
        e = dict(e) if isinstance(e, dict) else {"reason": str(e)}
        s = e.get("step")
        before = (s - window, s - 1) if s is not None else (steps[0], steps[0] + window - 1)
        after = (s, s + window - 1) if s is not None else (steps[-1] - window + 1, steps[-1])
        effect = {}
        for key in keys:
            x, y = _mean_between(run, key, *before), _mean_between(run, key, *after)
            if x is not None and y is not None:
                effect[key] = {"before": x, "after": y, "change": y - x}
        out.append({**e, "before": before, "after": after, "measured": effect})
    return out
