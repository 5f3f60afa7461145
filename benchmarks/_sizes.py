"""The three-size comparison of ``vs_trl.py --size ...``: option parsing, floor multiples, targets, tables.

Targets (issue "Performance where it matters"; benchmarks, not timed tests):

- grouprl / TRL steps/s >= 2x on ``tiny`` and >= 1.5x on ``small`` and ``medium``, for GRPO and GSPO;
- peak RSS <= 0.8x TRL's on ``medium``;
- each of grouprl's phases within 1.3x of its plain-PyTorch floor on ``small`` and ``medium``.

The floor (``floor.measure_floor``) is the GRPO step's work: a decode of B*G completions, one
forward+backward over them and one reference forward. Its multiples are therefore given for the ``grpo``
configuration (all three phases) and, for ``gspo``, for the policy forward+backward only (the same 16
completions per optimizer step); GSPO's generation round is 32 completions every two steps, which is not
the floor's decode.
"""

from __future__ import annotations

import json
from typing import Any

SPEED_TARGET = {"tiny": 2.0, "small": 1.5, "medium": 1.5}
RSS_TARGET = {"medium": 0.8}
FLOOR_TARGET = {"small": 1.3, "medium": 1.3}
FLOOR_PHASES = {"grpo": ("generate", "policy_fwd_bwd", "ref_logp"), "gspo": ("policy_fwd_bwd",)}
# phases of the breakdown table; "other" there = reward + optimizer + everything outside the phases
BREAKDOWN = ("generate", "ref_logp", "old_logp", "policy_fwd_bwd")


def parse_opts(items: list[str], flag: str) -> dict[str, Any]:
    """``["a=1", "b=true", "c=bf16"]`` -> ``{"a": 1, "b": True, "c": "bf16"}`` (JSON values, else strings)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise SystemExit(f"{flag} {item!r}: expected KEY=VALUE, e.g. {flag} logits_chunk_size=4096")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        out[key.strip()] = value
    return out


def floor_multiples(config: str, grouprl: dict[str, Any], floor: dict[str, Any]) -> dict[str, float]:
    """grouprl's seconds per step / the floor's, for the phases the floor measures for ``config``."""
    if not (grouprl.get("repeats") and floor.get("ok")):
        return {}
    b = grouprl["breakdown_s_per_step"]
    return {ph: b[ph] / floor["floor_s"][ph] for ph in FLOOR_PHASES.get(config, ()) if floor["floor_s"][ph] > 0}


def size_targets(name: str, size_result: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per applicable target of this size: what, the measured value, the bound, met or not."""
    rows: list[dict[str, Any]] = []
    for cfg, res in size_result["configs"].items():
        ratio = res.get("ratio_grouprl_over_trl") or {}
        if ratio and name in SPEED_TARGET:
            rows.append({"config": cfg, "target": "steps/s grouprl / TRL", "value": ratio["steps_per_s"],
                         "bound": f">= {SPEED_TARGET[name]}", "met": ratio["steps_per_s"] >= SPEED_TARGET[name]})
        if ratio and name in RSS_TARGET:
            rows.append({"config": cfg, "target": "peak RSS grouprl / TRL", "value": ratio["peak_rss_mib"],
                         "bound": f"<= {RSS_TARGET[name]}", "met": ratio["peak_rss_mib"] <= RSS_TARGET[name]})
        if name in FLOOR_TARGET:
            for phase, mult in (res.get("floor_multiple") or {}).items():
                rows.append({"config": cfg, "target": f"{phase} / floor", "value": mult,
                             "bound": f"<= {FLOOR_TARGET[name]}", "met": mult <= FLOOR_TARGET[name]})
    return rows


def _x(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def _main_rows(result: dict[str, Any]) -> list[str]:
    lines = ["| size | params | config | grouprl steps/s | TRL steps/s | ratio | ratio (per CPU-s) "
             "| RSS grouprl MiB | RSS TRL MiB | RSS ratio | generate / floor | policy fwd+bwd / floor "
             "| ref fwd / floor |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, size in result["sizes"].items():
        params = f"{size['model']['parameters'] / 1e6:.2f}M"
        for cfg, res in size["configs"].items():
            g, t = res.get("grouprl") or {}, res.get("trl") or {}
            r = res.get("ratio_grouprl_over_trl") or {}
            fm = res.get("floor_multiple") or {}
            cells = [name, params, cfg,
                     f"{g['steps_per_s']:.3f}" if g.get("repeats") else "failed",
                     f"{t['steps_per_s']:.3f}" if t.get("repeats") else "failed",
                     f"**{_x(r.get('steps_per_s'))}**", _x(r.get("steps_per_cpu_s")),
                     f"{g['peak_rss_mib']:.0f}" if g.get("repeats") else "",
                     f"{t['peak_rss_mib']:.0f}" if t.get("repeats") else "",
                     _x(r.get("peak_rss_mib")),
                     *(_x(fm.get(ph)) if ph in fm else "" for ph in ("generate", "policy_fwd_bwd", "ref_logp"))]
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def _breakdown_rows(result: dict[str, Any]) -> list[str]:
    lines = ["| size | config | side | generate | ref fwd | old-logp fwd | policy fwd+bwd | other | step (ms) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, size in result["sizes"].items():
        floor = size.get("floor") or {}
        if floor.get("ok"):
            f = floor["floor_s"]
            lines.append(f"| {name} | grpo step | plain PyTorch floor | {1000 * f['generate']:.1f} | "
                         f"{1000 * f['ref_logp']:.1f} | | {1000 * f['policy_fwd_bwd']:.1f} | | |")
        for cfg, res in size["configs"].items():
            for lib in ("grouprl", "trl"):
                r = res.get(lib) or {}
                if not r.get("repeats"):
                    continue
                b = r["breakdown_s_per_step"]
                other = b["step_time"] - sum(b[k] for k in BREAKDOWN)
                cells = [f"{1000 * b[k]:.1f}" for k in BREAKDOWN] + [f"{1000 * other:.1f}", f"{1000 * b['step_time']:.1f}"]
                lines.append(f"| {name} | {cfg} | {lib} | " + " | ".join(cells) + " |")
    return lines


def markdown_sizes(result: dict[str, Any]) -> str:
    """The three-size table, the per-phase breakdown (ms per optimizer step) and the targets.

    Times (steps/s, phases) are by the run's clock (``--clock``): wall time, or CPU time of each child.
    """
    runs = result.get("runs", [result])
    clocks = sorted({r.get("clock", "wall") for r in runs})
    precisions = sorted({(r.get("overrides") or {}).get("precision", "fp32") for r in runs})
    lines = [f"Clock: {', '.join(clocks)} time. Precision (both sides): {', '.join(precisions)}.", ""] + _main_rows(result) + [""] + _breakdown_rows(result) + ["", "| size | config | target | value | met |",
                                                                  "|---|---|---|---|---|"]
    for name, size in result["sizes"].items():
        for t in size.get("targets", []):
            lines.append(f"| {name} | {t['config']} | {t['target']} {t['bound']} | {t['value']:.2f} | "
                         f"{'yes' if t['met'] else '**no**'} |")
    return "\n".join(lines)
