"""Alerts over a run's logged metrics: pure functions from the parsed ``metrics.jsonl`` rows to a list of
:class:`Alert`. Each check names the steps it saw and the curve (an anchor in the report) that shows it.

The checks follow the failure modes the RL-for-LLM literature warns about: reward hacking shows as training
reward rising while held-out accuracy does not (Gao et al. 2022, arXiv 2210.10760); groups whose rewards
are all equal give zero advantage and no gradient (DAPO's dynamic sampling, arXiv 2503.14476, Sec. 3.2);
entropy collapse (Cui et al. 2025, arXiv 2505.22617); runaway length and KL spikes. Every threshold is a
field of :class:`AlertThresholds`, documented where it is declared; ``grouprl report --threshold
name=value`` changes it.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field, fields
from typing import Any

from grouprl.errors import ConfigError

Rows = list[dict[str, Any]]


@dataclass
class AlertThresholds:
    """When each alert fires. Windows count logged steps (rows of metrics.jsonl), not optimizer steps."""

    window: int = 10
    """Smoothing window: the checks compare means over this many consecutive logged steps."""
    reward_rise: float = 0.1
    """reward_vs_eval: the smoothed training reward rose by at least this much (reward units) ..."""
    eval_flat: float = 0.02
    """... while the held-out metric gained at most this much from the first evaluation to the last, ..."""
    eval_drop: float = 0.05
    """... or lost at least this much from its peak (same steps for the reward's rise)."""
    eval_min_points: int = 3
    """reward_vs_eval smooths the held-out metric over this many evaluations and needs at least that many."""
    length_growth: float = 5.0
    """length_blowup: the smoothed mean completion length grew by this factor over its first window ..."""
    truncated_frac: float = 0.3
    """... or the smoothed fraction of completions cut at max_completion_length exceeds this."""
    dominate_frac: float = 0.9
    """component_dominates: one component's |weight * mean| is this share of the sum over components."""
    zero_std_frac: float = 0.8
    """variance_collapse: the smoothed fraction of groups whose rewards are all equal exceeds this."""
    kl_spike_factor: float = 5.0
    """kl_spike: KL at a step exceeds this multiple of the median of the preceding window ..."""
    kl_spike_min: float = 0.05
    """... and exceeds this absolute value (nats), so noise around zero does not fire."""
    entropy_floor_frac: float = 0.1
    """entropy_collapse: the smoothed entropy fell below this fraction of its first window's mean ..."""
    entropy_floor: float = 0.02
    """... or below this absolute value (nats per token)."""
    clip_frac: float = 0.2
    """clip_high: clip_frac_low + clip_frac_high, smoothed, stays above this ..."""
    patience: int = 10
    """... for this many consecutive logged steps (also used by variance_collapse and entropy_collapse)."""
    constant_min_steps: int = 10
    """component_constant: a component whose mean and std never change over at least this many steps."""
    dead_min_steps: int = 3
    """no_learning: every one of at least this many logged steps (all of them, in a shorter run) had every
    completion truncated, or no group with unequal rewards, or -- with tools -- no tool call."""

    @classmethod
    def from_overrides(cls, items: list[str] | None) -> AlertThresholds:
        """Build from ``["name=value", ...]`` (the CLI's ``--threshold``)."""
        t = cls()
        names = {f.name: f for f in fields(cls)}
        for item in items or []:
            key, sep, value = item.partition("=")
            if not sep or key not in names:
                raise ConfigError(f"--threshold {item!r}: use name=value with name one of {', '.join(names)}.")
            try:
                setattr(t, key, type(getattr(t, key))(value))
            except ValueError as e:
                raise ConfigError(f"--threshold {item!r}: {value!r} is not a number.") from e
        return t


@dataclass
class Alert:
    name: str
    message: str
    steps: list[int] = field(default_factory=list)
    """The steps where it shows (first and last of the stretch, or each spike)."""
    anchor: str = ""
    """Id of the report panel that shows the curve."""

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "message": self.message, "steps": self.steps, "anchor": self.anchor}


def series(rows: Rows, key: str) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for r in rows:
        v = r.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            xs.append(int(r["step"]))
            ys.append(float(v))
    return xs, ys


def smooth(ys: list[float], w: int) -> list[float]:
    """Trailing mean over up to ``w`` values (the first values average what exists so far)."""
    out, acc = [], 0.0
    for i, y in enumerate(ys):
        acc += y
        if i >= w:
            acc -= ys[i - w]
        out.append(acc / min(i + 1, w))
    return out


def _stretches(flags: list[bool], patience: int) -> list[tuple[int, int]]:
    """(start, end) index pairs of runs of True at least ``patience`` long."""
    out, start = [], None
    for i, f in enumerate(flags + [False]):
        if f and start is None:
            start = i
        elif not f and start is not None:
            if i - start >= patience:
                out.append((start, i - 1))
            start = None
    return out


def _sustained(rows: Rows, key: str, t: AlertThresholds, above: float) -> list[tuple[int, int]]:
    xs, ys = series(rows, key)
    flags = [v > above for v in smooth(ys, t.window)]
    return [(xs[a], xs[b]) for a, b in _stretches(flags, t.patience)]


def component_names(rows: Rows) -> list[str]:
    names: dict[str, None] = {}
    for r in rows:
        for k in r:
            if k.startswith("rewards/") and k.endswith("/mean"):
                names[k[len("rewards/"):-len("/mean")]] = None
    return list(names)


def eval_key(rows: Rows) -> str | None:
    """The held-out metric the reward is compared with: eval/accuracy if logged, else the first eval/ key."""
    keys = [k for r in rows for k, v in r.items() if k.startswith("eval/") and isinstance(v, (int, float))]
    return "eval/accuracy" if "eval/accuracy" in keys else (keys[0] if keys else None)


def check_reward_vs_eval(rows: Rows, t: AlertThresholds) -> list[Alert]:
    """Two patterns, both on the eval curve smoothed over ``eval_min_points`` evaluations:
    flat -- from the first to the last evaluation the held-out metric gained at most ``eval_flat`` while the
    smoothed training reward rose by ``reward_rise``; falling -- after its peak the held-out metric lost at
    least ``eval_drop`` while the training reward rose by ``reward_rise`` over the same steps."""
    key = eval_key(rows)
    rx, ry = series(rows, "reward")
    ex, ey = series(rows, key) if key else ([], [])
    if len(rx) < 2 or len(ex) < t.eval_min_points:
        return []
    sm = dict(zip(rx, smooth(ry, t.window)))
    at = {s: sm[max((x for x in rx if x <= s), default=rx[0])] for s in ex}
    es = smooth(ey, t.eval_min_points)
    first, last = t.eval_min_points - 1, len(ex) - 1
    peak = max(range(first, last + 1), key=lambda i: es[i])
    rise_all, rise_peak = at[ex[last]] - at[ex[first]], at[ex[last]] - at[ex[peak]]
    if rise_all >= t.reward_rise and es[last] - es[first] <= t.eval_flat:
        a, b, what = ex[first], ex[last], f"stayed flat ({es[first]:.3g} -> {es[last]:.3g})"
        rise = rise_all
    elif rise_peak >= t.reward_rise and es[peak] - es[last] >= t.eval_drop:
        a, b, what = ex[peak], ex[last], f"fell from its peak {es[peak]:.3g} to {es[last]:.3g}"
        rise = rise_peak
    else:
        return []
    return [Alert("reward_vs_eval", f"training reward rose by {rise:.3g} from step {a} to {b} while {key} {what}"
                  f" (mean of {t.eval_min_points} evaluations): the reward may be hacked (read the sample review).",
                  [a, b], "panel-reward")]


def check_length_blowup(rows: Rows, t: AlertThresholds) -> list[Alert]:
    out = []
    xs, ys = series(rows, "completions/mean_length")
    if len(ys) >= 2 * t.window:
        sm, base = smooth(ys, t.window), statistics.fmean(ys[: t.window])
        hit = [i for i, v in enumerate(sm) if base > 0 and v > t.length_growth * base]
        if hit:
            out.append(Alert("length_blowup",
                             f"mean completion length grew {sm[hit[0]] / base:.1f}x (from {base:.3g} to "
                             f"{sm[hit[0]]:.3g} tokens) by step {xs[hit[0]]}.", [xs[hit[0]], xs[-1]], "panel-length"))
    for a, b in _sustained(rows, "completions/truncated_frac", t, t.truncated_frac):
        out.append(Alert("length_blowup", f"over {t.truncated_frac:.0%} of completions hit the length limit "
                         f"from step {a} to {b}.", [a, b], "panel-length"))
    return out


def check_component_dominates(rows: Rows, t: AlertThresholds, weights: dict[str, float] | None = None) -> list[Alert]:
    names = component_names(rows)
    if len(names) < 2:
        return []
    weights = weights or {}
    last = rows[-t.window:]
    share = {}
    for n in names:
        _, ys = series(last, f"rewards/{n}/mean")
        share[n] = abs(weights.get(n, 1.0) * statistics.fmean(ys)) if ys else 0.0
    total = sum(share.values())
    top = max(share, key=share.get)
    if total > 0 and share[top] / total > t.dominate_frac:
        steps = [int(last[0]["step"]), int(last[-1]["step"])]
        return [Alert("component_dominates", f"reward component {top!r} makes {share[top] / total:.0%} of the "
                      f"total reward over steps {steps[0]}-{steps[1]}: the others barely count.", steps,
                      "panel-components")]
    return []


def check_variance_collapse(rows: Rows, t: AlertThresholds) -> list[Alert]:
    return [Alert("variance_collapse", f"over {t.zero_std_frac:.0%} of groups had all-equal rewards (zero "
                  f"advantage, no gradient) from step {a} to {b}.", [a, b], "panel-zero_std")
            for a, b in _sustained(rows, "frac_reward_zero_std", t, t.zero_std_frac)]


def check_kl_spike(rows: Rows, t: AlertThresholds) -> list[Alert]:
    xs, ys = series(rows, "kl")
    spikes = [xs[i] for i in range(t.window, len(ys))
              if ys[i] > t.kl_spike_min and ys[i] > t.kl_spike_factor * statistics.median(ys[i - t.window:i])]
    if not spikes:
        return []
    return [Alert("kl_spike", f"KL jumped above {t.kl_spike_factor:g}x its recent median at step(s) "
                  f"{', '.join(map(str, spikes[:10]))}.", spikes, "panel-kl")]


def check_entropy_collapse(rows: Rows, t: AlertThresholds) -> list[Alert]:
    xs, ys = series(rows, "entropy")
    if len(ys) < t.window + t.patience:
        return []
    base = statistics.fmean(ys[: t.window])
    floor = max(t.entropy_floor_frac * base, t.entropy_floor)
    flags = [v < floor for v in smooth(ys, t.window)]
    return [Alert("entropy_collapse", f"entropy fell below {floor:.3g} (start {base:.3g}) from step {xs[a]} to "
                  f"{xs[b]}: the policy stopped exploring.", [xs[a], xs[b]], "panel-entropy")
            for a, b in _stretches(flags, t.patience)]


def check_clip_high(rows: Rows, t: AlertThresholds) -> list[Alert]:
    both = [dict(step=r["step"], clip=r.get("policy/clip_frac_low", 0.0) + r.get("policy/clip_frac_high", 0.0))
            for r in rows if "policy/clip_frac_low" in r or "policy/clip_frac_high" in r]
    return [Alert("clip_high", f"over {t.clip_frac:.0%} of tokens were clipped from step {a} to {b}: updates "
                  "are too large (lower lr or num_iterations).", [a, b], "panel-clip")
            for a, b in _sustained(both, "clip", t, t.clip_frac)]


def check_component_constant(rows: Rows, t: AlertThresholds) -> list[Alert]:
    out = []
    for n in component_names(rows):
        xs, means = series(rows, f"rewards/{n}/mean")
        _, stds = series(rows, f"rewards/{n}/std")
        if len(means) >= t.constant_min_steps and max(means) - min(means) < 1e-9 and max(stds, default=0) < 1e-9:
            out.append(Alert("component_constant", f"reward component {n!r} was {means[0]:.3g} for every sample "
                             f"from step {xs[0]} to {xs[-1]}: it never discriminates (broken or saturated).",
                             [xs[0], xs[-1]], "panel-components"))
    return out


def check_no_learning(rows: Rows, t: AlertThresholds) -> list[Alert]:
    """Runs that cannot learn, caught from their first steps (the other checks wait for a window): every
    completion cut at ``max_new_tokens`` (nothing ever ends, so no reward can tell completions apart), every
    group's rewards equal (zero advantage: GRPO's gradient is 0), or a tool run whose model never calls one."""
    out, steps = [], len(series(rows, "reward")[0])
    for key, dead, anchor, what in (
            ("completions/truncated_frac", lambda v: v >= 0.999, "panel-length",
             "every completion hit the length limit (max_new_tokens) at every step from {a} to {b}: nothing "
             "the model writes ends, so the reward cannot tell completions apart. Fix: raise max_new_tokens."),
            ("frac_reward_zero_std", lambda v: v >= 0.999, "panel-zero_std",
             "every group had all-equal rewards at every step from {a} to {b}: every advantage is 0 and nothing "
             "is learned. Fix: a reward that tells this model's completions apart (check it with grouprl reward), "
             "or a warm start that sometimes succeeds."),
            ("tools/calls_per_traj", lambda v: v <= 0.0, "panel-reward",
             "the model called no tool at any step from {a} to {b}: a tool reward stays 0 and tool use cannot be "
             "learned. Fix: a warm start (or system_prompt) that shows the tool-call format, and check the chat "
             "template lists the tools (grouprl check-template).")):
        xs, ys = series(rows, key)
        if ys and len(ys) >= min(t.dead_min_steps, max(steps, 1)) and all(dead(v) for v in ys):
            out.append(Alert("no_learning", what.format(a=xs[0], b=xs[-1]), [xs[0], xs[-1]], anchor))
    return out


CHECKS = (check_no_learning, check_reward_vs_eval, check_length_blowup, check_variance_collapse, check_kl_spike,
          check_entropy_collapse, check_clip_high, check_component_constant)


def compute_alerts(rows: Rows, thresholds: AlertThresholds | None = None,
                   weights: dict[str, float] | None = None) -> list[Alert]:
    """Run every check over the metric rows (sorted by step). ``weights``: reward weight by component name."""
    t = thresholds or AlertThresholds()
    rows = [r for r in rows if isinstance(r.get("step"), (int, float))]
    alerts = [a for check in CHECKS for a in check(rows, t)]
    return alerts + check_component_dominates(rows, t, weights)
