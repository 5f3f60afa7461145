"""Shared plumbing for the benchmark scripts: the workload, the reward, child processes, step timing.

Every measured run happens in its own child process so that peak RSS (``ru_maxrss`` from ``os.wait4``)
belongs to exactly one library and one configuration, and no import or allocator state leaks between
runs. The parent only builds the tiny checkpoint, spawns children and aggregates their JSON.

The workload is the same for every library:

- the tiny offline model from :func:`grouprl.builtin.tiny.make_tiny_checkpoint` (random weights, saved once,
  loaded with ``from_pretrained``; nothing is downloaded: ``HF_HUB_OFFLINE=1``);
- synthetic addition prompts ``"What is a + b?"`` with an ``answer`` column;
- :func:`number_reward`, a plain Python reward with TRL's ``reward_funcs`` signature;
- every completion is forced to exactly ``max_new_tokens`` tokens (``min_new_tokens = max_new_tokens``:
  the EOS logit is masked until the length is reached) so that neither side does less work by stopping
  early. Completion tokens are counted from what each library actually generated.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

# Names of the per-step breakdown; "other" is the step's wall time minus the sum of these.
# policy_fwd_bwd = forward of the policy with grad + loss math + backward, over all micro-batches.
PHASES = ("generate", "reward", "ref_logp", "old_logp", "policy_fwd_bwd", "optimizer")
# Phases that are model or reward work; the optimizer and "other" are the rest.
MODEL_PHASES = ("generate", "reward", "ref_logp", "old_logp", "policy_fwd_bwd")
# Finer phases a side may report in addition (counted inside policy_fwd_bwd, not added again).
DETAIL = ("policy_fwd", "policy_bwd")


@dataclass
class Workload:
    """One benchmark configuration, shared verbatim by both libraries.

    Batch vocabulary: ``prompts_per_step`` prompts (B) times ``num_generations`` (G) completions make one
    optimizer step of N = B*G completions, split into ``grad_accum`` micro-batches. One generation round
    produces the completions of ``steps_per_generation`` micro-batches; when that exceeds ``grad_accum`` the
    later optimizer steps train on completions from an older policy (off-policy, needs old log-probs).
    """

    name: str = "grpo"
    level: str = "token"  # "token" = GRPO ratio, "sequence" = GSPO ratio
    num_generations: int = 8
    prompts_per_step: int = 2
    grad_accum: int = 2
    steps_per_generation: int = 2  # micro-batches per generation round (TRL semantics)
    max_new_tokens: int = 64
    temperature: float = 1.0
    learning_rate: float = 1e-5
    beta: float = 0.04
    eps_low: float = 0.2
    eps_high: float = 0.28
    max_grad_norm: float = 1.0
    steps: int = 6
    warmup_steps: int = 1
    threads: int = 1
    seed: int = 0
    num_prompts: int = 64
    rollout_backend: str = "transformers"  # grouprl only: a built-in name or "package.module:Class"
    # "wall": phases and steps timed by the wall clock; "cpu": by this process's CPU time (every
    # ``time.perf_counter`` in the child reads ``time.process_time``), which other jobs on a shared machine
    # disturb much less. With one torch thread both measure the same work.
    clock: str = "wall"
    # "fp32" or "bf16": grouprl ``bf16: true`` / TRL ``bf16=True`` (on a CPU both then run torch.autocast("cpu",
    # bfloat16); grouprl's rollout_dtype / ref_dtype ``auto`` follow it). ``vs_trl.py --precision``.
    precision: str = "fp32"
    # extra config fields passed verbatim to one side, e.g. {"logits_chunk_size": 4096} for grouprl
    grouprl_opts: dict[str, Any] = field(default_factory=dict)
    trl_opts: dict[str, Any] = field(default_factory=dict)

    @property
    def completions_per_step(self) -> int:
        return self.prompts_per_step * self.num_generations

    @property
    def micro_batch(self) -> int:
        if self.completions_per_step % self.grad_accum:
            raise ValueError(
                f"prompts_per_step*num_generations = {self.completions_per_step} must be divisible by "
                f"grad_accum = {self.grad_accum}"
            )
        return self.completions_per_step // self.grad_accum

    @property
    def optimizer_steps_per_generation(self) -> int:
        if self.steps_per_generation % self.grad_accum:
            raise ValueError(
                f"steps_per_generation ({self.steps_per_generation}) must be a multiple of grad_accum "
                f"({self.grad_accum}) so that one generation round spans whole optimizer steps"
            )
        return self.steps_per_generation // self.grad_accum


GRPO = Workload(name="grpo", level="token", beta=0.04, eps_low=0.2, eps_high=0.28,
                grad_accum=2, steps_per_generation=2, steps=9, warmup_steps=1)
GSPO = Workload(name="gspo", level="sequence", beta=0.0, eps_low=3e-4, eps_high=4e-4,
                grad_accum=2, steps_per_generation=4, steps=10, warmup_steps=2)


def dtype_probe(*models: Any) -> dict[str, int]:
    """Count the calls of each model's first attention ``q_proj`` by (grad or no grad, output dtype): what
    precision the passes that go through the module really ran in (a bf16 output = autocast or bf16
    weights). Samplers that read the weights directly (grouprl's lean sampler) do not show up."""
    import torch

    counts: dict[str, int] = defaultdict(int)

    def hook(module, args, output):
        counts[f"{'grad' if torch.is_grad_enabled() else 'no_grad'}:{str(output.dtype).replace('torch.', '')}"] += 1

    for model in models:
        q = next((m for name, m in model.named_modules() if name.endswith("q_proj")), None)
        if q is not None:
            q.register_forward_hook(hook)
    return counts


def emit_json(result: dict[str, Any], out: Path | None) -> None:
    """Print ``result`` as JSON and, when ``out`` is given, also write it there."""
    text = json.dumps(result, indent=2)
    print(text)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")


def make_dataset_rows(n: int, seed: int = 0) -> list[dict[str, str]]:
    """``n`` addition prompts as chat messages with their integer answers (deterministic in ``seed``)."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        rows.append({"prompt": [{"role": "user", "content": f"What is {a} + {b}?"}], "answer": str(a + b)})
    return rows


_NUMBER = re.compile(r"-?\d+")


def _text(completion: Any) -> str:
    if isinstance(completion, list):  # conversational: [{"role": "assistant", "content": ...}]
        return "".join(m.get("content", "") for m in completion)
    return str(completion)


def number_reward(completions: list, answer: list[str], **kwargs: Any) -> list[float]:
    """1.0 when the last integer in the completion equals ``answer``, 0.5 when it has any integer, else 0.

    TRL's ``reward_funcs`` signature. Example: ``number_reward(["so 42"], answer=["42"]) == [1.0]``.
    The partial credit keeps rewards varied within a group, so advantages (and the loss) are not all zero
    for a random tiny model.
    """
    out = []
    for completion, ans in zip(completions, answer):
        numbers = _NUMBER.findall(_text(completion))
        out.append(1.0 if numbers and numbers[-1] == str(ans).strip() else (0.5 if numbers else 0.0))
    return out


def make_checkpoint(path: Path, hidden_size: int = 64, num_layers: int = 2) -> Path:
    """Save the shared tiny model (random weights, fixed seed) to ``path``."""
    from grouprl.builtin.tiny import make_tiny_checkpoint

    return make_tiny_checkpoint(path, hidden_size=hidden_size, num_layers=num_layers)


@dataclass(frozen=True)
class Size:
    """A model preset shared by ``vs_trl.py``, ``scaling.py`` and ``floor.py``.

    The model is the tiny Qwen2 of :mod:`grouprl.builtin.tiny` at ``hidden`` x ``layers``; with ``vocab``
    its embedding (tied with the LM head) is resized to that many rows, so the LM head and the logits
    cost what a real vocabulary costs (the tokenizer keeps its 373 tokens: ids above decode to nothing).
    ``tokens`` is the fixed completion length. ``steps`` is ``(grpo, gspo)`` optimizer steps per run:
    fewer for the bigger models, keeping one warm-up generation round and at least one steady one.
    """

    hidden: int
    layers: int
    tokens: int
    vocab: int | None = None
    steps: tuple[int, int] = (9, 10)


SIZES = {
    "tiny": Size(64, 2, 64),
    "small": Size(256, 4, 128, steps=(5, 6)),
    # 16.8M tied embedding + 2 x 3.9M layers = about 24.7M parameters
    "medium": Size(512, 2, 256, 32768, steps=(3, 4)),
}


def make_model(path: Path, hidden: int, layers: int, vocab: int | None = None) -> Path:
    """The benchmark's tiny checkpoint; with ``vocab`` the embedding is resized to that many rows."""
    from grouprl.builtin.tiny import build_tiny_model, build_tokenizer, save_tiny

    tok = build_tokenizer()
    model = build_tiny_model(tok, hidden_size=hidden, num_layers=layers)
    if vocab:
        model.resize_token_embeddings(vocab)
    return save_tiny(path, tok, model)


def size_workload(base: Workload, size: Size) -> Workload:
    """``base`` (GRPO or GSPO) at ``size``'s completion length and step count."""
    steps = size.steps[0] if base.level == "token" else size.steps[1]
    return replace(base, max_new_tokens=size.tokens, steps=steps)


def use_clock(clock: str) -> None:
    """In a benchmark child: make ``time.perf_counter`` read process CPU time when ``clock == "cpu"``.

    Every phase timer of both sides (this module's :class:`StepClock`, grouprl's ``Timers``, ``floor.py``)
    calls ``time.perf_counter()`` at run time, so this one switch turns all of them into CPU-time timers.
    """
    if clock not in ("wall", "cpu"):
        raise ValueError(f"clock={clock!r}: use 'wall' or 'cpu'")
    if clock == "cpu":
        time.perf_counter = time.process_time


def child_env(threads: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        OMP_NUM_THREADS=str(threads),
        MKL_NUM_THREADS=str(threads),
        PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)] + ([os.environ["PYTHONPATH"]]
                                                                      if os.environ.get("PYTHONPATH") else [])),
        CUDA_VISIBLE_DEVICES="",
        WANDB_DISABLED="true",
    )
    return env


def run_child(script: Path, lib: str, spec: dict[str, Any], timeout: float = 1800) -> dict[str, Any]:
    """Run ``script --worker lib`` in a fresh process; return its JSON result plus its own peak RSS.

    Peak RSS comes from ``os.wait4`` (the rusage of exactly this child), in MiB.
    """
    with tempfile.TemporaryDirectory(prefix="grouprl-bench-") as tmp:
        out = Path(tmp) / "result.json"
        spec = {**spec, "result_path": str(out), "work_dir": tmp}
        log = Path(tmp) / "log.txt"
        with open(log, "w") as fh:
            proc = subprocess.Popen(
                [sys.executable, str(script), "--worker", lib, "--spec", json.dumps(spec)],
                stdout=fh, stderr=subprocess.STDOUT, env=child_env(spec["workload"]["threads"]), cwd=tmp,
            )
            start = time.monotonic()
            while True:
                pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
                if pid:
                    break
                if time.monotonic() - start > timeout:
                    proc.kill()
                    pid, status, usage = os.wait4(proc.pid, 0)
                    break
                time.sleep(0.05)
            proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0 or not out.exists():
            tail = log.read_text()[-4000:]
            return {"lib": lib, "ok": False, "returncode": proc.returncode, "log_tail": tail}
        result = json.loads(out.read_text())
        result.update(ok=True, lib=lib, peak_rss_mib=usage.ru_maxrss / 1024.0)
        return result


class StepClock:
    """Accumulates named phase times into the current optimizer step and closes steps.

    ``phase(name)`` is a context manager; ``end_step(tokens)`` closes the step at the current time.
    Time not covered by any phase is reported as ``other``.
    """

    def __init__(self) -> None:
        self.t0: float | None = None
        self.last = 0.0
        self.current: dict[str, float] = defaultdict(float)
        self.steps: list[dict[str, float]] = []
        self.tokens = 0
        self.losses: list[float] = []
        self.rewards: list[float] = []

    def start(self) -> None:
        self.t0 = self.last = time.perf_counter()
        self.last_cpu = time.process_time()

    def add(self, name: str, seconds: float) -> None:
        self.current[name] += seconds
        if name in DETAIL:
            self.current["policy_fwd_bwd"] += seconds

    def timed(self, name: str, fn):
        def wrapper(*args, **kwargs):
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.add(name, time.perf_counter() - t)

        return wrapper

    def end_step(self) -> None:
        now = time.perf_counter()
        row = {k: self.current.get(k, 0.0) for k in (*PHASES, *DETAIL)}
        row["step_time"] = now - self.last
        row["other"] = row["step_time"] - sum(row[k] for k in PHASES)
        row["completion_tokens"] = float(self.tokens)
        cpu = time.process_time()
        row["cpu_time"] = cpu - self.last_cpu
        self.last_cpu = cpu
        self.steps.append(row)
        self.current = defaultdict(float)
        self.tokens = 0
        self.last = now

    def summary(self, warmup_steps: int, cycle: int = 1) -> dict[str, Any]:
        return summarize_steps(self.steps, warmup_steps, self.losses, self.rewards, cycle)


def summarize_steps(steps: list[dict[str, float]], warmup_steps: int, losses: list[float],
                    rewards: list[float], cycle: int = 1) -> dict[str, Any]:
    """Steady-state figures from per-step rows, leaving out the first ``warmup_steps`` steps.

    Steps are grouped in cycles of ``cycle`` optimizer steps (one generation round). The headline
    ``steps_per_s`` uses the median cycle, which is robust to a spike from another process on a shared
    machine; ``steps_per_s_mean`` is the plain steady-state mean. The breakdown is the median cycle's,
    per step, so its phases add up to its ``step_time``.
    """
    steady = steps[warmup_steps:] or steps
    cycles = [steady[i:i + cycle] for i in range(0, len(steady) - cycle + 1, cycle)] or [steady]
    keys = (*PHASES, *DETAIL, "other", "step_time", "completion_tokens", "cpu_time")
    sums = [{k: sum(r.get(k, 0.0) for r in c) / len(c) for k in keys} for c in cycles]
    sums.sort(key=lambda r: r["step_time"])
    breakdown = sums[(len(sums) - 1) // 2]
    cpu_median = statistics.median(r["cpu_time"] for r in sums)
    wall = sum(r["step_time"] for r in steady)
    model_time = sum(breakdown[k] for k in MODEL_PHASES)
    step_time = breakdown["step_time"]
    return {
        "steps": len(steps),
        "steady_steps": len(steady),
        "steps_per_s": 1.0 / step_time,
        "steps_per_s_mean": len(steady) / wall,
        "steps_per_cpu_s": 1.0 / cpu_median if cpu_median > 0 else float("nan"),
        "completion_tokens_per_s": breakdown["completion_tokens"] / step_time,
        "completion_tokens": sum(r["completion_tokens"] for r in steps),
        "total_wall_s": sum(r["step_time"] for r in steps),
        "breakdown_s_per_step": {k: v for k, v in breakdown.items() if k not in ("completion_tokens", "cpu_time")},
        "overhead_frac": (step_time - model_time - breakdown["optimizer"]) / step_time,
        "overhead_incl_optimizer_frac": (step_time - model_time) / step_time,
        "losses": losses,
        "reward_mean": statistics.fmean(rewards) if rewards else float("nan"),
        "rewards_finite": bool(rewards) and all(math.isfinite(x) for x in rewards),
        "losses_finite": bool(losses) and all(math.isfinite(x) for x in losses),
    }


def median_result(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median over repeats of the headline figures; breakdown is the per-phase median."""
    ok = [r for r in runs if r.get("ok")]
    if not ok:
        return {"ok": False, "errors": [r.get("log_tail", "")[-1500:] for r in runs]}
    med = {k: statistics.median(r[k] for r in ok)
           for k in ("steps_per_s", "steps_per_s_mean", "steps_per_cpu_s", "completion_tokens_per_s", "peak_rss_mib",
                     "overhead_frac",
                     "overhead_incl_optimizer_frac")}
    med["breakdown_s_per_step"] = {
        k: statistics.median(r["breakdown_s_per_step"][k] for r in ok) for k in ok[0]["breakdown_s_per_step"]
    }
    med.update(
        ok=len(ok) == len(runs),
        repeats=len(ok),
        steps_per_s_all=[round(r["steps_per_s"], 4) for r in ok],
        peak_rss_mib_all=[round(r["peak_rss_mib"], 1) for r in ok],
        completion_tokens_per_run=[r["completion_tokens"] for r in ok],
        rewards_finite=all(r["rewards_finite"] for r in ok),
        losses_finite=all(r["losses_finite"] for r in ok),
        reward_mean=statistics.fmean(r["reward_mean"] for r in ok),
        loss_last=[r["losses"][-1] if r["losses"] else None for r in ok],
    )
    for key in ("dtypes", "mismatch"):  # what precision ran (dtype_probe); grouprl's mismatch/* metrics
        if any(key in r for r in ok):
            med[f"{key}_all"] = [r.get(key) for r in ok]
    return med


def workload_dict(w: Workload) -> dict[str, Any]:
    return asdict(w)


__all__ = [
    "DETAIL", "GRPO", "GSPO", "MODEL_PHASES", "PHASES", "ROOT", "SIZES", "Size", "StepClock", "Workload",
    "child_env", "dtype_probe", "make_checkpoint", "make_dataset_rows", "make_model", "median_result", "number_reward",
    "run_child", "markdown_scaling", "use_clock", "markdown_vs_trl", "size_workload", "summarize_steps", "workload_dict",
]


def markdown_vs_trl(result: dict[str, Any]) -> str:
    """Short tables of a ``vs_trl.py`` JSON result (headline figures, then the per-step breakdown)."""
    lines = ["| config | library | steps/s (wall) | steps per CPU-s | completion tok/s | peak RSS MiB "
             "| overhead | rewards, losses finite |", "|---|---|---|---|---|---|---|---|"]
    for name, cfg in result["configs"].items():
        for lib in ("grouprl", "trl"):
            r = cfg.get(lib) or {}
            if not r.get("repeats"):
                continue
            lines.append(f"| {name} | {lib} | {r['steps_per_s']:.2f} | {r['steps_per_cpu_s']:.2f} | "
                         f"{r['completion_tokens_per_s']:.0f} | {r['peak_rss_mib']:.0f} | "
                         f"{100 * r['overhead_frac']:.1f}% | {r['rewards_finite'] and r['losses_finite']} |")
        ratio = cfg.get("ratio_grouprl_over_trl")
        if ratio:
            lines.append(f"| {name} | **grouprl / TRL** | **{ratio['steps_per_s']:.2f}x** | "
                         f"**{ratio['steps_per_cpu_s']:.2f}x** | {ratio['completion_tokens_per_s']:.2f}x | "
                         f"{ratio['peak_rss_mib']:.2f}x | | |")
    lines += ["", "| config | library | " + " | ".join(PHASES) + " | other | step (ms) |",
              "|---|---|" + "---|" * (len(PHASES) + 2)]
    for name, cfg in result["configs"].items():
        for lib in ("grouprl", "trl"):
            r = cfg.get(lib) or {}
            if not r.get("repeats"):
                continue
            b = r["breakdown_s_per_step"]
            cells = " | ".join(f"{1000 * b[k]:.1f}" for k in (*PHASES, "other", "step_time"))
            lines.append(f"| {name} | {lib} | {cells} |")
    return "\n".join(lines)


def markdown_scaling(result: dict[str, Any]) -> str:
    """Short table of a ``scaling.py`` JSON result: ms per step (wall / CPU) and peak RSS per point."""
    libs = [k for k in ("grouprl", "trl") if any(k in p for p in result["points"])]
    head = " | ".join(f"{lib} ms/step wall | {lib} ms/step CPU | {lib} RSS MiB" for lib in libs)
    lines = [f"| G | T | {head} |", "|---|---|" + "---|" * (3 * len(libs))]
    for p in result["points"]:
        cells = []
        for lib in libs:
            r = p.get(lib) or {}
            if r.get("repeats"):
                cells += [f"{1000 * r['time_per_step_s']:.0f}", f"{1000 * r['cpu_time_per_step_s']:.0f}",
                          f"{r['peak_rss_mib']:.0f}"]
            else:
                cells += ["failed", "", ""]
        lines.append(f"| {p['num_generations']} | {p['max_new_tokens']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
